//! Release only when nothing of the holder can still run (issue 9), on the local
//! control plane: the real Tekton controller cancels, times out and deletes; the
//! kubelet stand-in gives a deleted pod SIGTERM and its grace period, like a kubelet.
//!
//! Each deploy step records its own marks as ConfigMaps (start, term, end), with
//! the host's clock in nanoseconds: the steps all run on this host. The tests
//! assert that the next holder's deploy starts only after the old step's process
//! has written its end mark, which it does on its way out, after its TERM work.

mod support;

use anyhow::{Result, ensure};
use kube::api::DeleteParams;
use serde_json::json;
use support::controller::ControllerProcess;
use support::locks::{self, Kind, Lock};
use support::pipelines::{
    cancel_pipeline_run, lock_run, mark, mark_exists, mutex_status, release, slow,
    wait_pod_recorded, wait_reason,
};
use support::*;
use tekton_mutex::model::tekton::customrun::CustomRun;
use tekton_mutex::model::tekton::pipelinerun::PipelineRun;

/// A deploy step that, on SIGTERM, keeps working about 5 s before it writes its
/// end mark and exits: a prune that is still running after its PipelineRun ended.
const DEPLOY_STEP: &str = r#"
mark() { kubectl -n "$(params.ns)" create configmap "$1-$(params.pr)" --from-literal=at="$(date +%s%N)" >/dev/null; }
on_term() {
  mark term
  # Still deploying: five rounds of about a second of API work each.
  for i in 1 2 3 4 5; do
    kubectl -n "$(params.ns)" wait --for=create "configmap/never-$i" --timeout=1s >/dev/null 2>&1 || true
  done
  mark end
  exit 0
}
trap on_term TERM
mark start
kubectl -n "$(params.ns)" wait --for=create "configmap/release-$(params.pr)" --timeout=600s >/dev/null &
wait $!
mark end
"#;

/// `lock` (with this `taskRef`) then `deploy` (the step above); `extra_tasks` run beside the lock.
fn pipeline(
    task_ref: &serde_json::Value,
    name: &str,
    lock_params: &[(&str, &str)],
    extra_tasks: &[serde_json::Value],
) -> String {
    let params: Vec<_> = lock_params
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mut tasks = vec![
        json!({"name": "lock", "params": params, "taskRef": task_ref}),
        json!({
            "name": "deploy", "runAfter": ["lock"],
            "params": [
                {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
                {"name": "pr", "value": "$(context.pipelineRun.name)"},
            ],
            "taskSpec": {
                "params": [{"name": "ns"}, {"name": "pr"}],
                "steps": [{"name": "run", "image": "busybox", "script": DEPLOY_STEP}],
            },
        }),
    ];
    tasks.extend(extra_tasks.iter().cloned());
    json!({"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name},
           "spec": {"tasks": tasks}})
    .to_string()
}

fn pipeline_run(name: &str, pipeline: &str, timeout: Option<&str>) -> String {
    let mut pr = json!({"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
                        "metadata": {"name": name}, "spec": {"pipelineRef": {"name": pipeline}}});
    if let Some(t) = timeout {
        pr["spec"]["timeouts"] = json!({"pipeline": t});
    }
    pr.to_string()
}

/// `a` holds and is in its deploy step; `b` waits behind it.
async fn a_deploys_b_waits(
    ns: &TestNamespace,
    pipeline_yaml: &str,
    a_timeout: Option<&str>,
) -> Result<()> {
    ns.apply(pipeline_yaml).await?;
    ns.apply(&pipeline_run("a", "deploy", a_timeout)).await?;
    mark(ns, "start", "a").await?;
    ns.apply(&pipeline_run("b", "deploy", None)).await?;
    wait_reason(ns, &lock_run("b"), "Waiting", slow()).await?;
    wait_pod_recorded(ns, "a-deploy").await?;
    Ok(())
}

/// The next holder's deploy started only after the old one's step ended, and
/// the old step did get SIGTERM (it was still running when its run ended).
async fn assert_handed_over_after_the_step_ended(
    ns: &TestNamespace,
    old: &str,
    new: &str,
) -> Result<()> {
    let new_start = mark(ns, "start", new).await?;
    ensure!(
        mark_exists(ns, "term", old).await?,
        "{old}'s step never got SIGTERM: the test did not exercise a terminating pod"
    );
    let old_end = mark(ns, "end", old).await?;
    ensure!(
        new_start > old_end,
        "{new} started deploying {} ms before {old}'s step ended",
        (old_end - new_start) / 1_000_000
    );
    release(ns, new).await?;
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", new, slow())
        .await?;
    ensure!(c.status == "True", "{new} did not succeed: {c:?}");
    Ok(())
}

for_both_kinds! {
    a_cancelled_holder_keeps_the_slot_until_its_terminating_step_ended => cancelled_case;
    a_superseded_running_holder_keeps_the_slot_until_its_step_ended => superseded_case;
    a_timed_out_holder_keeps_the_slot_until_its_step_ended => timed_out_case;
    a_deleted_holder_keeps_the_slot_until_its_pods_are_gone => deleted_case;
    deleting_the_holders_lock_run_does_not_free_the_slot => lock_run_deleted_case;
}

async fn cancelled_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("drain-cancel").await?;
    let lock = Lock::new(kind, &ns).await?;
    a_deploys_b_waits(
        &ns,
        &pipeline(&lock.task_ref(), "deploy", &[("supersede", "none")], &[]),
        None,
    )
    .await?;
    cancel_pipeline_run(&ns, "a", "Cancelled").await?;
    assert_handed_over_after_the_step_ended(&ns, "a", "b").await
}

async fn superseded_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("drain-supersede").await?;
    let lock = Lock::new(kind, &ns).await?;
    let params = [("supersede", "running"), ("cancel-mode", "Cancelled")];
    // b is newer: it makes the controller cancel a, and waits for a's step to end.
    a_deploys_b_waits(
        &ns,
        &pipeline(&lock.task_ref(), "deploy", &params, &[]),
        None,
    )
    .await?;
    assert_handed_over_after_the_step_ended(&ns, "a", "b").await
}

async fn timed_out_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("drain-timeout").await?;
    let lock = Lock::new(kind, &ns).await?;
    let yaml = pipeline(&lock.task_ref(), "deploy", &[("supersede", "none")], &[]);
    // a's deploy waits for a gate that never comes: its PipelineRun times out.
    a_deploys_b_waits(&ns, &yaml, Some("40s")).await?;
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "a", slow())
        .await?;
    ensure!(c.reason == "PipelineRunTimeout", "a: {c:?}");
    assert_handed_over_after_the_step_ended(&ns, "a", "b").await
}

async fn deleted_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("drain-delete").await?;
    let lock = Lock::new(kind, &ns).await?;
    a_deploys_b_waits(
        &ns,
        &pipeline(&lock.task_ref(), "deploy", &[("supersede", "none")], &[]),
        None,
    )
    .await?;
    // The garbage collector deletes its TaskRun, lock run and pod, with the grace period.
    ns.api::<PipelineRun>()
        .delete("a", &DeleteParams::background())
        .await?;
    assert_handed_over_after_the_step_ended(&ns, "a", "b").await
}

async fn lock_run_deleted_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("drain-lockrun").await?;
    let lock = Lock::new(kind, &ns).await?;
    a_deploys_b_waits(
        &ns,
        &pipeline(&lock.task_ref(), "deploy", &[("supersede", "none")], &[]),
        None,
    )
    .await?;
    let runs = ns.api::<CustomRun>();
    let uid = runs.get(&lock_run("a")).await?.metadata.uid;
    runs.delete(&lock_run("a"), &DeleteParams::default())
        .await?;
    // Gone, or re-created by Tekton under the same name (another object).
    wait_until("the lock run to be gone", slow(), || async {
        let now = runs.get_opt(&lock_run("a")).await?;
        Ok(now.is_none_or(|r| r.metadata.uid != uid).then_some(()))
    })
    .await?;
    let s = lock.status(&ns).await?;
    ensure!(
        s.holders
            .iter()
            .any(|h| h.pipeline_run.as_deref() == Some(lock.name_of("a").as_str())),
        "a's hold went with its lock run: {s:?}"
    );
    ensure!(
        !mark_exists(&ns, "start", "b").await?,
        "b deployed while a was deploying"
    );
    release(&ns, "a").await?;
    let a_end = mark(&ns, "end", "a").await?;
    let b_start = mark(&ns, "start", "b").await?;
    ensure!(b_start > a_end, "b started before a's deploy ended");
    release(&ns, "b").await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "b", slow())
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_stopping_pipelinerun_leaves_the_queue_at_once() -> Result<()> {
    let _shared = locks::shared().await;
    let ns = TestNamespace::create("drain-stopping").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    ns.apply(&pipeline(&mutex, "deploy", &[("supersede", "none")], &[]))
        .await?;
    // The lock task has no dependents here: with one, Tekton v1.15 fails to reconcile
    // the PipelineRun (it counts the skipped dependent as done before its parent) and
    // never reports PipelineRunStopping until the lock task ends.
    let lock_beside_a_failing_task = json!({
        "apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": "deploy-or-fail"},
        "spec": {"tasks": [
            {"name": "lock", "params": [{"name": "supersede", "value": "none"}],
             "taskRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"}},
            {"name": "fails", "taskSpec": {"steps": [
                {"name": "run", "image": "busybox", "script": "echo failing on purpose; exit 1"}]}},
        ]},
    });
    ns.apply(&lock_beside_a_failing_task.to_string()).await?;
    ns.apply(&pipeline_run("a", "deploy", None)).await?;
    mark(&ns, "start", "a").await?;
    // c waits for the lock while a task beside it fails: Tekton stops scheduling and
    // waits for the running lock task, which must leave the queue, not hold c hostage.
    ns.apply(&pipeline_run("c", "deploy-or-fail", None)).await?;
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "c", slow())
        .await?;
    ensure!(c.status == "False", "c: {c:?}");
    let lock = wait_reason(&ns, &lock_run("c"), "CustomRunCancelled", slow()).await?;
    ensure!(
        lock.message.as_deref().unwrap_or("").contains("stopped"),
        "the message says why: {lock:?}"
    );
    let s = mutex_status(&ns, ns.name()).await?;
    ensure!(
        s.holders
            .iter()
            .any(|h| h.pipeline_run.as_deref() == Some("a")),
        "{s:?}"
    );
    ensure!(
        s.holders.len() == 1 && s.queue.is_empty(),
        "c never held: {s:?}"
    );
    release(&ns, "a").await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "a", slow())
        .await?;
    Ok(())
}
