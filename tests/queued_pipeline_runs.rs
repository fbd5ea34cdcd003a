//! Lock a PipelineRun without editing its pipeline (issue 26): a PipelineRun created
//! `spec.status: PipelineRunPending` with the annotation `tekton-mutex.dev/key` waits in the
//! key's queue before it starts, beside lock tasks, on the local control plane with the real
//! Tekton controller. (The founding scenario with queued PipelineRuns is in founding_scenario.rs.)

mod support;

use anyhow::{Context, Result, ensure};
use kube::ResourceExt;
use kube::api::{DynamicObject, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::policies::{NamespacePolicy, tenant};
use support::*;

const KEY: &str = "tekton-mutex.dev/key";
const TOKEN: &str = "tekton-mutex.dev/token";

/// A PipelineRun of `pipeline`, created Pending with `annotations`, and `spec` merged in.
fn queued_run(
    name: &str,
    pipeline: &str,
    annotations: &[(&str, &str)],
    spec: serde_json::Value,
) -> String {
    let annotations: serde_json::Map<String, serde_json::Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut pr = json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"status": "PipelineRunPending", "pipelineRef": {"name": pipeline}},
    });
    if let serde_json::Value::Object(extra) = spec {
        for (k, v) in extra {
            pr["spec"][k] = v;
        }
    }
    pr.to_string()
}

async fn pipeline_run_object(ns: &TestNamespace, name: &str) -> Result<DynamicObject> {
    Ok(ns
        .dynamic("tekton.dev/v1", "PipelineRun")
        .await?
        .get(name)
        .await?)
}

/// Waits until PipelineRun `name` carries annotation `annotation`; returns its value.
async fn wait_annotation(
    ns: &TestNamespace,
    name: &str,
    annotation: &str,
    timeout: Duration,
) -> Result<String> {
    wait_until(
        &format!("{name} to carry {annotation}"),
        timeout,
        || async {
            let pr = pipeline_run_object(ns, name).await?;
            Ok(pr.annotations().get(annotation).cloned())
        },
    )
    .await
}

/// The granted PipelineRun's token; checks that its `spec.status` was cleared (it started).
async fn wait_granted(ns: &TestNamespace, name: &str) -> Result<i64> {
    let token = wait_annotation(ns, name, TOKEN, slow()).await?;
    let pr = pipeline_run_object(ns, name).await?;
    ensure!(
        pr.data.pointer("/spec/status").is_none(),
        "{name} was granted but not started: {:?}",
        pr.data["spec"]
    );
    Ok(token.parse()?)
}

/// Asserts that PipelineRun `name` is still Pending: nothing of it has started.
async fn assert_still_pending(ns: &TestNamespace, name: &str) -> Result<()> {
    let pr = pipeline_run_object(ns, name).await?;
    ensure!(
        pr.data.pointer("/spec/status") == Some(&json!("PipelineRunPending")),
        "{name} left Pending: {:?}",
        pr.data["spec"]
    );
    let children = pr
        .data
        .pointer("/status/childReferences")
        .and_then(|c| c.as_array());
    ensure!(
        children.is_none_or(|c| c.is_empty()),
        "{name} started tasks: {children:?}"
    );
    Ok(())
}

/// The lock-task token of PipelineRun `pr`'s lock run.
async fn lock_token(ns: &TestNamespace, pr: &str) -> Result<i64> {
    result_of(ns, &lock_run(pr), "token")
        .await?
        .context("no token result")?
        .parse()
        .map_err(Into::into)
}

/// PipelineRun `name` of the lock-task pipeline, once it holds the key (its deploy waits for its gate).
async fn hold(ns: &TestNamespace, name: &str) -> Result<()> {
    ns.apply(&pipeline_run(name, "locked", &[])).await?;
    wait_reason(ns, &lock_run(name), "Acquired", slow()).await?;
    Ok(())
}

/// Waits until PipelineRun `name` has succeeded.
async fn succeeds(ns: &TestNamespace, name: &str) -> Result<()> {
    let done = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", name, slow())
        .await?;
    ensure!(done.status == "True", "{name} ended {done:?}");
    Ok(())
}

/// Waits until PipelineRun `name` has ended Cancelled.
async fn ends_cancelled(ns: &TestNamespace, name: &str) -> Result<()> {
    let done = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", name, slow())
        .await?;
    ensure!(
        done.status == "False" && done.reason == "Cancelled",
        "{name} ended {done:?}"
    );
    Ok(())
}

async fn setup(prefix: &str) -> Result<(TestNamespace, ControllerProcess)> {
    let ns = TestNamespace::create(prefix).await?;
    let controller = ControllerProcess::start(ns.name()).await?;
    ns.apply(&gated_pipeline("gated")).await?;
    let o = Opts {
        lock_params: &[("key", "env")],
        ..Opts::default()
    };
    ns.apply(&pipeline("locked", &o)).await?;
    Ok((ns, controller))
}

/// A queued PipelineRun and a lock-task PipelineRun on one key exclude each other, whichever
/// holds first; the tokens go up across both kinds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_queued_pipeline_run_and_a_lock_task_exclude_each_other_in_both_orders() -> Result<()> {
    let (ns, _c) = setup("queued-both").await?;
    // The queued one holds first: the lock task waits.
    ns.apply(&queued_run("q1", "gated", &[(KEY, "env")], json!({})))
        .await?;
    let t1 = wait_granted(&ns, "q1").await?;
    ns.apply(&pipeline_run("l1", "locked", &[])).await?;
    wait_reason(&ns, &lock_run("l1"), "Waiting", slow()).await?;
    release(&ns, "q1").await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "q1", slow())
        .await?;
    wait_reason(&ns, &lock_run("l1"), "Acquired", slow()).await?;
    let t2 = lock_token(&ns, "l1").await?;
    // The lock task holds: the queued one stays Pending, told where it is, until it is released.
    ns.apply(&queued_run("q2", "gated", &[(KEY, "env")], json!({})))
        .await?;
    let waiting = wait_annotation(&ns, "q2", "tekton-mutex.dev/waiting", slow()).await?;
    ensure!(
        waiting.contains("next in line") && waiting.contains("l1"),
        "q2 is told {waiting:?}"
    );
    assert_still_pending(&ns, "q2").await?;
    release(&ns, "l1").await?;
    let t3 = wait_granted(&ns, "q2").await?;
    ensure!(t1 < t2 && t2 < t3, "tokens did not go up: {t1}, {t2}, {t3}");
    release(&ns, "q2").await?;
    succeeds(&ns, "q2").await?;
    Ok(())
}

/// A queued PipelineRun's wait does not count against its own timeout: Tekton starts the
/// clock only when it starts. It waits longer than `timeouts.pipeline` and still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_wait_longer_than_the_pipeline_timeout_does_not_time_it_out() -> Result<()> {
    let (ns, _c) = setup("queued-timeout").await?;
    hold(&ns, "holder").await?;
    let limit = 10;
    let spec = json!({"timeouts": {"pipeline": format!("{limit}s")}});
    ns.apply(&queued_run("q", "gated", &[(KEY, "env")], spec))
        .await?;
    create_gate(&ns, "release-q").await?; // once started, q finishes at once
    let created = pipeline_run_object(&ns, "q")
        .await?
        .creation_timestamp()
        .context("created")?
        .0;
    // The condition is the elapsed time itself: q has waited longer than its timeout.
    wait_until(
        "q to wait longer than its timeout",
        secs(limit * 4),
        || async {
            let waited = jiff::Timestamp::now().duration_since(created).as_secs();
            Ok((waited > limit as i64 + 5).then_some(()))
        },
    )
    .await?;
    assert_still_pending(&ns, "q").await?;
    release(&ns, "holder").await?;
    wait_granted(&ns, "q").await?;
    succeeds(&ns, "q").await?;
    Ok(())
}

/// `tekton-mutex.dev/queue-timeout` cancels a PipelineRun still queued after that long: it ends
/// Cancelled, never started, with reason QueueTimeout in an annotation and an Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn queue_timeout_cancels_a_pipeline_run_still_queued() -> Result<()> {
    let (ns, _c) = setup("queue-timeout").await?;
    hold(&ns, "holder").await?;
    let annotations = [(KEY, "env"), ("tekton-mutex.dev/queue-timeout", "3s")];
    ns.apply(&queued_run("q", "gated", &annotations, json!({})))
        .await?;
    ends_cancelled(&ns, "q").await?;
    let pr = pipeline_run_object(&ns, "q").await?;
    let reason = pr
        .annotations()
        .get("tekton-mutex.dev/cancel-reason")
        .cloned();
    ensure!(
        reason.as_deref() == Some("QueueTimeout"),
        "cancel reason {reason:?}"
    );
    ensure!(!pr.annotations().contains_key(TOKEN), "q was granted");
    let children = pr
        .data
        .pointer("/status/childReferences")
        .and_then(|c| c.as_array());
    ensure!(
        children.is_none_or(|c| c.is_empty()),
        "q started tasks: {children:?}"
    );
    wait_event(&ns, "q", "QueueTimeout").await?;
    release(&ns, "holder").await
}

/// An Event of `reason` on PipelineRun `name`.
async fn wait_event(ns: &TestNamespace, name: &str, reason: &str) -> Result<()> {
    wait_until(&format!("a {reason} Event on {name}"), secs(30), || async {
        let selector =
            format!("reason={reason},involvedObject.name={name},involvedObject.kind=PipelineRun");
        let events = ns.kubectl(&["get", "events", "--field-selector", &selector, "-o", "name"])?;
        Ok((!events.trim().is_empty()).then_some(()))
    })
    .await
}

/// A bad annotation leaves the PipelineRun Pending with an error that names the annotation and
/// what it allows; fixed, it is queued and runs. A key annotation on a PipelineRun that was not
/// created Pending is reported, and the PipelineRun is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_bad_annotation_leaves_the_pipeline_run_pending_with_a_clear_error() -> Result<()> {
    let (ns, _c) = setup("queued-bad").await?;
    let bad = [(KEY, "env"), ("tekton-mutex.dev/priority", "high")];
    ns.apply(&queued_run("q", "gated", &bad, json!({}))).await?;
    let error = wait_annotation(&ns, "q", "tekton-mutex.dev/error", slow()).await?;
    ensure!(
        error.contains("annotation tekton-mutex.dev/priority"),
        "the error is {error:?}"
    );
    wait_event(&ns, "q", "InvalidParams").await?;
    assert_still_pending(&ns, "q").await?;
    let fix = json!({"metadata": {"annotations": {"tekton-mutex.dev/priority": "5"}}});
    ns.api::<tekton_mutex::model::tekton::pipelinerun::PipelineRun>()
        .patch("q", &PatchParams::default(), &Patch::Merge(&fix))
        .await?;
    create_gate(&ns, "release-q").await?;
    wait_granted(&ns, "q").await?;
    succeeds(&ns, "q").await?;
    let pr = pipeline_run_object(&ns, "q").await?;
    ensure!(
        !pr.annotations().contains_key("tekton-mutex.dev/error"),
        "the fixed error stayed"
    );
    // Not created Pending: Tekton started it at once; the lock can only say so.
    let started = json!({"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": "s", "annotations": {KEY: "env"}},
        "spec": {"pipelineRef": {"name": "gated"}}});
    ns.apply(&started.to_string()).await?;
    let error = wait_annotation(&ns, "s", "tekton-mutex.dev/error", slow()).await?;
    ensure!(
        error.contains("PipelineRunPending"),
        "the error is {error:?}"
    );
    wait_event(&ns, "s", "NotQueued").await?;
    release(&ns, "s").await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "s", slow())
        .await?;
    let pr = pipeline_run_object(&ns, "s").await?;
    ensure!(
        !pr.annotations().contains_key(TOKEN),
        "s was granted as if queued"
    );
    Ok(())
}

/// A controller restart mid-queue loses nothing: the holder keeps the key, and the queued
/// PipelineRuns are granted one at a time after it, with tokens that go up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_controller_restart_mid_queue_loses_nothing() -> Result<()> {
    let (ns, mut controller) = setup("queued-restart").await?;
    let names = ["q1", "q2", "q3"];
    for name in names {
        // Groups of their own: none supersedes another.
        let annotations = [(KEY, "env"), ("tekton-mutex.dev/group", name)];
        ns.apply(&queued_run(name, "gated", &annotations, json!({})))
            .await?;
        if name == "q1" {
            wait_granted(&ns, name).await?;
        }
    }
    for name in &names[1..] {
        wait_annotation(&ns, name, "tekton-mutex.dev/waiting", slow()).await?;
    }
    controller.kill();
    let _restarted = ControllerProcess::start(ns.name()).await?;
    let mut tokens = Vec::new();
    let mut left: Vec<&str> = names.to_vec();
    while !left.is_empty() {
        let granted = wait_until("the next grant", slow(), || async {
            for name in &left {
                let pr = pipeline_run_object(&ns, name).await?;
                if let Some(t) = pr.annotations().get(TOKEN) {
                    return Ok(Some((name.to_string(), t.parse::<i64>()?)));
                }
            }
            Ok(None)
        })
        .await?;
        for other in left.iter().filter(|n| **n != granted.0) {
            assert_still_pending(&ns, other).await?;
        }
        release(&ns, &granted.0).await?;
        ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", &granted.0, slow())
            .await?;
        left.retain(|n| *n != granted.0);
        tokens.push(granted.1);
    }
    ensure!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens did not go up: {tokens:?}"
    );
    Ok(())
}

/// A queued PipelineRun whose pipeline also has a lock task on its key: the lock task passes
/// at once, with the PipelineRun's own token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_lock_task_inside_a_queued_pipeline_run_re_enters_with_its_token() -> Result<()> {
    let (ns, _c) = setup("queued-reenter").await?;
    ns.apply(&queued_run("q", "locked", &[(KEY, "env")], json!({})))
        .await?;
    let token = wait_granted(&ns, "q").await?;
    wait_reason(&ns, &lock_run("q"), "Acquired", slow()).await?;
    let inner = lock_token(&ns, "q").await?;
    ensure!(
        inner == token,
        "the lock task got token {inner}, the PipelineRun {token}"
    );
    let holders = mutex_status(&ns, "env").await?.holders;
    ensure!(holders.len() == 1, "one hold, not two: {holders:?}");
    // Tekton copies the PipelineRun's annotations to its TaskRuns (and their pods): where a
    // step reads the token (the README's `fieldRef`).
    let task_runs = ns.dynamic("tekton.dev/v1", "TaskRun").await?;
    let copied = wait_until("q's deploy TaskRun", slow(), || async {
        Ok(task_runs
            .get_opt("q-deploy")
            .await?
            .map(|t| t.annotations().get(TOKEN).cloned()))
    })
    .await?;
    ensure!(
        copied == Some(token.to_string()),
        "the deploy TaskRun carries token {copied:?}"
    );
    release(&ns, "q").await?;
    succeeds(&ns, "q").await?;
    Ok(())
}

/// Queue control covers queued PipelineRuns: `tkn mutex clear` lets a waiting one go, and it
/// ends Cancelled without ever starting, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn clear_lets_a_queued_pipeline_run_go_without_starting_it() -> Result<()> {
    let (ns, _c) = setup("queued-clear").await?;
    hold(&ns, "holder").await?;
    ns.apply(&queued_run("q", "gated", &[(KEY, "env")], json!({})))
        .await?;
    wait_annotation(&ns, "q", "tekton-mutex.dev/waiting", slow()).await?;
    let out =
        support::cli::tkn_mutex(&["clear", "env", "--reason", "bad release", "-n", ns.name()])?;
    ensure!(out.ok(), "{out:?}");
    ends_cancelled(&ns, "q").await?;
    // The clear's cancel of the PipelineRun may land before the lock tells it why.
    let reason = wait_annotation(&ns, "q", "tekton-mutex.dev/cancel-reason", slow()).await?;
    ensure!(reason == "Cleared", "cancel reason {reason:?}");
    let pr = pipeline_run_object(&ns, "q").await?;
    let children = pr
        .data
        .pointer("/status/childReferences")
        .and_then(|c| c.as_array());
    ensure!(
        children.is_none_or(|c| c.is_empty()),
        "q started tasks: {children:?}"
    );
    release(&ns, "holder").await
}

// ---- Issue 37: nothing a tenant writes on its PipelineRuns grants, wedges or lowers a lock ----

const RECORD: &str = "tekton-mutex.dev/lock-record";
const ERROR: &str = "tekton-mutex.dev/error";
const WAITING: &str = "tekton-mutex.dev/waiting";

/// A copy of PipelineRun `of` as Tekton Dashboard's "Rerun" or `kubectl get -o yaml`, rename,
/// create make it: every annotation kept (the lock's record and token too), `spec.status`
/// dropped unless `pending`.
async fn copy_of(ns: &TestNamespace, of: &str, name: &str, pending: bool) -> Result<()> {
    let original = pipeline_run_object(ns, of).await?;
    let mut spec = original.data["spec"].clone();
    let fields = spec.as_object_mut().context("spec is an object")?;
    fields.remove("status");
    if pending {
        fields.insert("status".into(), json!("PipelineRunPending"));
    }
    let copy = json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "annotations": original.annotations()},
        "spec": spec,
    });
    ns.apply(&copy.to_string()).await?;
    Ok(())
}

/// Mutex `key`'s holders (by run name) and last token.
async fn lock_state(ns: &TestNamespace, key: &str) -> Result<(Vec<String>, i64)> {
    let m = ns
        .api::<tekton_mutex::model::mutex::Mutex>()
        .get(key)
        .await?;
    let st = m.status.unwrap_or_default();
    let holders = st.holders.iter().map(|h| h.run.name.clone()).collect();
    Ok((holders, st.last_token))
}

/// Item 1: a Rerun copy of a granted queued PipelineRun carries its record and token, and is
/// not Pending. It is a new member: never a second holder, and it is told it runs unguarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_rerun_copy_of_a_granted_queued_run_is_no_second_holder() -> Result<()> {
    let (ns, _c) = setup("queued-rerun").await?;
    ns.apply(&queued_run("q1", "gated", &[(KEY, "env")], json!({})))
        .await?;
    let t1 = wait_granted(&ns, "q1").await?;
    copy_of(&ns, "q1", "q1-rerun", false).await?;
    let error = wait_annotation(&ns, "q1-rerun", ERROR, slow()).await?;
    ensure!(
        error.contains("PipelineRunPending"),
        "the copy is told it runs unguarded: {error:?}"
    );
    let (holders, last) = lock_state(&ns, "env").await?;
    ensure!(
        holders == ["q1"] && last == t1,
        "the copy became a holder: {holders:?}, lastToken {last} (q1 has {t1})"
    );
    release(&ns, "q1").await?;
    release(&ns, "q1-rerun").await?;
    succeeds(&ns, "q1").await?;
    Ok(())
}

/// Items 2 and 3: the same copy queued Pending (as the README says to queue a run) is a new
/// member: it waits behind the original, then is granted a higher token; its copied record
/// neither holds the key for it nor ends its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_copy_queued_pending_waits_its_turn_as_a_new_member() -> Result<()> {
    let (ns, _c) = setup("queued-copy").await?;
    ns.apply(&queued_run("q1", "gated", &[(KEY, "env")], json!({})))
        .await?;
    let t1 = wait_granted(&ns, "q1").await?;
    copy_of(&ns, "q1", "q1-again", true).await?;
    wait_until("the copy to wait behind q1", slow(), || async {
        let pr = pipeline_run_object(&ns, "q1-again").await?;
        let waiting = pr.annotations().get(WAITING).cloned().unwrap_or_default();
        Ok(waiting.contains("q1").then_some(()))
    })
    .await?;
    assert_still_pending(&ns, "q1-again").await?;
    let (holders, _) = lock_state(&ns, "env").await?;
    ensure!(holders == ["q1"], "holders: {holders:?}");
    release(&ns, "q1").await?;
    succeeds(&ns, "q1").await?;
    // The copy carries q1's token annotation from the start: wait for its own grant.
    let t2 = wait_until("the copy's own grant", slow(), || async {
        let pr = pipeline_run_object(&ns, "q1-again").await?;
        let token: Option<i64> = pr.annotations().get(TOKEN).and_then(|t| t.parse().ok());
        let started = pr.data.pointer("/spec/status").is_none();
        Ok(token.filter(|t| *t != t1 && started))
    })
    .await?;
    ensure!(t2 > t1, "the copy's token {t2} is above q1's {t1}");
    release(&ns, "q1-again").await?;
    succeeds(&ns, "q1-again").await?;
    Ok(())
}

/// Item 4: a tenant writes, on its own queued PipelineRun, a record bound to its uid that
/// claims `Acquired` with the largest token. The lock's status does not list it: it holds
/// nothing, `lastToken` does not move, and the next run is granted the next token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_record_the_tenant_writes_grants_nothing_and_raises_no_token() -> Result<()> {
    let (ns, _c) = setup("queued-forged").await?;
    // No supersede: runs created within one second are ordered by name.
    let lock = [(KEY, "env"), ("tekton-mutex.dev/supersede", "none")];
    ns.apply(&queued_run("q1", "gated", &lock, json!({})))
        .await?;
    let t1 = wait_granted(&ns, "q1").await?;
    ns.apply(&queued_run("forger", "gated", &lock, json!({})))
        .await?;
    wait_annotation(&ns, "forger", WAITING, slow()).await?;
    let uid = pipeline_run_object(&ns, "forger")
        .await?
        .uid()
        .context("uid")?;
    let forged = json!({
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
        "results": [{"name": "token", "value": tekton_mutex::model::mutex::MAX_TOKEN.to_string()}],
        "extraFields": {"key": "env", "lockKind": "Mutex", "member": uid},
    });
    let patch = json!({"metadata": {"annotations": {RECORD: forged.to_string()}}});
    ns.dynamic("tekton.dev/v1", "PipelineRun")
        .await?
        .patch("forger", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    ns.apply(&queued_run("q2", "gated", &lock, json!({})))
        .await?;
    wait_annotation(&ns, "q2", WAITING, slow()).await?;
    release(&ns, "q1").await?;
    succeeds(&ns, "q1").await?;
    let t2 = wait_granted(&ns, "q2").await?;
    // The next token: above q1's, and no higher than the clock makes it (never the forged one).
    let ceiling = tekton_mutex::model::mutex::clock_floor(jiff::Timestamp::now()).max(t1 + 1);
    ensure!(
        t2 > t1 && t2 <= ceiling,
        "q2 got token {t2} after q1's {t1} (at most {ceiling})"
    );
    let (holders, last) = lock_state(&ns, "env").await?;
    ensure!(
        holders == ["q2"] && last == t2,
        "holders {holders:?}, lastToken {last}"
    );
    assert_still_pending(&ns, "forger").await?;
    release(&ns, "q2").await?;
    succeeds(&ns, "q2").await?;
    Ok(())
}

/// Item 13: a queued PipelineRun older than the group's newest grant is superseded on
/// arrival: it is cancelled unstarted, says why in `cancel-reason`, and is not told it was
/// started unguarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_queued_run_superseded_on_arrival_says_so_and_no_false_error() -> Result<()> {
    let (ns, _c) = setup("queued-stale").await?;
    let build = |n: &'static str| [(KEY, "env"), ("tekton-mutex.dev/sequence", n)];
    ns.apply(&queued_run("v2", "gated", &build("2"), json!({})))
        .await?;
    wait_granted(&ns, "v2").await?;
    ns.apply(&queued_run("v1", "gated", &build("1"), json!({})))
        .await?;
    let reason = wait_annotation(&ns, "v1", "tekton-mutex.dev/cancel-reason", slow()).await?;
    ensure!(reason == "Superseded", "cancel-reason {reason:?}");
    ends_cancelled(&ns, "v1").await?;
    let pr = pipeline_run_object(&ns, "v1").await?;
    ensure!(
        !pr.annotations().contains_key(ERROR),
        "a false error: {:?}",
        pr.annotations().get(ERROR)
    );
    release(&ns, "v2").await?;
    succeeds(&ns, "v2").await?;
    Ok(())
}

/// Item 9: PipelineRuns of one remote Pipeline (a git resolver ref, no Pipeline name) are one
/// supersede group whatever revision they build: an older build queued after a newer one
/// holds is superseded on arrival, not granted after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn queued_runs_of_one_remote_pipeline_supersede_each_other() -> Result<()> {
    let (ns, _c) = setup("queued-resolver").await?;
    let build = |name: &str, sequence: &str, revision: &str| {
        json!({
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": name, "annotations": {KEY: "env", "tekton-mutex.dev/sequence": sequence}},
            "spec": {"status": "PipelineRunPending", "pipelineRef": {"resolver": "git", "params": [
                {"name": "url", "value": "https://example.invalid/org/environments.git"},
                {"name": "revision", "value": revision},
                {"name": "pathInRepo", "value": "pipelines/promote.yaml"},
            ]}},
        })
        .to_string()
    };
    ns.apply(&build("build-62", "62", "b62")).await?;
    wait_granted(&ns, "build-62").await?;
    ns.apply(&build("build-61", "61", "b61")).await?;
    let reason = wait_annotation(&ns, "build-61", "tekton-mutex.dev/cancel-reason", slow()).await?;
    ensure!(
        reason == "Superseded",
        "build-61's cancel-reason is {reason:?}"
    );
    let by = wait_annotation(&ns, "build-61", "tekton-mutex.dev/superseded-by", slow()).await?;
    ensure!(by == "build-62", "superseded by {by:?}");
    Ok(())
}

/// A queued PipelineRun's grant is recorded only in the lock's status (its own annotations are
/// its author's to write). A wiped status loses that hold (README Limits), but never its
/// token: the token is in the ledger before the grant, and the next run is granted above it
/// (chaos seed 206601710 handed q1's token out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_wiped_status_never_hands_a_queued_runs_token_out_again() -> Result<()> {
    let (ns, _c) = setup("queued-wipe").await?;
    let lock = [(KEY, "env"), ("tekton-mutex.dev/supersede", "none")];
    ns.apply(&queued_run("q1", "gated", &lock, json!({})))
        .await?;
    let t1 = wait_granted(&ns, "q1").await?;
    ns.wipe_status("mutex/env")?;
    ns.apply(&queued_run("q2", "gated", &lock, json!({})))
        .await?;
    let t2 = wait_granted(&ns, "q2").await?;
    ensure!(t2 > t1, "q2 was granted token {t2}, not above q1's {t1}");
    let (_, last) = lock_state(&ns, "env").await?;
    ensure!(last == t2, "lastToken {last}, q2 has {t2}");
    for pr in ["q1", "q2"] {
        release(&ns, pr).await?;
        succeeds(&ns, pr).await?;
    }
    Ok(())
}

/// Only the grant starts a queued PipelineRun (issue 46, item 1): with the cluster install's
/// admission policy, its author can neither clear its `spec.status` nor take its key annotation
/// off while it waits, and it is refused with a message that says how to stop waiting; cancelling
/// it stays allowed, and the grant still starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn an_author_cannot_start_its_own_queued_pipeline_run() -> Result<()> {
    let (ns, _c) = setup("queued-author").await?;
    let policy = "401-admission-only-a-grant-starts.yaml";
    let _policy = NamespacePolicy::install(&ns, policy).await?;
    let as_tenant = tenant(
        &ns,
        "pipelineruns.tekton.dev",
        "get,list,watch,patch,update",
    )?;
    hold(&ns, "holder").await?;
    let lock = [(KEY, "env"), ("tekton-mutex.dev/supersede", "none")];
    for name in ["v2", "v3"] {
        ns.apply(&queued_run(name, "gated", &lock, json!({})))
            .await?;
        wait_annotation(&ns, name, "tekton-mutex.dev/waiting", slow()).await?;
    }
    let start = |extra: &[&str]| {
        let mut args = vec![
            "patch",
            "pipelinerun",
            "v2",
            "--type=merge",
            "-p",
            r#"{"spec":{"status":null}}"#,
        ];
        args.extend_from_slice(extra);
        as_tenant(&args)
    };
    let refused = |r: Result<String>, what: &str| match r {
        Err(e) if e.to_string().contains(what) => Ok(Some(())),
        Err(e) => Err(e),
        Ok(_) => Ok(None),
    };
    wait_until("the admission policy to take effect", slow(), || async {
        refused(start(&["--dry-run=server"]), "only its grant starts it")
    })
    .await?;
    ensure!(
        refused(start(&[]), "waits for its turn on key env")?.is_some(),
        "v2 was started"
    );
    let unkeyed = as_tenant(&["annotate", "pipelinerun", "v2", &format!("{KEY}-")]);
    ensure!(
        refused(unkeyed, "cannot change while it waits")?.is_some(),
        "the key came off v2"
    );
    assert_still_pending(&ns, "v2").await?;
    as_tenant(&[
        "patch",
        "pipelinerun",
        "v3",
        "--type=merge",
        "-p",
        r#"{"spec":{"status":"Cancelled"}}"#,
    ])?;
    ends_cancelled(&ns, "v3").await?;
    release(&ns, "holder").await?;
    wait_granted(&ns, "v2").await?;
    release(&ns, "v2").await?;
    succeeds(&ns, "v2").await?;
    Ok(())
}

/// Only the grant starts a queued PipelineRun, on any install (issue 46, item 1): without the
/// cluster install's admission policy (a namespaced install), an author who clears the
/// `spec.status` of its waiting PipelineRun gets no place in the lock: the controller cancels
/// it (a Warning StartedWithoutGrant naming the key), it never holds, and the
/// slot goes to the run behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_queued_pipeline_run_its_author_starts_is_cancelled_and_never_holds() -> Result<()> {
    let (ns, _c) = setup("queued-intruder").await?;
    hold(&ns, "holder").await?;
    let lock = [(KEY, "env"), ("tekton-mutex.dev/supersede", "none")];
    for name in ["v2", "v3"] {
        ns.apply(&queued_run(name, "gated", &lock, json!({})))
            .await?;
        wait_annotation(&ns, name, WAITING, slow()).await?;
    }
    ns.kubectl(&[
        "patch",
        "pipelinerun",
        "v2",
        "--type=merge",
        "-p",
        r#"{"spec":{"status":null}}"#,
    ])?;
    ends_cancelled(&ns, "v2").await?;
    // Said by the Warning. (The cancel-reason annotation says it too, unless Tekton's first
    // reconcile of the started run wrote its own older copy of the annotations back over it.)
    wait_event(&ns, "v2", "StartedWithoutGrant").await?;
    let (holders, _) = lock_state(&ns, "env").await?;
    ensure!(
        holders.len() == 1 && holders[0] != "v2",
        "holders {holders:?}"
    );
    release(&ns, "holder").await?;
    wait_granted(&ns, "v3").await?;
    let v2 = pipeline_run_object(&ns, "v2").await?;
    ensure!(
        !v2.annotations().contains_key("tekton-mutex.dev/token"),
        "v2 was granted"
    );
    release(&ns, "v3").await?;
    succeeds(&ns, "v3").await?;
    Ok(())
}

/// A grant that can never be delivered is taken back (issue 49, item 2): an admission policy
/// refuses to start PipelineRun v2. When the holder ends, v2 is granted, the grant's patch is
/// refused, and the lock takes the slot back: v2 is cancelled, never started, and v3 holds
/// with a higher token than any handed out before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_grant_the_api_refuses_to_deliver_is_taken_back() -> Result<()> {
    let (ns, _c) = setup("queued-undelivered").await?;
    let policy = r#"
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: refuse-to-start-v2}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - {apiGroups: [tekton.dev], apiVersions: ["*"], operations: [UPDATE], resources: [pipelineruns]}
  validations:
    - expression: "object.metadata.name != 'v2' || has(object.spec.status)"
      message: "v2 may not start"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: refuse-to-start-v2}
spec:
  policyName: refuse-to-start-v2
  validationActions: [Deny]
"#;
    let _policy = NamespacePolicy::install_yaml(&ns, policy).await?;
    let lock = [(KEY, "env"), ("tekton-mutex.dev/supersede", "none")];
    ns.apply(&queued_run("v1", "gated", &lock, json!({})))
        .await?;
    let t1 = wait_granted(&ns, "v1").await?;
    for name in ["v2", "v3"] {
        ns.apply(&queued_run(name, "gated", &lock, json!({})))
            .await?;
        wait_annotation(&ns, name, WAITING, slow()).await?;
    }
    wait_until("the policy to refuse starting v2", slow(), || async {
        let start = ns.kubectl(&[
            "patch",
            "pipelinerun",
            "v2",
            "--type=merge",
            "--dry-run=server",
            "-p",
            r#"{"spec":{"status":null}}"#,
        ]);
        Ok(start
            .err()
            .filter(|e| e.to_string().contains("v2 may not start"))
            .map(|_| ()))
    })
    .await?;
    release(&ns, "v1").await?;
    succeeds(&ns, "v1").await?;
    let t3 = wait_granted(&ns, "v3").await?;
    ensure!(
        t3 > t1 + 1,
        "v3's token {t3} after v1's {t1}: v2's revoked grant took one"
    );
    ends_cancelled(&ns, "v2").await?;
    let v2 = pipeline_run_object(&ns, "v2").await?;
    ensure!(
        !v2.annotations().contains_key("tekton-mutex.dev/token"),
        "v2 was told a grant"
    );
    release(&ns, "v3").await?;
    succeeds(&ns, "v3").await?;
    Ok(())
}
