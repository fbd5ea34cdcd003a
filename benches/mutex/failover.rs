//! Part 7: failover. Two replicas campaign for the Lease as the release runs them (its Lease
//! duration and renew margin); a key is held and waited for; the leader is SIGKILLed and the
//! holder deleted at the same moment: the time from the kill until the waiter is seen Acquired,
//! which only the standby can grant once the Lease has expired. Repeated `--kills` times (a new
//! standby started after each), each kill at another point of the renewal period.

use super::report::{Summary, round};
use super::support::controller::ControllerProcess;
use super::support::ops::{http_addr, http_get};
use super::support::{TestNamespace, secs, wait_until};
use super::watch::{Kind, Recorder, now};
use super::{Bench, create_all, objects};
use anyhow::{Context, Result};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

/// The release's Lease settings (`tekton-mutex run`'s defaults; config/500-controller.yaml
/// leaves them as they are).
const LEASE_DURATION_S: f64 = 15.0;
const KEY: &str = "failover";
/// How often the waits look at our own watch's record (times come from the watch itself).
const POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// A replica campaigning for the Lease, named as a pod would be, and ready (its watches synced).
async fn replica(ns: &TestNamespace, n: usize) -> Result<(String, ControllerProcess)> {
    let name = format!("bench-replica-{n}");
    let c = ControllerProcess::start_with(
        ns.name(),
        &["--http-addr", "127.0.0.1:0", "--leader-elect"],
        &[("RUST_LOG", "info,kube=warn"), ("POD_NAME", name.as_str())],
    )
    .await?;
    let addr = http_addr(&c).await?;
    wait_until(&format!("{name} to be ready"), secs(60), || async {
        Ok((http_get(&addr, "/readyz").is_ok_and(|r| r.status == 200)).then_some(()))
    })
    .await?;
    Ok((name, c))
}

/// Which of the replicas holds the Lease now.
async fn leader(ns: &TestNamespace, replicas: &[(String, ControllerProcess)]) -> Result<usize> {
    let leases: Api<Lease> = Api::namespaced(super::support::client().await?, ns.name());
    wait_until("a replica to hold the Lease", secs(60), || async {
        let holder = leases
            .get_opt("tekton-mutex")
            .await?
            .and_then(|l| l.spec?.holder_identity);
        Ok(holder.and_then(|h| replicas.iter().position(|(n, _)| *n == h)))
    })
    .await
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    let kills = bench.opts.kills;
    bench.table.section(&format!(
        "7. Failover: the leader SIGKILLed {kills} times, {LEASE_DURATION_S:.0} s Lease"
    ));
    let ns = TestNamespace::create("bench-failover").await?;
    let rec = Recorder::start(&bench.client, ns.name(), &[Kind::CustomRun], false).await?;
    let api = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let mut replicas = vec![replica(&ns, 0).await?, replica(&ns, 1).await?];
    let mut samples = Vec::new();
    for i in 0..kills {
        let (holder, waiter) = (format!("h{i:03}"), format!("w{i:03}"));
        create_all(&api, vec![objects::standalone_run(&holder, KEY)], 1).await?;
        rec.wait(&format!("{holder} granted"), secs(120), POLL, |r| {
            r.first(Kind::CustomRun, &holder, "reason:Acquired")
                .is_some()
        })
        .await?;
        create_all(&api, vec![objects::standalone_run(&waiter, KEY)], 1).await?;
        rec.wait(&format!("{waiter} queued"), secs(120), POLL, |r| {
            r.first(Kind::CustomRun, &waiter, "reason:Waiting")
                .is_some()
        })
        .await?;
        // The kill falls at a spread of points of the renewal period (a renewal every
        // Lease duration - margin = 10 s), not always just after the takeover that began it.
        tokio::time::sleep(kill_phase(i)).await;
        let lead = leader(&ns, &replicas).await?;
        let t0 = now();
        replicas[lead].1.kill();
        api.delete(&holder, &Default::default()).await?;
        rec.wait(
            &format!("{waiter} granted after the kill"),
            secs(120),
            POLL,
            |r| {
                r.first(Kind::CustomRun, &waiter, "reason:Acquired")
                    .is_some()
            },
        )
        .await
        .with_context(|| format!("no takeover after kill {i}"))?;
        let granted = rec.first(Kind::CustomRun, &waiter, "reason:Acquired");
        samples.push(granted.unwrap_or(t0) - t0);
        api.delete(&waiter, &Default::default()).await?;
        replicas.remove(lead);
        replicas.push(replica(&ns, i + 2).await?);
    }
    report(bench, &samples);
    Ok(())
}

/// How long after the waiter queues the `i`th kill comes: 0 to 9.5 s in steps of 0.5 s, spread
/// over the kills (7 and 20 share no factor, so 20 kills take each step once).
fn kill_phase(i: usize) -> std::time::Duration {
    std::time::Duration::from_millis((i * 7 % 20) as u64 * 500)
}

fn report(bench: &mut Bench, samples: &[f64]) {
    let spread = Summary::of_seconds(samples);
    let target_ms = (LEASE_DURATION_S + 2.0) * 1000.0;
    bench.table.row(
        "leader killed -> the waiter granted by the standby",
        spread.line(),
    );
    bench.table.row(
        "target: p99 <= the Lease duration + 2 s",
        format!(
            "{:.1} s: {}",
            target_ms / 1000.0,
            if spread.p99 <= target_ms {
                "met"
            } else {
                "MISSED"
            }
        ),
    );
    bench.json.insert(
        "failover".into(),
        json!({
            "kills": samples.len(), "lease_duration_s": LEASE_DURATION_S,
            "kill_to_grant": spread.to_json(), "target_ms": round(target_ms),
            "samples_s": samples.iter().map(|s| round(*s)).collect::<Vec<_>>(),
        }),
    );
}
