//! Part 6: memory after many free-form keys (issue 23 item 11). N standalone runs, each on its
//! own free-form key (a repository URL, so each maps to a hashed Mutex name), are granted and
//! then deleted: every key is used once and ends. The controller's RSS at idle before, once every
//! key is idle again, and once the idle Mutexes are gone, from /proc.
//!
//! `spec.idleDeleteDays` counts whole days (at least 1; 0 keeps the Mutex), so the controller's
//! own idle deletion never happens within the bench. The last step deletes the idle Mutexes
//! from outside instead, as the controller would after that many days, and as GitOps or a
//! person may: the controller then holds no object of these keys.

use super::apiserver::settle;
use super::report::round;
use super::watch::{Kind, Recorder, now};
use super::{Bench, STALL, create_all, delete_all, objects, usage, wait_or_stall};
use anyhow::{Context, Result, bail};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;
use std::time::Duration;
use tekton_mutex::model::mutex::Mutex;

/// Names of the bench's runs (the controller's probe is left out by the prefix).
const PREFIX: &str = "fk-";

fn run_name(i: usize) -> String {
    format!("{PREFIX}{i:06}")
}

/// A free-form key that is no object name: a repository URL per pull request.
fn key(i: usize) -> String {
    format!("https://git.example/org/service.git#pr-{i}")
}

/// The bench's runs seen with `milestone`.
fn seen(rec: &Recorder, milestone: &str) -> usize {
    rec.with(Kind::CustomRun, milestone)
        .into_iter()
        .filter(|(n, _)| n.starts_with(PREFIX))
        .count()
}

/// (Mutexes in the namespace, those idle: no holder, no waiter, no finalizer).
async fn idle_mutexes(api: &Api<Mutex>) -> Result<(usize, usize)> {
    let all = api.list(&ListParams::default()).await?.items;
    let idle = all.iter().filter(|m| {
        let st = m.status.clone().unwrap_or_default();
        let free = st.holders.is_empty() && st.queue.is_empty() && st.reservations.is_empty();
        free && m.metadata.finalizers.as_ref().is_none_or(Vec::is_empty)
    });
    Ok((all.len(), idle.count()))
}

/// Waits until at least `n` Mutexes of the namespace are idle, or none more has gone idle for
/// [`STALL`], polling every few seconds (each poll lists them all); returns how many there are,
/// how many are idle, and whether it stalled.
async fn wait_idle(api: &Api<Mutex>, n: usize) -> Result<(usize, usize, bool)> {
    let (mut last, mut since) = (0, std::time::Instant::now());
    loop {
        let (all, idle) = idle_mutexes(api).await?;
        if idle >= n {
            return Ok((all, idle, false));
        }
        if idle != last {
            (last, since) = (idle, std::time::Instant::now());
        }
        if since.elapsed() >= STALL {
            return Ok((all, idle, true));
        }
        tokio::time::sleep(Duration::from_secs(2)).await; // poll interval of a bounded wait
    }
}

/// Controller RSS (MiB) at each step, and what the steps took.
#[derive(Default)]
struct Figures {
    rss_before: f64,
    rss_idle: f64,
    rss_gone: f64,
    /// `--free-keys-linger-s` later, after one more run.
    rss_later: Option<f64>,
    hwm: f64,
    granted: usize,
    idle: usize,
    mutexes: usize,
    /// No more Mutex went idle for [`STALL`]: the figures are taken while some are in use.
    idle_stalled: bool,
    use_s: f64,
    idle_s: f64,
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    let n = bench.opts.free_keys;
    bench.table.section(&format!(
        "6. Memory after {n} distinct free-form keys whose runs all end (RSS within 10% of before?)"
    ));
    let client = bench.client.clone();
    let ns = super::support::TestNamespace::create("bench-free-keys").await?;
    let controller = bench.controller(&ns).await?;
    let pid = controller.pid();
    let long = Duration::from_secs(3600);
    let mutexes: Api<Mutex> = Api::namespaced(client.clone(), ns.name());
    let runs = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let rec = Recorder::start(&client, ns.name(), &[Kind::CustomRun], false).await?;
    settle(&client, bench.opts.settle, long).await?;
    let mut f = Figures {
        rss_before: usage(pid)?.1,
        ..Figures::default()
    };

    let t0 = now();
    let objs = (0..n)
        .map(|i| objects::standalone_run(&run_name(i), &key(i)))
        .collect();
    create_all(&runs, objs, 32)
        .await
        .context("creating the runs")?;
    let mut stalled = wait_or_stall(|| seen(&rec, "reason:Acquired"), n, long).await;
    f.granted = seen(&rec, "reason:Acquired");
    delete_all(&runs, (0..n).map(run_name).collect(), 64)
        .await
        .context("deleting the runs")?;
    stalled |= wait_or_stall(|| seen(&rec, "deleted"), n, long).await;
    f.use_s = now() - t0;
    let t1 = now();
    // Every Mutex the runs made, plus the probe's.
    (f.mutexes, f.idle, f.idle_stalled) = wait_idle(&mutexes, n + 1)
        .await
        .context("listing the Mutexes")?;
    f.idle_s = now() - t1;
    if f.idle_stalled {
        // Keys still going idle keep writing, and a Mutex still in use cannot be deleted:
        // measure now, and report how many never went idle.
        (f.hwm, f.rss_idle, _) = usage(pid)?;
        f.rss_gone = f64::NAN;
        report(bench, n, &f, stalled);
        return Ok(());
    }
    settle(&client, bench.opts.settle, long)
        .await
        .context("waiting for the API to be quiet")?;
    f.rss_idle = usage(pid)?.1;

    mutexes
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await
        .context("deleting the idle Mutexes")?;
    wait_gone(&mutexes, STALL * 5).await?;
    settle(&client, bench.opts.settle, long)
        .await
        .context("waiting for the API to be quiet")?;
    (f.hwm, f.rss_gone, _) = usage(pid)?;
    if !bench.opts.free_keys_linger.is_zero() {
        f.rss_later = Some(linger(bench, &ns, pid).await?);
    }
    drop(controller);
    report(bench, n, &f, stalled);
    Ok(())
}

/// The RSS once the controller's time-bound caches have had their time: kube's Event recorder
/// keeps each Event it published for 6 minutes (pruned at its next publish) and every lock
/// stays queued for its 5-minute resync. After `--free-keys-linger-s`, one more run on a
/// new key passes through (an Event is published), and the RSS is read once the API is quiet.
async fn linger(bench: &Bench, ns: &super::support::TestNamespace, pid: u32) -> Result<f64> {
    // A wait for time-based expiry in the controller, not a synchronization.
    tokio::time::sleep(bench.opts.free_keys_linger).await;
    let runs = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let name = format!("{PREFIX}after");
    create_all(
        &runs,
        vec![objects::standalone_run(&name, "after-the-linger")],
        1,
    )
    .await?;
    super::support::pipelines::wait_reason(ns, &name, "Acquired", super::support::secs(120))
        .await?;
    delete_all(&runs, vec![name], 1).await?;
    settle(&bench.client, bench.opts.settle, Duration::from_secs(3600)).await?;
    Ok(usage(pid)?.1)
}

/// Waits until the namespace has no Mutex left (none has a finalizer once idle).
async fn wait_gone(api: &Api<Mutex>, timeout: Duration) -> Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = api.list(&ListParams::default().limit(1)).await?.items.len();
        if left == 0 {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            bail!("Mutexes are still there {timeout:?} after they were deleted");
        }
        tokio::time::sleep(Duration::from_secs(1)).await; // poll interval of a bounded wait
    }
}

fn report(bench: &mut Bench, n: usize, f: &Figures, stalled: bool) {
    let ratio = |rss: f64| rss / f.rss_before.max(1e-3);
    let t = &mut bench.table;
    t.row(
        format!("create {n} runs on {n} keys, grant and delete them all"),
        format!("{:.1} s ({} granted)", f.use_s, f.granted),
    );
    t.row(
        "last delete -> every Mutex idle (no holder, no finalizer)",
        format!(
            "{:.1} s ({} of {} Mutexes idle)",
            f.idle_s, f.idle, f.mutexes
        ),
    );
    t.row(
        "controller RSS at idle, before",
        format!("{:.1} MiB", f.rss_before),
    );
    t.row(
        format!(
            "RSS once every key is idle ({} idle Mutexes kept)",
            f.mutexes
        ),
        format!("{:.1} MiB = {:.2} x before", f.rss_idle, ratio(f.rss_idle)),
    );
    t.row(
        "RSS once the idle Mutexes are deleted (as idleDeleteDays would)",
        format!("{:.1} MiB = {:.2} x before", f.rss_gone, ratio(f.rss_gone)),
    );
    if let Some(later) = f.rss_later {
        t.row(
            format!(
                "RSS {:.0} s later, after one more run (Event cache and resync expired)",
                bench.opts.free_keys_linger.as_secs_f64()
            ),
            format!("{later:.1} MiB = {:.2} x before", ratio(later)),
        );
    }
    t.row("peak RSS (VmHWM)", format!("{:.1} MiB", f.hwm));
    if f.idle_stalled {
        t.row(
            format!(
                "  Mutexes NOT idle ({:.0} s without one more), measured then",
                STALL.as_secs_f64()
            ),
            format!("{} of {}", f.mutexes - f.idle.min(f.mutexes), f.mutexes),
        );
    }
    if stalled {
        let missing = n - f.granted.min(n);
        t.row(
            format!(
                "  runs NOT granted ({:.0} s without a new grant)",
                STALL.as_secs_f64()
            ),
            format!("{missing} of {n}"),
        );
    }
    bench.json.insert(
        "free_keys".into(),
        json!({
            "keys": n, "granted": f.granted, "stalled": stalled,
            "use_s": round(f.use_s), "idle_s": round(f.idle_s),
            "mutexes_left": f.mutexes, "mutexes_idle": f.idle, "idle_stalled": f.idle_stalled,
            "rss_before_mib": round(f.rss_before), "rss_idle_mib": round(f.rss_idle),
            "rss_after_mutexes_deleted_mib": round(f.rss_gone), "vmhwm_mib": round(f.hwm),
            "rss_after_linger_mib": f.rss_later.map(round), "linger_s": bench.opts.free_keys_linger.as_secs(),
            "ratio_idle": round(ratio(f.rss_idle)), "ratio_after_mutexes_deleted": round(ratio(f.rss_gone)),
            "idle_within_10_percent": ratio(f.rss_idle) <= 1.1,
            "deleted_within_10_percent": ratio(f.rss_gone) <= 1.1,
        }),
    );
}
