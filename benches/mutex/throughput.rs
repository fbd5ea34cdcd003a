//! Part 4: throughput. K keys x R standalone runs (supersede: none), created at once: the time
//! until every key's first holder is granted; then every holder is deleted at once: the time
//! until every key is handed over (grants/s), and the writes that took; then the most status
//! writes per second a plain client gets from the same API server, beside it (the ratio).

use super::apiserver::settle;
use super::report::{Summary, round};
use super::watch::{Kind, Recorder, now};
use super::{Bench, STALL, create_all, delete_all, objects, plain_client, usage, wait_or_stall};
use anyhow::Result;
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

/// Runs seen Acquired (the controller's probe left out), with the time first seen.
fn acquired(rec: &Recorder) -> Vec<(String, f64)> {
    rec.with(Kind::CustomRun, "reason:Acquired")
        .into_iter()
        .filter(|(n, _)| n.starts_with('k'))
        .collect()
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    let (keys, per_key) = (bench.opts.keys, bench.opts.runs_per_key);
    bench.table.section(&format!(
        "4. Throughput: {keys} keys x {per_key} standalone runs"
    ));
    let client = bench.client.clone();
    let ns = super::support::TestNamespace::create("bench-throughput").await?;
    let controller = bench.controller(&ns).await?;
    let rec = Recorder::start(&client, ns.name(), &[Kind::CustomRun], false).await?;
    let api = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let long = Duration::from_secs(900);
    let poll = Duration::from_millis(100);

    // Round-robin: every key's first run, then every key's second run, and so on.
    let runs = (0..per_key)
        .flat_map(|j| (0..keys).map(move |i| (i, j)))
        .map(|(i, j)| objects::standalone_run(&format!("k{i:04}-r{j:02}"), &format!("k{i:04}")))
        .collect();
    let t0 = now();
    create_all(&api, runs, 32).await?;
    let created = now() - t0;
    rec.wait(&format!("{keys} first holders"), long, poll, |r| {
        acquired(r).len() >= keys
    })
    .await?;
    let first = acquired(&rec);
    let all_first = first.iter().map(|(_, t)| *t).fold(t0, f64::max) - t0;
    let waiting = keys * (per_key - 1);
    rec.wait(&format!("{waiting} waiters"), long, poll, |r| {
        r.count(Kind::CustomRun, "reason:Waiting") >= waiting
    })
    .await?;
    let before = settle(&client, bench.opts.settle, long).await?;

    let (_, _, cpu_before) = usage(controller.pid())?;
    let holders: HashSet<String> = first.into_iter().map(|(n, _)| n).collect();
    let t1 = now();
    delete_all(&api, holders.iter().cloned().collect(), 64).await?;
    let deleted = now() - t1;
    let stalled = wait_or_stall(|| acquired(&rec).len(), 2 * keys, long).await;
    // Per key: from the first delete to the key's next holder seen Acquired.
    let by_key: Vec<f64> = acquired(&rec)
        .into_iter()
        .filter(|(n, _)| !holders.contains(n))
        .map(|(_, t)| t - t1)
        .collect();
    let handed_over = by_key.iter().copied().fold(0.0, f64::max);
    let missing = keys.saturating_sub(by_key.len());
    let grants_per_s = by_key.len() as f64 / handed_over.max(1e-3);
    let spread = Summary::of_seconds(&by_key);
    let after = settle(&client, bench.opts.settle, long).await?;
    let writes = after.since(&before).controller_writes().per(keys as f64);
    let (hwm, _, cpu_after) = usage(controller.pid())?;
    let cpu = cpu_after - cpu_before;
    drop(controller);
    let plain = plain_client::status_writes_per_s(keys).await?;
    let ratio = grants_per_s / plain.max(1e-3);

    let t = &mut bench.table;
    t.row(
        format!("create {} runs (32 at a time)", keys * per_key),
        format!("{created:.1} s"),
    );
    t.row(
        "every key's first holder granted (from the first create)",
        format!("{all_first:.1} s"),
    );
    t.row(
        format!("delete {keys} holders at once (64 at a time)"),
        format!("{deleted:.1} s"),
    );
    t.row(
        format!(
            "{} of {keys} keys handed over (from the first delete)",
            by_key.len()
        ),
        format!("{handed_over:.1} s = {grants_per_s:.1} grants/s"),
    );
    t.row(
        "  each key: first delete -> its next holder Acquired",
        spread.line(),
    );
    if missing > 0 {
        t.row(
            format!(
                "  keys NOT handed over ({:.0} s without a new grant)",
                STALL.as_secs_f64()
            ),
            format!("{missing} of {keys}"),
        );
    }
    t.row("status writes per handover at this scale", writes.line());
    t.row(
        format!("a plain client's status writes to {keys} Mutexes (32 in flight)"),
        format!("{plain:.1} writes/s"),
    );
    t.row(
        "grants/s to a plain client's writes/s (aim: >= 1/3, 3 writes a grant)",
        format!("{ratio:.2}"),
    );
    t.row(
        "controller CPU seconds during the handovers / peak RSS",
        format!("{cpu:.2} s / {hwm:.1} MiB"),
    );
    bench.json.insert(
        "throughput".into(),
        json!({
            "keys": keys, "runs_per_key": per_key,
            "create_s": round(created), "all_first_granted_s": round(all_first),
            "delete_holders_s": round(deleted), "all_handed_over_s": round(handed_over),
            "grants_per_s": round(grants_per_s),
            "plain_client_status_writes_per_s": round(plain),
            "grants_to_plain_writes": (ratio * 1000.0).round() / 1000.0,
            "handover_by_key": spread.to_json(),
            "keys_not_handed_over": missing, "stalled": stalled,
            "writes_per_handover": writes.to_json(),
            "controller_cpu_handover_s": round(cpu), "controller_vmhwm_mib": round(hwm),
        }),
    );
    Ok(())
}
