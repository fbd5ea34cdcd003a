//! Part 1: handover latency. N PipelineRuns queue on one key; each deploy step only records its
//! start and end. From our watches and the step's own marks, for each handover: the controller's
//! part (holder's PipelineRun seen done -> next lock run seen Acquired) and the whole chain
//! (deploy step end -> next deploy step start), hop by hop.

use super::report::Summary;
use super::watch::{Kind, Obs, Recorder, now};
use super::{Bench, create_all, objects};
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A chain of named hops, each a list of samples in seconds.
pub struct Hops {
    pub names: Vec<&'static str>,
    pub samples: Vec<Vec<f64>>,
}

impl Hops {
    pub fn new(names: &[&'static str]) -> Self {
        Hops {
            names: names.to_vec(),
            samples: vec![Vec::new(); names.len()],
        }
    }

    /// Adds one handover: the times of the chain's points (one more than hops); a hop whose
    /// ends were not both seen is left out.
    pub fn add(&mut self, points: &[Option<f64>]) {
        for (i, w) in points.windows(2).enumerate() {
            if let (Some(a), Some(b)) = (w[0], w[1]) {
                self.samples[i].push(b - a);
            }
        }
    }

    pub fn to_json(&self) -> Value {
        Value::Array(
            self.names
                .iter()
                .zip(&self.samples)
                .map(|(n, s)| json!({"hop": n, "latency": Summary::of_seconds(s).to_json()}))
                .collect(),
        )
    }

    pub fn rows(&self, bench: &mut Bench, prefix: &str) {
        for (n, s) in self.names.iter().zip(&self.samples) {
            bench
                .table
                .row(format!("{prefix}{n}"), Summary::of_seconds(s).line());
        }
    }
}

/// PipelineRun -> (deploy step start, deploy step end), in epoch seconds.
pub type Marks = HashMap<String, (Option<f64>, Option<f64>)>;

/// The start and end marks each deploy step wrote.
pub fn read_marks(path: &Path) -> Result<Marks> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading the deploy steps' marks {} (did the steps run on this host?)",
            path.display()
        )
    })?;
    let mut out = Marks::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let [pr, what, ns] = f[..] else { continue };
        let Ok(ns) = ns.parse::<f64>() else { continue };
        let e = out.entry(pr.to_string()).or_default();
        match what {
            "start" => e.0 = Some(ns / 1e9),
            "end" => e.1 = Some(ns / 1e9),
            _ => {}
        }
    }
    Ok(out)
}

/// Pods over time: the most alive at once, the most held by waiters at once, and the pod-seconds
/// waiters held. A waiter's pod is one of a pipeline task other than `work` (the deploy and the
/// release): it exists only to wait. A pod is alive from first seen to phase Succeeded/Failed or
/// deletion.
pub fn pod_occupancy(log: &[Obs], work: &[&str]) -> (usize, usize, f64) {
    let mut alive: HashMap<String, (f64, bool)> = HashMap::new();
    let mut ended: std::collections::HashSet<String> = Default::default();
    let (mut max_all, mut max_waiters, mut waiter_secs) = (0, 0, 0.0);
    for o in log.iter().filter(|o| o.kind == Kind::Pod) {
        if ended.contains(&o.name) {
            continue;
        }
        let finished = o.deleted || matches!(o.phase.as_deref(), Some("Succeeded" | "Failed"));
        if finished {
            if let Some((since, true)) = alive.remove(&o.name) {
                waiter_secs += o.at - since;
            }
            ended.insert(o.name.clone());
            continue;
        }
        let waiter = !o
            .pipeline_task
            .as_deref()
            .is_some_and(|t| work.contains(&t));
        alive.entry(o.name.clone()).or_insert((o.at, waiter));
        max_all = max_all.max(alive.len());
        max_waiters = max_waiters.max(alive.values().filter(|(_, w)| *w).count());
    }
    (max_all, max_waiters, waiter_secs)
}

/// The outcome of draining one queue of deploys.
pub struct QueueResult {
    pub gaps: Vec<f64>,
    pub hops: Hops,
    pub controller: Vec<f64>,
    pub makespan: f64,
    pub max_pods: usize,
    pub max_waiter_pods: usize,
    pub waiter_pod_seconds: f64,
}

impl QueueResult {
    pub fn to_json(&self) -> Value {
        json!({
            "idle_gap": Summary::of_seconds(&self.gaps).to_json(),
            "controller_handover": Summary::of_seconds(&self.controller).to_json(),
            "hops": self.hops.to_json(),
            "makespan_s": super::report::round(self.makespan),
            "max_pods_alive": self.max_pods,
            "max_waiter_pods": self.max_waiter_pods,
            "waiter_pod_seconds": super::report::round(self.waiter_pod_seconds),
        })
    }
}

pub fn marks_file(bench: &Bench, ns: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(&bench.opts.out)?;
    let path = bench.opts.out.join(format!("marks-{ns}.txt"));
    let _ = std::fs::remove_file(&path);
    Ok(path)
}

/// Creates `n` PipelineRuns of `pipeline` at once and waits until all are done; returns the
/// creation time.
pub async fn drain(
    ns: &super::support::TestNamespace,
    rec: &Recorder,
    pipeline: &str,
    n: usize,
) -> Result<f64> {
    let api = ns.dynamic("tekton.dev/v1", "PipelineRun").await?;
    let t0 = now();
    let prs = (0..n)
        .map(|i| objects::pipeline_run(&format!("{pipeline}-{i:04}"), pipeline))
        .collect();
    create_all(&api, prs, 8).await?;
    let timeout = Duration::from_secs(120 + 15 * n as u64);
    rec.wait(
        &format!("{n} PipelineRuns to finish"),
        timeout,
        Duration::from_millis(200),
        |r| r.count(Kind::PipelineRun, "done") >= n,
    )
    .await?;
    let ok = rec.count(Kind::PipelineRun, "reason:Succeeded");
    if ok < n {
        bail!(
            "only {ok} of {n} PipelineRuns succeeded (namespace {})",
            ns.name()
        );
    }
    Ok(t0)
}

/// Drains a queue of `n` Mutex deploys on one key and analyses every handover.
pub async fn mutex_queue(bench: &Bench, n: usize) -> Result<QueueResult> {
    let ns = super::support::TestNamespace::create("bench-mutex").await?;
    let _controller = bench.controller(&ns).await?;
    let marks = marks_file(bench, ns.name())?;
    let kinds = [Kind::CustomRun, Kind::PipelineRun, Kind::TaskRun, Kind::Pod];
    let rec = Recorder::start(&bench.client, ns.name(), &kinds, true).await?;
    ns.apply(&objects::mutex_pipeline(
        "mtx",
        "deploy",
        &marks.to_string_lossy(),
    ))
    .await?;
    let t0 = drain(&ns, &rec, "mtx", n).await?;
    let marks = read_marks(&marks)?;

    let prs: Vec<String> = (0..n).map(|i| format!("mtx-{i:04}")).collect();
    let mut granted: Vec<(f64, &String)> = prs
        .iter()
        .filter_map(|pr| {
            Some((
                rec.first(Kind::CustomRun, &format!("{pr}-lock"), "reason:Acquired")?,
                pr,
            ))
        })
        .collect();
    granted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut hops = Hops::new(&[
        "deploy step end -> pod Succeeded (pod-runner)",
        "pod Succeeded -> TaskRun done",
        "TaskRun done -> PipelineRun done",
        "PipelineRun done -> next granted (controller)",
        "granted -> next TaskRun created",
        "TaskRun created -> pod created",
        "pod created -> pod Running",
        "pod Running -> deploy step start",
    ]);
    let (mut gaps, mut controller) = (Vec::new(), Vec::new());
    for w in granted.windows(2) {
        let (prev, (grant, next)) = (w[0].1, w[1]);
        let points = [
            marks.get(prev).and_then(|m| m.1),
            rec.first(Kind::Pod, &format!("{prev}-deploy-pod"), "phase:Succeeded"),
            rec.first(Kind::TaskRun, &format!("{prev}-deploy"), "done"),
            rec.first(Kind::PipelineRun, prev, "done"),
            Some(grant),
            rec.first(Kind::TaskRun, &format!("{next}-deploy"), "seen"),
            rec.first(Kind::Pod, &format!("{next}-deploy-pod"), "seen"),
            rec.first(Kind::Pod, &format!("{next}-deploy-pod"), "phase:Running"),
            marks.get(next).and_then(|m| m.0),
        ];
        hops.add(&points);
        if let (Some(a), Some(b)) = (points[0], points[8]) {
            gaps.push(b - a);
        }
        if let Some(done) = points[3] {
            controller.push(grant - done);
        }
    }
    let last_done = prs
        .iter()
        .filter_map(|pr| rec.first(Kind::PipelineRun, pr, "done"))
        .fold(t0, f64::max);
    let (max_pods, max_waiter_pods, waiter_pod_seconds) = pod_occupancy(&rec.log(), &["deploy"]);
    Ok(QueueResult {
        gaps,
        hops,
        controller,
        makespan: last_done - t0,
        max_pods,
        max_waiter_pods,
        waiter_pod_seconds,
    })
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    let n = bench.opts.handovers + 1;
    bench.table.section(&format!(
        "1. Handover latency: {} handovers on one key",
        n - 1
    ));
    let r = mutex_queue(bench, n).await?;
    bench.table.row(
        "controller: PipelineRun done -> next Acquired",
        Summary::of_seconds(&r.controller).line(),
    );
    bench.table.row(
        "whole chain: deploy step end -> next deploy step start",
        Summary::of_seconds(&r.gaps).line(),
    );
    r.hops.rows(bench, "  hop: ");
    bench.json.insert("handover".into(), r.to_json());
    Ok(())
}
