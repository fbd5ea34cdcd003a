//! Part 5: memory and CPU. H finished PipelineRuns and H finished lock CustomRuns (history, as a
//! cluster that keeps it), plus live standalone runs on a few keys, all in the watched scope
//! before the controller starts. Then: start, grant the live runs, hand each key over once.
//! Peak RSS (VmHWM) and CPU seconds from /proc.

use super::apiserver::settle;
use super::report::round;
use super::usage;
use super::watch::{Kind, Recorder, now};
use super::{Bench, STALL, create_all, delete_all, objects, patch_status_all, wait_or_stall};
use anyhow::Result;
use serde_json::json;
use std::time::Duration;

const LIVE_KEYS: usize = 10;
const LIVE_PER_KEY: usize = 10;
const HISTORY_KEYS: usize = 100;

/// Creates the finished history: PipelineRuns (Pending, so Tekton leaves them alone, then given a
/// final status) and their lock CustomRuns (given a final status).
async fn create_history(ns: &super::support::TestNamespace, prs: usize, crs: usize) -> Result<()> {
    let pr_api = ns.dynamic("tekton.dev/v1", "PipelineRun").await?;
    let cr_api = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let name = |i: usize| format!("h-{i:05}");
    let key = |i: usize| format!("svc-{}", i % HISTORY_KEYS);
    create_all(
        &pr_api,
        (0..prs)
            .map(|i| objects::history_pipeline_run(&name(i), &key(i), i))
            .collect(),
        32,
    )
    .await?;
    patch_status_all(
        &pr_api,
        (0..prs)
            .map(|i| (name(i), objects::history_pipeline_run_status(&name(i))))
            .collect(),
        32,
    )
    .await?;
    create_all(
        &cr_api,
        (0..crs)
            .map(|i| objects::history_custom_run(&name(i), &key(i), i))
            .collect(),
        32,
    )
    .await?;
    patch_status_all(
        &cr_api,
        (0..crs)
            .map(|i| {
                (
                    format!("{}-lock", name(i)),
                    objects::history_custom_run_status(&key(i), i / HISTORY_KEYS + 1),
                )
            })
            .collect(),
        32,
    )
    .await
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    let history = bench.opts.history;
    let live = LIVE_KEYS * LIVE_PER_KEY;
    let finished_crs = history.saturating_sub(live);
    bench.table.section(&format!(
        "5. Memory and CPU: {history} PipelineRuns (all finished), {history} CustomRuns ({finished_crs} finished, {live} live on {LIVE_KEYS} keys)"
    ));
    let client = bench.client.clone();
    let ns = super::support::TestNamespace::create("bench-memory").await?;
    let long = Duration::from_secs(900);
    let t = now();
    create_history(&ns, history, finished_crs).await?;
    let setup = now() - t;
    let cr_api = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let live_name = |i: usize, j: usize| format!("live-k{i}-r{j}");
    let runs = (0..LIVE_PER_KEY)
        .flat_map(|j| (0..LIVE_KEYS).map(move |i| (i, j)))
        .map(|(i, j)| objects::standalone_run(&live_name(i, j), &format!("live-k{i}")))
        .collect();
    create_all(&cr_api, runs, 16).await?;
    let rec = Recorder::start(&client, ns.name(), &[Kind::CustomRun], false).await?;
    settle(&client, bench.opts.settle, long).await?;

    let t_start = now();
    let controller = bench.controller(&ns).await?;
    let pid = controller.pid();
    let poll = Duration::from_millis(100);
    let live_acquired = |r: &Recorder| {
        r.with(Kind::CustomRun, "reason:Acquired")
            .into_iter()
            .filter(|(n, _)| n.starts_with("live-"))
            .count()
    };
    rec.wait("the live runs to be granted or queued", long, poll, |r| {
        live_acquired(r) >= LIVE_KEYS
            && r.count(Kind::CustomRun, "reason:Waiting") >= live - LIVE_KEYS
    })
    .await?;
    let ready = now() - t_start;
    let (hwm_start, _, cpu_start) = usage(pid)?;

    let holders = (0..LIVE_KEYS).map(|i| live_name(i, 0)).collect();
    delete_all(&cr_api, holders, 16).await?;
    let stalled = wait_or_stall(|| live_acquired(&rec), 2 * LIVE_KEYS, long).await;
    let not_handed_over = 2 * LIVE_KEYS - live_acquired(&rec).min(2 * LIVE_KEYS);
    settle(&client, bench.opts.settle, long).await?;
    let (hwm, rss, cpu) = usage(pid)?;
    drop(controller);

    let t = &mut bench.table;
    t.row(
        "setup: create the history with status",
        format!("{setup:.1} s"),
    );
    t.row(
        "controller start -> every live run granted or queued",
        format!("{ready:.1} s"),
    );
    t.row(
        "peak RSS (VmHWM) after start-up / after handovers",
        format!("{hwm_start:.1} MiB / {hwm:.1} MiB (RSS now {rss:.1} MiB)"),
    );
    t.row(
        "CPU seconds: start-up / total",
        format!("{cpu_start:.2} s / {cpu:.2} s"),
    );
    if stalled {
        t.row(
            format!(
                "  keys NOT handed over ({:.0} s without a new grant)",
                STALL.as_secs_f64()
            ),
            format!("{not_handed_over} of {LIVE_KEYS}"),
        );
    }
    bench.json.insert(
        "memory".into(),
        json!({
            "pipelineruns": history, "customruns": history, "finished_customruns": finished_crs, "live_customruns": live,
            "setup_s": round(setup), "startup_ready_s": round(ready),
            "vmhwm_after_startup_mib": round(hwm_start), "vmhwm_mib": round(hwm), "vmrss_mib": round(rss),
            "cpu_startup_s": round(cpu_start), "cpu_total_s": round(cpu),
            "keys_not_handed_over": not_handed_over,
        }),
    );
    Ok(())
}
