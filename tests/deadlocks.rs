//! Deadlocks across keys (issue 37 item 5), on the local control plane. Each lock decides alone,
//! so two PipelineRuns can each hold a key the other waits for: a matrixed lock task over keys
//! whose queues order differently, or two pipelines taking the same keys in opposite orders.
//! The controller finds the cycle in the wait-for graph over every lock it serves and ends the
//! younger PipelineRun's wait with reason `Deadlock`, naming the cycle; the older one goes on.
//!
//! Each scenario is built step by step (gates and waits on conditions), so the deadlock forms
//! every time: no timing is left to chance.

mod support;

use anyhow::{Context, Result, ensure};
use serde_json::json;
use support::controller::ControllerProcess;
use support::pipelines::{create_gate, release, slow, wait_reason};
use support::*;
use tekton_mutex::model::tekton::customrun::CustomRun;

/// The Mutexes `x` (oldest waiter first) and `y` (newest first), and their controller.
async fn keys(ns: &TestNamespace) -> Result<ControllerProcess> {
    let controller = ControllerProcess::start(ns.name()).await?;
    for (name, order) in [("x", "oldest-first"), ("y", "newest-first")] {
        let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
            "metadata": {"name": name}, "spec": {"order": order}});
        ns.apply(&mutex.to_string()).await?;
    }
    Ok(controller)
}

fn lock_task(name: &str, key: Option<&str>, run_after: &[&str]) -> serde_json::Value {
    let mut params = vec![json!({"name": "supersede", "value": "none"})];
    params.extend(key.map(|k| json!({"name": "key", "value": k})));
    json!({
        "name": name,
        "runAfter": run_after,
        "taskRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
        "params": params,
    })
}

/// A task that waits for gate ConfigMap `<prefix>-<pipelinerun>`.
fn gate_task(name: &str, prefix: &str, run_after: &[&str]) -> serde_json::Value {
    let script = format!(
        "kubectl -n \"$(params.ns)\" wait --for=create \"configmap/{prefix}-$(params.pr)\" --timeout=600s >/dev/null\n"
    );
    json!({
        "name": name,
        "runAfter": run_after,
        "params": [
            {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
            {"name": "pr", "value": "$(context.pipelineRun.name)"},
        ],
        "taskSpec": {
            "params": [{"name": "ns"}, {"name": "pr"}],
            "steps": [{"name": "run", "image": "busybox", "script": script}],
        },
    })
}

fn pipeline(name: &str, tasks: Vec<serde_json::Value>) -> String {
    json!({"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name},
        "spec": {"tasks": tasks}})
    .to_string()
}

fn pipeline_run(name: &str, pipeline: &str) -> String {
    json!({"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": name},
        "spec": {"pipelineRef": {"name": pipeline}}})
    .to_string()
}

/// The lock run of PipelineRun `pr` on `key` (of a matrixed task, or of task `task`).
async fn run_on(ns: &TestNamespace, pr: &str, key: &str) -> Result<String> {
    let api = ns.api::<CustomRun>();
    let label = format!("tekton.dev/pipelineRun={pr}");
    wait_until(&format!("{pr}'s lock run on {key}"), slow(), || {
        let (api, label) = (api.clone(), label.clone());
        async move {
            let runs = api
                .list(&kube::api::ListParams::default().labels(&label))
                .await?;
            Ok(runs.items.into_iter().find_map(|r| {
                let on_key = r
                    .spec
                    .params
                    .iter()
                    .any(|p| p.name == "key" && p.value == json!(key));
                on_key.then(|| kube::ResourceExt::name_any(&r))
            }))
        }
    })
    .await
}

/// Once the younger PipelineRun's wait is ended as a deadlock, the older one finishes. The
/// PipelineRuns are named `one` and `two`: created within a second, they are told apart by name.
async fn older_goes_on_younger_fails(ns: &TestNamespace, older: &str, younger: &str) -> Result<()> {
    let victim = run_on(ns, younger, "x").await?;
    let told = wait_reason(ns, &victim, "Deadlock", slow()).await?;
    let message = told.message.unwrap_or_default();
    for word in [older, younger, "Mutex", "/x", "/y"] {
        ensure!(
            message.contains(word),
            "the Deadlock message should name {word}: {message}"
        );
    }
    let prs = ("tekton.dev/v1", "PipelineRun");
    let done = ns
        .wait_for_succeeded(prs.0, prs.1, older, slow() * 2)
        .await?;
    ensure!(
        done.status == "True",
        "{older} should go on and succeed: {done:?}"
    );
    let failed = ns.wait_for_succeeded(prs.0, prs.1, younger, slow()).await?;
    ensure!(
        failed.status == "False",
        "{younger} should fail: {failed:?}"
    );
    Ok(())
}

/// Item 5 as filed: a matrixed lock task over `x` and `y`, whose queues order differently. Both
/// PipelineRuns wait behind a holder of both keys; when it ends, `x` goes to the older and `y` to
/// the newer, and each waits for the other's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_matrixed_lock_task_over_keys_of_different_order_never_deadlocks() -> Result<()> {
    let ns = TestNamespace::create("deadlock-matrix").await?;
    let _controller = keys(&ns).await?;
    let mut lock = lock_task("lock", None, &[]);
    lock["matrix"] = json!({"params": [{"name": "key", "value": ["x", "y"]}]});
    ns.apply(&pipeline(
        "both",
        vec![lock, gate_task("deploy", "release", &["lock"])],
    ))
    .await?;
    ns.apply(&pipeline_run("holder", "both")).await?;
    for key in ["x", "y"] {
        wait_reason(&ns, &run_on(&ns, "holder", key).await?, "Acquired", slow()).await?;
    }
    for pr in ["one", "two"] {
        ns.apply(&pipeline_run(pr, "both")).await?;
        for key in ["x", "y"] {
            wait_reason(&ns, &run_on(&ns, pr, key).await?, "Waiting", slow()).await?;
        }
        create_gate(&ns, &format!("release-{pr}")).await?;
    }
    release(&ns, "holder").await?;
    older_goes_on_younger_fails(&ns, "one", "two")
        .await
        .context("after the holder of both keys ended")
}

/// Two pipelines taking `x` then `y`, and `y` then `x`: each PipelineRun holds its first key
/// when it asks for its second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn two_pipelines_taking_keys_in_opposite_orders_never_deadlock() -> Result<()> {
    let ns = TestNamespace::create("deadlock-orders").await?;
    let _controller = keys(&ns).await?;
    for (name, first, second) in [("xy", "x", "y"), ("yx", "y", "x")] {
        let tasks = vec![
            lock_task("first", Some(first), &[]),
            gate_task("between", "go", &["first"]),
            lock_task("second", Some(second), &["between"]),
        ];
        ns.apply(&pipeline(name, tasks)).await?;
    }
    for (pr, pipeline, first) in [("one", "xy", "x"), ("two", "yx", "y")] {
        ns.apply(&pipeline_run(pr, pipeline)).await?;
        wait_reason(&ns, &run_on(&ns, pr, first).await?, "Acquired", slow()).await?;
    }
    for pr in ["one", "two"] {
        create_gate(&ns, &format!("go-{pr}")).await?;
    }
    older_goes_on_younger_fails(&ns, "one", "two")
        .await
        .context("after each took its first key")
}
