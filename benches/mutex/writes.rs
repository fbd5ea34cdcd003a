//! Part 3: API writes per grant against queue length, and per arrival. For each queue length n,
//! a holder and n waiters on one key (standalone runs, `supersede: none`); then arrivals one at
//! a time, and grants one at a time (delete the holder), each followed by a quiet period. Writes
//! are the API server's `apiserver_request_total` deltas.

use super::apiserver::{Counters, settle};
use super::report::Summary;
use super::watch::{Kind, Recorder, now};
use super::{Bench, create_all, objects};
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::time::Duration;

const KEY: &str = "queue";

fn run_name(i: usize) -> String {
    format!("w-{i:05}")
}

/// The current holder: a run seen Acquired and not seen deleted.
fn holder(rec: &Recorder) -> Option<String> {
    rec.with(Kind::CustomRun, "reason:Acquired")
        .into_iter()
        .filter(|(n, _)| n != "bench-probe" && rec.first(Kind::CustomRun, n, "deleted").is_none())
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(n, _)| n)
}

async fn one_queue(bench: &Bench, n: usize) -> Result<Value> {
    let (client, settle_for) = (&bench.client, bench.opts.settle);
    let ns = super::support::TestNamespace::create(&format!("bench-writes-{n}")).await?;
    let _controller = bench.controller(&ns).await?;
    let rec = Recorder::start(client, ns.name(), &[Kind::CustomRun], false).await?;
    let api = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let long = Duration::from_secs(120 + n as u64);
    let poll = Duration::from_millis(5);

    // Room for every waiter and arrival: the default spec.maxQueue (1,000) would refuse some.
    let room = n + bench.opts.arrivals + 10;
    ns.apply(&format!(
        "apiVersion: tekton-mutex.dev/v1alpha1\nkind: Mutex\nmetadata: {{name: {KEY}}}\nspec: {{maxQueue: {room}}}\n"
    ))
    .await?;
    create_all(&api, vec![objects::standalone_run(&run_name(0), KEY)], 1).await?;
    rec.wait("the first holder", long, poll, |r| {
        r.first(Kind::CustomRun, &run_name(0), "reason:Acquired")
            .is_some()
    })
    .await?;
    let waiters = (1..=n)
        .map(|i| objects::standalone_run(&run_name(i), KEY))
        .collect();
    create_all(&api, waiters, 16).await?;
    rec.wait(
        &format!("{n} waiters"),
        long,
        Duration::from_millis(50),
        |r| r.count(Kind::CustomRun, "reason:Waiting") >= n,
    )
    .await?;

    // Arrivals, one at a time, each awaited until seen Waiting.
    let arrivals = bench.opts.arrivals;
    let before = settle(client, settle_for, long).await?;
    for a in 0..arrivals {
        let name = run_name(n + 1 + a);
        create_all(&api, vec![objects::standalone_run(&name, KEY)], 1).await?;
        rec.wait(&format!("arrival {name} to wait"), long, poll, |r| {
            r.first(Kind::CustomRun, &name, "reason:Waiting").is_some()
        })
        .await?;
    }
    let after = settle(client, settle_for, long).await?;
    let per_arrival = after
        .since(&before)
        .controller_writes()
        .per(arrivals as f64);

    // Grants, one at a time: delete the holder, wait for the next grant, let it settle.
    let mut total = Counters::default();
    let mut latencies = Vec::new();
    let mut before = after;
    for g in 0..bench.opts.grants {
        let h = holder(&rec).context("no holder seen")?;
        let granted = rec.count(Kind::CustomRun, "reason:Acquired");
        let t0 = now();
        api.delete(&h, &Default::default()).await?;
        rec.wait(&format!("grant {g} after deleting {h}"), long, poll, |r| {
            r.count(Kind::CustomRun, "reason:Acquired") > granted
        })
        .await?;
        let next = holder(&rec).context("no new holder seen")?;
        latencies.push(
            rec.first(Kind::CustomRun, &next, "reason:Acquired")
                .unwrap_or(t0)
                - t0,
        );
        let after = settle(client, settle_for, long).await?;
        let d = after.since(&before);
        total = total.plus(&d);
        before = after;
    }
    let per_grant = total.controller_writes().per(bench.opts.grants as f64);
    Ok(json!({
        "waiters": n,
        "per_grant": per_grant.to_json(),
        "per_arrival": per_arrival.to_json(),
        "delete_to_next_acquired": Summary::of_seconds(&latencies).to_json(),
        "grant_deltas": total.to_json(),
        "fmt_grant": per_grant.line(),
        "fmt_arrival": per_arrival.line(),
    }))
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    bench.table.section(&format!(
        "3. API writes per grant and per arrival, one key, supersede: none ({} grants, {} arrivals each)",
        bench.opts.grants, bench.opts.arrivals
    ));
    let mut results = Vec::new();
    for n in bench.opts.waiters.clone() {
        let r = one_queue(bench, n).await?;
        bench.table.row(
            format!("{n} waiters: writes per grant"),
            r["fmt_grant"].as_str().unwrap_or(""),
        );
        bench.table.row(
            format!("{n} waiters: writes per arrival"),
            r["fmt_arrival"].as_str().unwrap_or(""),
        );
        results.push(r);
    }
    bench.json.insert("writes".into(), Value::Array(results));
    Ok(())
}
