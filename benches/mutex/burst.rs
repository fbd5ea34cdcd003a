//! Part "burst": K keys x R standalone runs created at once, as a busy cluster sends them: how
//! long until every arrival is told (Acquired or Waiting), each from its own create, with the
//! controller's CPU seconds and peak RSS over the burst. Then the same for M runs of two keys
//! each queued behind held keys (multi-key waiters), which the deadlock check looks at.

use super::report::{Summary, round};
use super::watch::{Kind, Recorder, now};
use super::{Bench, objects, usage};
use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;

/// A run of several keys (`keys: a,b`), standalone, no supersede.
fn multi_key_run(name: &str, keys: &[String]) -> Value {
    let mut run = objects::standalone_run(name, "");
    run["spec"]["params"] = json!([
        {"name": "keys", "value": keys.join(",")},
        {"name": "supersede", "value": "none"},
    ]);
    run
}

/// Creates `objs`, 32 at a time; the time each create returned, by name.
async fn create_timed(api: &Api<DynamicObject>, objs: Vec<Value>) -> Result<HashMap<String, f64>> {
    let created: Vec<(String, f64)> = futures::stream::iter(objs)
        .map(|o| async move {
            let obj: DynamicObject = serde_json::from_value(o)?;
            let name = obj.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating {name}"))?;
            anyhow::Ok((name, now()))
        })
        .buffer_unordered(32)
        .try_collect()
        .await?;
    Ok(created.into_iter().collect())
}

/// Each created run's time from its create to its first Acquired or Waiting; None for a run
/// never told.
fn told_after(rec: &Recorder, created: &HashMap<String, f64>) -> Vec<Option<f64>> {
    let mut first: HashMap<String, f64> = HashMap::new();
    for reason in ["reason:Acquired", "reason:Waiting"] {
        for (n, t) in rec.with(Kind::CustomRun, reason) {
            let e = first.entry(n).or_insert(t);
            *e = e.min(t);
        }
    }
    created
        .iter()
        .map(|(n, c)| first.get(n).map(|t| (t - c).max(0.0)))
        .collect()
}

/// What one wave of arrivals cost: every arrival told, how long after its create, and the
/// controller's CPU seconds over the wave.
struct Wave {
    told: Vec<f64>,
    untold: usize,
    all_told_s: f64,
    cpu_s: f64,
}

async fn wave(
    bench: &Bench,
    rec: &Recorder,
    api: &Api<DynamicObject>,
    pid: u32,
    runs: Vec<Value>,
) -> Result<Wave> {
    let (_, _, cpu0) = usage(pid)?;
    let t0 = now();
    let created = create_timed(api, runs).await?;
    let n = created.len();
    let long = Duration::from_secs(if bench.opts.quick { 120 } else { 900 });
    let waited = rec
        .wait(
            &format!("{n} arrivals told"),
            long,
            Duration::from_millis(100),
            |r| told_after(r, &created).iter().all(Option::is_some),
        )
        .await;
    let (_, _, cpu1) = usage(pid)?;
    let told: Vec<f64> = told_after(rec, &created).into_iter().flatten().collect();
    if let Err(e) = waited {
        eprintln!("bench: burst: {e:#}");
    }
    Ok(Wave {
        untold: n - told.len(),
        all_told_s: now() - t0,
        cpu_s: cpu1 - cpu0,
        told,
    })
}

fn rows(bench: &mut Bench, what: &str, w: &Wave) -> Value {
    let spread = Summary::of_seconds(&w.told);
    let t = &mut bench.table;
    t.row(
        format!("{what}: every arrival told (from the first create)"),
        format!("{:.1} s", w.all_told_s),
    );
    t.row(
        "  each arrival: its create -> Acquired or Waiting",
        spread.line(),
    );
    if w.untold > 0 {
        t.row("  arrivals NEVER told", format!("{}", w.untold));
    }
    t.row(
        "  controller CPU seconds over the wave",
        format!("{:.2} s", w.cpu_s),
    );
    json!({
        "all_told_s": round(w.all_told_s), "told_after_create": spread.to_json(),
        "untold": w.untold, "controller_cpu_s": round(w.cpu_s),
    })
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    let (keys, per_key) = (bench.opts.keys, bench.opts.runs_per_key);
    let multi = bench.opts.multi_key_waiters;
    bench.table.section(&format!(
        "Burst: {} standalone runs on {keys} keys at once, then {multi} multi-key waiters",
        keys * per_key
    ));
    let ns = super::support::TestNamespace::create("bench-burst").await?;
    let controller = bench.controller(&ns).await?;
    let rec = Recorder::start(&bench.client, ns.name(), &[Kind::CustomRun], false).await?;
    let api = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let key = |i: usize| format!("k{:04}", i % keys);

    let runs = (0..per_key)
        .flat_map(|j| (0..keys).map(move |i| (i, j)))
        .map(|(i, j)| objects::standalone_run(&format!("b{i:04}-r{j:02}"), &key(i)))
        .collect();
    let single = wave(bench, &rec, &api, controller.pid(), runs).await?;
    let (hwm, _, _) = usage(controller.pid())?;
    // Every key is held now: runs of two neighbouring keys each wait behind both holders.
    let runs = (0..multi)
        .map(|i| multi_key_run(&format!("m{i:05}"), &[key(i), key(i + 1)]))
        .collect();
    let multi_wave = wave(bench, &rec, &api, controller.pid(), runs).await?;
    let (hwm_after, _, _) = usage(controller.pid())?;
    drop(controller);

    let single_json = rows(
        bench,
        &format!("{} single-key runs", keys * per_key),
        &single,
    );
    let multi_json = rows(
        bench,
        &format!("{multi} runs of two keys, behind held keys"),
        &multi_wave,
    );
    bench.table.row(
        "controller peak RSS (VmHWM): after the single-key burst / after both",
        format!("{hwm:.1} MiB / {hwm_after:.1} MiB"),
    );
    bench.json.insert(
        "burst".into(),
        json!({
            "keys": keys, "runs_per_key": per_key, "multi_key_waiters": multi,
            "single_key": single_json, "multi_key": multi_json,
            "controller_vmhwm_mib": round(hwm), "controller_vmhwm_after_multi_mib": round(hwm_after),
        }),
    );
    Ok(())
}
