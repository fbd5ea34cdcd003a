//! Part 2: side by side with the polling-lease pattern. The same N queued deploys, once with
//! the Mutex and once with a TaskRun that loops "create a Lease, or wait for its deletion",
//! released by a finally task: idle gap, makespan, and pods held by waiters.

use super::handover::{
    Hops, QueueResult, drain, marks_file, mutex_queue, pod_occupancy, read_marks,
};
use super::report::Summary;
use super::watch::{Kind, Recorder};
use super::{Bench, objects};
use anyhow::Result;
use serde_json::json;

/// Drains a queue of `n` lease-guarded deploys and analyses every handover.
async fn lease_queue(bench: &Bench, n: usize) -> Result<QueueResult> {
    let ns = super::support::TestNamespace::create("bench-lease").await?;
    let marks = marks_file(bench, ns.name())?;
    let kinds = [Kind::PipelineRun, Kind::TaskRun, Kind::Pod, Kind::Lease];
    let rec = Recorder::start(&bench.client, ns.name(), &kinds, true).await?;
    ns.apply(&objects::lease_pipeline("lease", &marks.to_string_lossy()))
        .await?;
    let t0 = drain(&ns, &rec, "lease", n).await?;
    let marks = read_marks(&marks)?;
    let log = rec.log();
    let leases: Vec<_> = log.iter().filter(|o| o.kind == Kind::Lease).collect();
    // The first Lease deletion, and the first Lease (re)creation after a time.
    let deleted_after = |t: f64| leases.iter().find(|o| o.deleted && o.at >= t).map(|o| o.at);
    let created_after = |t: f64| leases.iter().find(|o| !o.deleted && o.at > t).map(|o| o.at);

    let prs: Vec<String> = (0..n).map(|i| format!("lease-{i:04}")).collect();
    let mut order: Vec<(f64, &String)> = prs
        .iter()
        .filter_map(|pr| Some((marks.get(pr)?.0?, pr)))
        .collect();
    order.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut hops = Hops::new(&[
        "deploy step end -> TaskRun done",
        "TaskRun done -> release TaskRun created",
        "release TaskRun created -> Lease deleted",
        "Lease deleted -> Lease created by the next",
        "Lease created -> acquire TaskRun done",
        "acquire TaskRun done -> deploy TaskRun created",
        "deploy TaskRun created -> pod created",
        "pod created -> deploy step start",
    ]);
    let mut gaps = Vec::new();
    for w in order.windows(2) {
        let (prev, (start, next)) = (w[0].1, w[1]);
        let end = marks.get(prev).and_then(|m| m.1);
        let lease_deleted = end.and_then(deleted_after);
        let points = [
            end,
            rec.first(Kind::TaskRun, &format!("{prev}-deploy"), "done"),
            rec.first(Kind::TaskRun, &format!("{prev}-release"), "seen"),
            lease_deleted,
            lease_deleted.and_then(created_after),
            rec.first(Kind::TaskRun, &format!("{next}-acquire"), "done"),
            rec.first(Kind::TaskRun, &format!("{next}-deploy"), "seen"),
            rec.first(Kind::Pod, &format!("{next}-deploy-pod"), "seen"),
            Some(start),
        ];
        hops.add(&points);
        if let Some(end) = end {
            gaps.push(start - end);
        }
    }
    let last_done = prs
        .iter()
        .filter_map(|pr| rec.first(Kind::PipelineRun, pr, "done"))
        .fold(t0, f64::max);
    let (max_pods, max_waiter_pods, waiter_pod_seconds) =
        pod_occupancy(&log, &["deploy", "release"]);
    Ok(QueueResult {
        gaps,
        hops,
        controller: Vec::new(),
        makespan: last_done - t0,
        max_pods,
        max_waiter_pods,
        waiter_pod_seconds,
    })
}

pub async fn run(bench: &mut Bench) -> Result<()> {
    let n = bench.opts.queue;
    bench.table.section(&format!(
        "2. Side by side: {n} deploys queued at once, Mutex vs polling Lease"
    ));
    let mutex = mutex_queue(bench, n).await?;
    let lease = lease_queue(bench, n).await?;
    for (name, r) in [("Mutex", &mutex), ("Lease", &lease)] {
        bench.table.row(
            format!("{name}: idle gap (step end -> next step start)"),
            Summary::of_seconds(&r.gaps).line(),
        );
        bench.table.row(
            format!("{name}: makespan / max pods alive / max waiter pods"),
            format!(
                "{:.1} s / {} / {} ({:.1} waiter pod-seconds)",
                r.makespan, r.max_pods, r.max_waiter_pods, r.waiter_pod_seconds
            ),
        );
    }
    lease.hops.rows(bench, "  Lease hop: ");
    bench.json.insert(
        "side_by_side".into(),
        json!({"deploys": n, "mutex": mutex.to_json(), "lease": lease.to_json()}),
    );
    Ok(())
}
