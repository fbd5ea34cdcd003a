//! The core Mutex (issue 3) on the local control plane: the real Tekton
//! controller creates CustomRuns from real Pipelines; tekton-mutex runs as a process.

mod support;

use anyhow::{Result, ensure};
use futures::future::try_join_all;
use kube::api::DeleteParams;
use serde_json::json;
use support::controller::ControllerProcess;
use support::locks::{self, Kind, Lock};
use support::pipelines::*;
use support::timeline::{Timeline, report_latencies};
use support::*;
use tekton_mutex::model::mutex::Mutex;
use tekton_mutex::model::tekton::customrun::CustomRun;
use tekton_mutex::model::tekton::pipelinerun::PipelineRun;

for_both_kinds! {
    mutual_exclusion_of_eight_concurrent_runs_with_two_replicas => exclusion_case;
    released_when_holder_fails => |k| release_case(k, Ending::Fails);
    released_when_holder_is_cancelled => |k| release_case(k, Ending::Cancelled);
    released_only_after_finally_when_cancelled_gracefully => |k| release_case(k, Ending::CancelledRunFinally);
    released_when_holder_pipelinerun_is_deleted => |k| release_case(k, Ending::PipelineRunDeleted);
    released_when_holder_whose_customrun_was_deleted_ends => |k| release_case(k, Ending::CustomRunDeleted);
}

async fn exclusion_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("exclusion").await?;
    // Two replicas at once: every grant is a compare-and-swap, so they cannot double-grant.
    let lock = Lock::new(kind, &ns).await?;
    let _b = lock.second_replica().await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    ns.apply(&pipeline(
        "deploy",
        &lock.opts(Opts {
            lock_params: &[("supersede", "none")],
            ..Default::default()
        }),
    ))
    .await?;
    let prs: Vec<String> = (0..8).map(|i| format!("run-{i}")).collect();
    let runs: Vec<String> = prs
        .iter()
        .map(|pr| pipeline_run(pr, "deploy", &[]))
        .collect();
    try_join_all(runs.iter().map(|y| ns.apply(y))).await?;

    let order = drive_grants(&ns, &prs, 8).await?;
    for pr in &prs {
        let c = ns
            .wait_for_succeeded("tekton.dev/v1", "PipelineRun", pr, slow())
            .await?;
        ensure!(c.status == "True", "{pr} did not succeed: {c:?}");
    }
    let grants = timeline.check_exclusion(1)?;
    ensure!(grants.len() == 8, "expected 8 grants, saw {grants:?}");
    ensure!(
        grants.iter().map(|g| &g.pipeline_run).eq(order.iter()),
        "grant order {grants:?} vs {order:?}"
    );
    ensure!(
        grants.windows(2).all(|w| w[0].token < w[1].token),
        "tokens must strictly increase: {grants:?}"
    );
    // The controller learns of the last completion from its own watch: wait for it.
    let status = wait_until("the lock to be free at the end", slow(), || async {
        let s = lock.status(&ns).await?;
        Ok((s.holders.is_empty() && s.queue.is_empty()).then_some(s))
    })
    .await?;
    ensure!(
        status.last_token == grants.last().unwrap().token,
        "lastToken {} vs grants {grants:?}",
        status.last_token
    );
    report_latencies(
        "handover, 8 runs, 2 replicas",
        &timeline.handover_latencies(),
    );
    report_latencies(
        "creation to first status, 8 runs",
        &timeline.first_status_latencies(),
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn waiters_are_served_in_creation_order() -> Result<()> {
    let ns = TestNamespace::create("fifo").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    ns.apply(&pipeline(
        "deploy",
        &Opts {
            lock_params: &[("supersede", "none")],
            ..Default::default()
        },
    ))
    .await?;
    let prs: Vec<String> = ["fifo-a", "fifo-b", "fifo-c", "fifo-d", "fifo-e"]
        .map(String::from)
        .to_vec();
    ns.apply(&pipeline_run(&prs[0], "deploy", &[])).await?;
    wait_reason(&ns, &lock_run(&prs[0]), "Acquired", slow()).await?;
    // Created one after another: creation time (then name) orders them.
    for pr in &prs[1..] {
        ns.apply(&pipeline_run(pr, "deploy", &[])).await?;
    }
    let last = wait_reason(&ns, &lock_run("fifo-e"), "Waiting", slow()).await?;
    wait_until("all four to wait", slow(), || async {
        Ok(mutex_status(&ns, ns.name())
            .await?
            .queue
            .len()
            .eq(&4)
            .then_some(()))
    })
    .await?;
    let last = condition_of(&ns, &lock_run("fifo-e"))
        .await?
        .unwrap_or(last);
    // Only the head is told who holds the key; the rest, that they are queued.
    ensure!(
        last.message.as_deref()
            == Some(&format!(
                "waiting for {0}: queued ({0}'s status lists the queue in order)",
                ns.name()
            )),
        "waiting message: {last:?}"
    );
    let head = format!("waiting for {}: next in line, held by fifo-a", ns.name());
    wait_until("fifo-b to be told it is next in line", slow(), || async {
        let m = condition_of(&ns, &lock_run("fifo-b"))
            .await?
            .and_then(|c| c.message);
        Ok((m.as_deref() == Some(head.as_str())).then_some(()))
    })
    .await?;
    let order = drive_grants(&ns, &prs, 5).await?;
    ensure!(order == prs, "grant order {order:?}");
    Ok(())
}

/// How a holder stops holding, for [`release_case`].
#[derive(Clone, Copy, Debug)]
enum Ending {
    Fails,
    Cancelled,
    CancelledRunFinally,
    PipelineRunDeleted,
    CustomRunDeleted,
}

/// A holder `a` and a waiter `b`; ending `a` in the given way hands the slot to `b`.
async fn release_case(kind: Kind, ending: Ending) -> Result<()> {
    let ns = TestNamespace::create(&format!("release-{ending:?}")).await?;
    let lock = Lock::new(kind, &ns).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    let finally = matches!(ending, Ending::CancelledRunFinally);
    ns.apply(&pipeline(
        "deploy",
        &lock.opts(Opts {
            lock_params: &[("supersede", "none")],
            finally,
            ..Default::default()
        }),
    ))
    .await?;
    let exit = if matches!(ending, Ending::Fails) {
        "1"
    } else {
        "0"
    };
    ns.apply(&pipeline_run("a", "deploy", &[("exit-code", exit)]))
        .await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    wait_pod_recorded(&ns, "a-deploy").await?;

    match ending {
        Ending::Fails => release(&ns, "a").await?,
        Ending::Cancelled => cancel_pipeline_run(&ns, "a", "Cancelled").await?,
        Ending::CancelledRunFinally => {
            cancel_pipeline_run(&ns, "a", "CancelledRunFinally").await?;
            // The finally task is running and blocked on its gate: the slot must stay with a.
            wait_until("a's finally task to start", slow(), || async {
                let trs = ns.kubectl(&["get", "taskruns", "-o", "name"])?;
                Ok(trs.contains("a-cleanup").then_some(()))
            })
            .await?;
            ensure!(
                condition_of(&ns, &lock_run("b"))
                    .await?
                    .and_then(|c| c.reason)
                    .as_deref()
                    == Some("Waiting"),
                "b must wait while a's finally runs"
            );
            ensure!(
                lock.status(&ns).await?.holding == lock.name_of("a"),
                "a keeps the slot during finally"
            );
            release_finally(&ns, "a").await?;
        }
        Ending::PipelineRunDeleted => {
            ns.api::<PipelineRun>()
                .delete("a", &DeleteParams::default())
                .await?;
        }
        Ending::CustomRunDeleted => {
            // The hold is the PipelineRun's: deleting its lock run frees nothing,
            // a's PipelineRun ending does.
            ns.api::<CustomRun>()
                .delete(&lock_run("a"), &DeleteParams::default())
                .await?;
            ensure!(
                lock.status(&ns).await?.holding == lock.name_of("a"),
                "a keeps the slot without its lock run"
            );
            release(&ns, "a").await?;
        }
    }
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    if finally {
        ensure!(
            ns.kubectl(&["get", "configmap", "finally-ran-a"]).is_ok(),
            "a's finally task ran"
        );
    }
    // A deleted (and by Tekton re-created) lock run shows its grant twice on the timeline.
    if !matches!(ending, Ending::CustomRunDeleted) {
        timeline.check_exclusion(1)?;
    }
    let status = lock.status(&ns).await?;
    ensure!(
        status.holding == lock.name_of("b"),
        "b holds now: {status:?}"
    );
    release(&ns, "b").await?;
    if finally {
        release_finally(&ns, "b").await?;
    }
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "b", slow())
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn cancelled_waiter_leaves_the_queue_and_tkn_shows_each_state() -> Result<()> {
    let ns = TestNamespace::create("cancel-waiter").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    ns.apply(&pipeline(
        "deploy",
        &Opts {
            lock_params: &[("supersede", "none")],
            ..Default::default()
        },
    ))
    .await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy", &[])).await?;
    ns.apply(&pipeline_run("c", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("c"), "Waiting", slow()).await?;
    // tkn pipelinerun cancel: Tekton then cancels the CustomRun (spec.status RunCancelled).
    ns.tkn(&["pipelinerun", "cancel", "b"])?;
    let c = wait_reason(&ns, &lock_run("b"), "CustomRunCancelled", slow()).await?;
    ensure!(c.status == "False", "{c:?}");
    let status = mutex_status(&ns, ns.name()).await?;
    ensure!(
        status
            .queue
            .iter()
            .all(|w| w.pipeline_run.as_deref() != Some("b")),
        "b left the queue: {status:?}"
    );
    wait_until("c to move up to the head of the queue", slow(), || async {
        let m = condition_of(&ns, &lock_run("c"))
            .await?
            .and_then(|c| c.message)
            .unwrap_or_default();
        Ok(m.contains(": next in line, held by a").then_some(()))
    })
    .await?;

    let list = ns.tkn(&["customrun", "list"])?;
    for want in [
        "Succeeded(Acquired)",
        "Running(Waiting)",
        "Failed(CustomRunCancelled)",
    ] {
        ensure!(
            list.contains(want),
            "tkn customrun list lacks {want}:\n{list}"
        );
    }
    let describe = ns.tkn(&["customrun", "describe", &lock_run("a")])?;
    ensure!(
        describe.contains("token"),
        "tkn customrun describe shows results:\n{describe}"
    );
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("c"), "Acquired", slow()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn waiting_times_out_after_its_retries() -> Result<()> {
    let ns = TestNamespace::create("timeout").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    ns.apply(&pipeline(
        "hold",
        &Opts {
            lock_params: &[("supersede", "none")],
            ..Default::default()
        },
    ))
    .await?;
    ns.apply(&pipeline(
        "impatient",
        &Opts {
            lock_params: &[("supersede", "none")],
            lock_timeout: Some("2s"),
            lock_retries: Some(1),
            ..Default::default()
        },
    ))
    .await?;
    ns.apply(&pipeline_run("a", "hold", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "impatient", &[])).await?;
    let c = wait_reason(&ns, &lock_run("b"), "CustomRunTimedOut", slow()).await?;
    ensure!(c.status == "False", "{c:?}");
    let cr = ns.api::<CustomRun>().get(&lock_run("b")).await?;
    ensure!(
        cr.status.unwrap_or_default().retries_status.len() == 1,
        "one retry was recorded before the final timeout"
    );
    let status = mutex_status(&ns, ns.name()).await?;
    ensure!(
        status.queue.is_empty() && status.holding == "a",
        "b left the queue: {status:?}"
    );
    let pr = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "b", slow())
        .await?;
    ensure!(pr.status == "False", "b's PipelineRun fails: {pr:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn controller_killed_mid_queue_loses_nothing() -> Result<()> {
    let ns = TestNamespace::create("restart").await?;
    let _shared = locks::shared().await;
    let mut c = ControllerProcess::start(ns.name()).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    ns.apply(&pipeline(
        "deploy",
        &Opts {
            lock_params: &[("supersede", "none")],
            ..Default::default()
        },
    ))
    .await?;
    let prs: Vec<String> = (0..4).map(|i| format!("r{i}")).collect();
    for pr in &prs {
        ns.apply(&pipeline_run(pr, "deploy", &[])).await?;
    }
    wait_until("one holder and three waiters", slow(), || async {
        let s = mutex_status(&ns, ns.name()).await?;
        Ok((s.holders.len() == 1 && s.queue.len() == 3).then_some(s))
    })
    .await?;
    let first = mutex_status(&ns, ns.name()).await?.holding;
    // The Mutex status is written before the runs are told: wait until the holder's
    // lock run says so, or it could never finish while the controller is down.
    wait_reason(&ns, &lock_run(&first), "Acquired", slow()).await?;
    c.kill();
    // While it is down: the holder finishes, and a new run arrives.
    release(&ns, &first).await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", &first, slow())
        .await?;
    ns.apply(&pipeline_run("r4", "deploy", &[])).await?;
    let mut all = prs.clone();
    all.push("r4".into());
    let _c2 = ControllerProcess::start(ns.name()).await?;
    let mut order = vec![first.clone()];
    order.extend(
        drive_grants(
            &ns,
            &all.iter()
                .filter(|p| **p != first)
                .cloned()
                .collect::<Vec<_>>(),
            4,
        )
        .await?,
    );
    for pr in &all {
        let c = ns
            .wait_for_succeeded("tekton.dev/v1", "PipelineRun", pr, slow())
            .await?;
        ensure!(c.status == "True", "{pr}: {c:?}");
    }
    let grants = timeline.check_exclusion(1)?;
    let tokens: Vec<i64> = grants.iter().map(|g| g.token).collect();
    ensure!(
        tokens.len() == 5 && tokens.windows(2).all(|w| w[0] < w[1]),
        "five grants, no token reused across the restart: {grants:?}"
    );
    Ok(())
}

fn standalone(name: &str, target: serde_json::Value, params: serde_json::Value) -> String {
    let mut spec = json!({"params": params});
    if target.get("spec").is_some() {
        spec["customSpec"] = target;
    } else {
        spec["customRef"] = target;
    }
    json!({"apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun", "metadata": {"name": name}, "spec": spec}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn bad_input_fails_with_invalid_params() -> Result<()> {
    let ns = TestNamespace::create("bad-input").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    // Not ours: must never be touched.
    ns.apply(&standalone(
        "other-kind",
        json!({"apiVersion": "example.dev/v1", "kind": "Wait"}),
        json!([]),
    ))
    .await?;
    let cases = [
        (
            "unknown-param",
            mutex.clone(),
            json!([{"name": "colour", "value": "red"}]),
            "unknown param \"colour\"",
        ),
        (
            "array-value",
            mutex.clone(),
            json!([{"name": "key", "value": ["a", "b"]}]),
            "must be a string, got an array",
        ),
        (
            "bad-key",
            mutex.clone(),
            json!([{"name": "key", "value": "k".repeat(1025)}]),
            "a key may have at most 1024 bytes",
        ),
        (
            "bad-supersede",
            mutex.clone(),
            json!([{"name": "supersede", "value": "everything"}]),
            "allowed values are pending, none, running",
        ),
        (
            "bad-sequence",
            mutex.clone(),
            json!([{"name": "sequence", "value": "12a"}]),
            "must be an integer",
        ),
        (
            "bad-cancel-mode",
            mutex.clone(),
            json!([{"name": "cancel-mode", "value": "Stop"}]),
            "allowed values are CancelledRunFinally",
        ),
        (
            "bad-custom-spec",
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex", "spec": {"capacity": "two"}}),
            json!([]),
            "customSpec.spec is not a Mutex spec",
        ),
    ];
    for (name, target, params, _) in &cases {
        ns.apply(&standalone(name, target.clone(), params.clone()))
            .await?;
    }
    for (name, _, _, want) in &cases {
        let c = wait_reason(&ns, name, "InvalidParams", secs(30)).await?;
        ensure!(c.status == "False", "{name}: {c:?}");
        let msg = c.message.unwrap_or_default();
        ensure!(
            msg.contains(want),
            "{name}: message {msg:?} should contain {want:?}"
        );
    }
    ensure!(
        condition_of(&ns, "other-kind").await?.is_none(),
        "a CustomRun of another kind was touched"
    );
    ensure!(
        ns.api::<Mutex>()
            .list(&Default::default())
            .await?
            .items
            .is_empty(),
        "no Mutex is created for bad input"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn mutex_object_by_name_and_standalone_runs() -> Result<()> {
    let ns = TestNamespace::create("standalone").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let by_name =
        json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex", "name": "prod"});
    ns.apply(&standalone("s1", by_name.clone(), json!([])))
        .await?;
    wait_reason(&ns, "s1", "Acquired", secs(30)).await?;
    ensure!(
        result_of(&ns, "s1", "key").await?.as_deref() == Some("prod"),
        "key result"
    );
    let t1 = token_result(&ns, "s1").await?;
    ns.apply(&standalone("s2", by_name, json!([]))).await?;
    let c = wait_reason(&ns, "s2", "Waiting", secs(30)).await?;
    ensure!(
        c.message.as_deref() == Some("waiting for prod: next in line, held by s1"),
        "{c:?}"
    );
    // A standalone holder holds until it is deleted.
    ns.api::<CustomRun>()
        .delete("s1", &DeleteParams::default())
        .await?;
    wait_reason(&ns, "s2", "Acquired", secs(30)).await?;
    let t2 = token_result(&ns, "s2").await?;
    ensure!(t2 > t1, "s2's token {t2} is not above s1's {t1}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_pipelinerun_holding_the_key_passes_its_second_lock() -> Result<()> {
    let ns = TestNamespace::create("reentry").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    let pipeline = json!({
        "apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": "twice"},
        "spec": {"tasks": [
            {"name": "lock", "taskRef": mutex},
            {"name": "lock-again", "runAfter": ["lock"], "taskRef": mutex},
        ]},
    });
    ns.apply(&pipeline.to_string()).await?;
    ns.apply(&pipeline_run("p", "twice", &[])).await?;
    let pr = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "p", slow())
        .await?;
    ensure!(pr.status == "True", "{pr:?}");
    let first = result_of(&ns, "p-lock", "token").await?;
    let second = result_of(&ns, "p-lock-again", "token").await?;
    ensure!(
        first.is_some() && first == second,
        "one grant, one token: {first:?} {second:?}"
    );
    Ok(())
}
