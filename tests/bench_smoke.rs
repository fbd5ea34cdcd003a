//! Smoke test of the benchmark harness (`hack/bench.sh`, benches/mutex): every part runs end to
//! end at a tiny size against the local control plane and writes its figures. It checks that the
//! figures are there, never what they are: speed targets live in the benchmark, not in tests.

#[path = "../benches/mutex/main.rs"]
#[allow(dead_code)]
mod bench;

use anyhow::{Context, Result};
use serde_json::Value;

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs hack/cluster.sh up"]
async fn every_part_of_the_benchmark_runs_and_reports() -> Result<()> {
    let out = bench::support::repo_root().join("target/bench-smoke");
    let _ = std::fs::remove_dir_all(&out);
    let args: Vec<String> = [
        "--quick",
        "--handovers",
        "2",
        "--queue",
        "2",
        "--waiters",
        "5",
        "--grants",
        "1",
        "--arrivals",
        "1",
        "--keys",
        "5",
        "--runs-per-key",
        "2",
        "--history",
        "150",
        "--kills",
        "1",
        "--settle-ms",
        "500",
        // free-keys is measured by hand (hack/bench.sh --only free-keys): even small, it waits
        // until every Mutex is idle, minutes on this machine.
        "--only",
        "handover,lease,writes,throughput,memory,failover",
        "--out",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.to_string_lossy().into_owned()])
    .collect();
    bench::run(&args).await?;

    let text = std::fs::read_to_string(out.join("latest.json")).context("latest.json")?;
    let json: Value = serde_json::from_str(&text)?;
    let number = |ptr: &str| {
        json.pointer(ptr)
            .and_then(Value::as_f64)
            .with_context(|| format!("{ptr} is missing from the benchmark's JSON:\n{text}"))
    };
    assert_eq!(json["failed_parts"], serde_json::json!([]));
    // Two handovers on one key, each measured at the controller and across the whole chain.
    assert_eq!(number("/handover/controller_handover/n")?, 2.0);
    assert_eq!(number("/handover/idle_gap/n")?, 2.0);
    // The Mutex keeps no pod for a waiter; the Lease pattern's waiters each hold one.
    assert_eq!(number("/side_by_side/mutex/max_waiter_pods")?, 0.0);
    number("/side_by_side/lease/max_waiter_pods")?;
    number("/writes/0/per_grant/status_writes")?;
    number("/writes/0/per_arrival/status_writes")?;
    number("/throughput/grants_per_s")?;
    assert!(number("/throughput/plain_client_status_writes_per_s")? > 0.0);
    number("/throughput/grants_to_plain_writes")?;
    // One leader killed: the standby granted the waiter.
    assert_eq!(number("/failover/kill_to_grant/n")?, 1.0);
    assert!(
        number("/memory/vmhwm_mib")? > 0.0,
        "peak RSS read from /proc"
    );
    Ok(())
}
