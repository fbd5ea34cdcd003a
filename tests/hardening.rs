//! No way around the lock (issue 23): ordinary user actions that used to get
//! around exclusion, on the local control plane with the real Tekton controller.

mod support;

use anyhow::{Context, Result, ensure};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::*;
use tekton_mutex::model::tekton::customrun::CustomRun;

/// Item 1: two lock tasks of one PipelineRun on one key, the second with
/// `release-after` a quick task. Once that task is over, the key still holds
/// for the first lock task's deploy: the next PipelineRun waits until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_release_after_sibling_keeps_the_hold_while_the_other_lock_task_deploys() -> Result<()> {
    let ns = TestNamespace::create("sibling").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let o = Opts {
        lock_params: &[("key", "staging")],
        ..Opts::default()
    };
    ns.apply(&two_lock_tasks(&pipeline("deploy-staging", &o))?)
        .await?;
    ns.apply(&pipeline_run("a", "deploy-staging", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    wait_reason(&ns, "a-lock-early", "Acquired", slow()).await?;
    let task_runs = dynamic_api(&ns.client(), Some(ns.name()), "tekton.dev/v1", "TaskRun").await?;
    wait_until("a's quick task to succeed", slow(), || async {
        let tr = task_runs.get_opt("a-quick").await?;
        let ok = tr.and_then(|t| t.data.pointer("/status/conditions/0/status").cloned());
        Ok((ok == Some(json!("True"))).then_some(()))
    })
    .await?;
    // b arrives after a's release-after section is over: it waits for a's deploy.
    ns.apply(&pipeline_run("b", "deploy-staging", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    let holders: Vec<String> = mutex_status(&ns, "staging")
        .await?
        .holders
        .iter()
        .filter_map(|h| h.pipeline_run.clone())
        .collect();
    ensure!(
        holders == ["a"],
        "staging let a go while it deploys: {holders:?}"
    );
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    release(&ns, "b").await
}

/// `pipeline`'s Pipeline with a second lock task on the lock's key (`lock-early`, with
/// `release-after: quick`) and a quick task after it; the deploy runs after both.
fn two_lock_tasks(pipeline_json: &str) -> Result<String> {
    let mut p: serde_json::Value = serde_json::from_str(pipeline_json)?;
    let tasks = p["spec"]["tasks"].as_array_mut().context("tasks")?;
    let mut early = tasks[0].clone();
    early["name"] = json!("lock-early");
    early["params"]
        .as_array_mut()
        .context("lock params")?
        .push(json!({"name": "release-after", "value": "quick"}));
    let quick = json!({
        "name": "quick",
        "runAfter": ["lock-early"],
        "taskSpec": {"steps": [{"name": "quick", "image": "busybox", "script": "true"}]},
    });
    tasks[1]["runAfter"] = json!(["lock", "quick"]);
    tasks.extend([early, quick]);
    Ok(p.to_string())
}

/// Item 2, for a waiting run: re-pointed at another key while it waits, it fails
/// `InvalidParams` naming both keys, leaves the first key's queue, and is never
/// granted by the second (before, the second key granted it beside its holder's
/// PipelineRun's deploy: seen in the chaos campaign's `repoint` fault).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_waiting_run_repointed_at_another_key_fails_invalid_params() -> Result<()> {
    let ns = TestNamespace::create("repoint-waiting").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    for key in ["prod", "staging"] {
        let o = Opts {
            lock_params: &[("key", key)],
            ..Opts::default()
        };
        ns.apply(&pipeline(&format!("deploy-{key}"), &o)).await?;
    }
    ns.apply(&pipeline_run("a", "deploy-prod", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy-prod", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;

    // The user re-points b's waiting lock run at staging, which is free.
    let run = ns.api::<CustomRun>().get(&lock_run("b")).await?;
    let mut params = serde_json::to_value(&run.spec.params)?;
    for p in params.as_array_mut().into_iter().flatten() {
        if p["name"] == "key" {
            p["value"] = json!("staging");
        }
    }
    let patch = json!({"spec": {"params": params}});
    ns.api::<CustomRun>()
        .patch(
            &lock_run("b"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    let failed = wait_reason(&ns, &lock_run("b"), "InvalidParams", slow()).await?;
    let message = failed.message.unwrap_or_default();
    ensure!(
        message.contains("\"prod\"") && message.contains("\"staging\""),
        "the refusal names neither key: {message}"
    );
    let staging = mutex_status(&ns, "staging").await.unwrap_or_default();
    ensure!(
        staging.holders.is_empty(),
        "staging granted the re-pointed run: {:?}",
        staging.holders
    );
    // a ends: prod drops b at its next sync, and grants nobody.
    release(&ns, "a").await?;
    wait_until("prod to be idle", slow(), || async {
        let prod = mutex_status(&ns, "prod").await?;
        Ok((prod.holders.is_empty() && prod.queue.is_empty()).then_some(()))
    })
    .await?;
    wait_reason(&ns, &lock_run("b"), "InvalidParams", slow()).await?;
    Ok(())
}

/// Item 2: a held lock run whose `key` param is patched to another key keeps its
/// hold on the first key (its PipelineRun still runs), and the second key never
/// adopts it: each key has at most its capacity of holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_granted_run_repointed_at_another_key_is_never_adopted() -> Result<()> {
    let ns = TestNamespace::create("repoint").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    for key in ["prod", "staging"] {
        let o = Opts {
            lock_params: &[("key", key)],
            ..Opts::default()
        };
        ns.apply(&pipeline(&format!("deploy-{key}"), &o)).await?;
    }
    ns.apply(&pipeline_run("a", "deploy-prod", &[])).await?;
    ns.apply(&pipeline_run("b", "deploy-staging", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;

    // The user re-points a's granted lock run at staging, which b holds.
    let patch = json!({"spec": {"params": [{"name": "key", "value": "staging"}]}});
    ns.api::<CustomRun>()
        .patch(
            &lock_run("a"),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    // A newcomer on each key: once it is told it waits, its key has synced since the patch.
    ns.apply(&pipeline_run("c", "deploy-staging", &[])).await?;
    ns.apply(&pipeline_run("d", "deploy-prod", &[])).await?;
    wait_reason(&ns, &lock_run("c"), "Waiting", slow()).await?;
    wait_reason(&ns, &lock_run("d"), "Waiting", slow()).await?;

    let holders = |st: tekton_mutex::model::mutex::MutexStatus| -> Vec<String> {
        st.holders
            .iter()
            .filter_map(|h| h.pipeline_run.clone())
            .collect()
    };
    let staging = holders(mutex_status(&ns, "staging").await?);
    ensure!(
        staging == ["b"],
        "staging adopted the re-pointed run: {staging:?}"
    );
    let prod = holders(mutex_status(&ns, "prod").await?);
    ensure!(
        prod == ["a"],
        "prod let a go while its deploy runs: {prod:?}"
    );

    // a ends: prod goes to d; b ends: staging goes to c.
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("d"), "Acquired", slow()).await?;
    release(&ns, "b").await?;
    wait_reason(&ns, &lock_run("c"), "Acquired", slow()).await?;
    for pr in ["c", "d"] {
        release(&ns, pr).await?;
    }
    Ok(())
}
