//! No way around the lock (issue 23): ordinary user actions that used to get
//! around exclusion, on the local control plane with the real Tekton controller.

mod support;

use anyhow::{Context, Result, ensure};
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::timeline::Timeline;
use support::*;
use tekton_mutex::model::mutex::Mutex;
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

/// Item 3: a key read from a task result written with `echo` is `"staging\n"`. It names the
/// same Mutex as `staging` typed by hand, so a PipelineRun of each spelling waits for the other
/// (before, each had its own Mutex and both deployed at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_key_echoed_into_a_task_result_names_the_same_mutex_as_the_typed_key() -> Result<()> {
    let ns = TestNamespace::create("echoed-key").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    let typed = Opts {
        lock_params: &[("key", "staging")],
        ..Opts::default()
    };
    ns.apply(&pipeline("typed", &typed)).await?;
    let echoed = Opts {
        lock_params: &[("key", "$(tasks.name.results.key)")],
        ..Opts::default()
    };
    ns.apply(&key_echoed_by_a_task(
        &pipeline("echoed", &echoed),
        "staging",
    )?)
    .await?;
    ns.apply(&pipeline_run("a", "typed", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "echoed", &[])).await?;
    let told = wait_told(&ns, &lock_run("b"), slow()).await?;
    ensure!(
        told.reason.as_deref() == Some("Waiting"),
        "the echoed key did not wait for the typed one's holder: {told:?}"
    );
    let mutexes: Vec<String> = ns
        .api::<Mutex>()
        .list(&Default::default())
        .await?
        .iter()
        .map(|m| m.name_any())
        .collect();
    ensure!(
        mutexes == ["staging"],
        "two spellings, two locks: {mutexes:?}"
    );
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    release(&ns, "b").await?;
    for pr in ["a", "b"] {
        succeeded(&ns, pr).await?;
    }
    timeline.check_exclusion(1)?;
    Ok(())
}

/// `pipeline_json`'s Pipeline with a first task `name` that writes `key` with `echo` (and so
/// a trailing newline) into its result `key`, which the lock task reads.
fn key_echoed_by_a_task(pipeline_json: &str, key: &str) -> Result<String> {
    let mut p: serde_json::Value = serde_json::from_str(pipeline_json)?;
    let tasks = p["spec"]["tasks"].as_array_mut().context("tasks")?;
    tasks.insert(
        0,
        json!({
            "name": "name",
            "taskSpec": {
                "results": [{"name": "key"}],
                "steps": [{"name": "echo", "image": "busybox",
                           "script": format!("echo {key} > $(results.key.path)")}],
            },
        }),
    );
    Ok(p.to_string())
}

/// Item 4: runs of `a,b` and of `b,a` wait behind a holder of each key; one key is turned
/// `newest-first` while they wait; both keys go free. Every key ranks runs of several keys in
/// one order, so the same run gets both and the other follows (before, `a` kept its slot for
/// one run and `b` for the other, and neither could ever commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn an_order_change_while_runs_of_two_keys_wait_cannot_deadlock_them() -> Result<()> {
    let ns = TestNamespace::create("order-change").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    let pipelines: [(&str, &[(&str, &str)]); 4] = [
        ("a-only", &[("key", "a")]),
        ("b-only", &[("key", "b")]),
        ("ab", &[("keys", "a,b")]),
        ("ba", &[("keys", "b,a")]),
    ];
    for (name, lock_params) in pipelines {
        let o = Opts {
            lock_params,
            ..Opts::default()
        };
        ns.apply(&pipeline(name, &o)).await?;
    }
    for (pr, p) in [("holder-a", "a-only"), ("holder-b", "b-only")] {
        ns.apply(&pipeline_run(pr, p, &[])).await?;
        wait_reason(&ns, &lock_run(pr), "Acquired", slow()).await?;
    }
    // "ab" is the older: oldest-first ranks it first, newest-first "ba".
    for pr in ["ab", "ba"] {
        ns.apply(&pipeline_run(pr, pr, &[])).await?;
        wait_reason(&ns, &lock_run(pr), "Waiting", slow()).await?;
        create_gate(&ns, &format!("release-{pr}")).await?;
    }
    let newest_first = json!({"spec": {"order": "newest-first"}});
    ns.api::<Mutex>()
        .patch("b", &PatchParams::default(), &Patch::Merge(&newest_first))
        .await?;
    wait_until("b to queue newest first", slow(), || async {
        let queue: Vec<String> = mutex_status(&ns, "b")
            .await?
            .queue
            .iter()
            .filter_map(|w| w.pipeline_run.clone())
            .collect();
        Ok((queue == ["ba", "ab"]).then_some(()))
    })
    .await?;
    for pr in ["holder-a", "holder-b"] {
        release(&ns, pr).await?;
    }
    for pr in ["holder-a", "holder-b", "ab", "ba"] {
        succeeded(&ns, pr).await?;
    }
    for key in ["a", "b"] {
        let holder = format!("holder-{key}");
        timeline.check_exclusion_among(1, |pr| [holder.as_str(), "ab", "ba"].contains(&pr))?;
    }
    Ok(())
}

/// Item 2, for `release-after`: a waiting lock run whose `release-after` is set after the lock
/// first told it fails `InvalidParams` naming the field and both values, and is never granted;
/// the key still grants the next run (before, the change went unseen).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_waiting_runs_changed_release_after_fails_invalid_params_naming_it() -> Result<()> {
    let ns = TestNamespace::create("release-after-changed").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let o = Opts {
        lock_params: &[("key", "staging")],
        ..Opts::default()
    };
    ns.apply(&pipeline("deploy-staging", &o)).await?;
    ns.apply(&pipeline_run("a", "deploy-staging", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy-staging", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;

    set_param(&ns, &lock_run("b"), "release-after", "deploy").await?;
    let failed = wait_reason(&ns, &lock_run("b"), "InvalidParams", slow()).await?;
    let message = failed.message.unwrap_or_default();
    ensure!(
        message.contains("\"release-after\"")
            && message.contains("was \"\"")
            && message.contains("now \"deploy\""),
        "the refusal does not name the field and both values: {message}"
    );
    release(&ns, "a").await?;
    ns.apply(&pipeline_run("c", "deploy-staging", &[])).await?;
    wait_reason(&ns, &lock_run("c"), "Acquired", slow()).await?;
    release(&ns, "c").await?;
    wait_reason(&ns, &lock_run("b"), "InvalidParams", slow()).await?;
    Ok(())
}

/// Item 2, for `release-after`, on a held run: patched to name a task that is already over (its
/// own lock task), it keeps the slot for its deploy, the section it was granted for. A held run
/// is not failed (its PipelineRun has moved on); the next run waits until the deploy ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_held_runs_changed_release_after_keeps_the_section_it_was_granted_for() -> Result<()> {
    let ns = TestNamespace::create("release-after-held").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    let o = Opts {
        lock_params: &[("key", "staging")],
        ..Opts::default()
    };
    ns.apply(&pipeline("deploy-staging", &o)).await?;
    ns.apply(&pipeline_run("a", "deploy-staging", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    set_param(&ns, &lock_run("a"), "release-after", "lock").await?;
    // A newcomer: once it is told, the key has synced since the patch.
    ns.apply(&pipeline_run("b", "deploy-staging", &[])).await?;
    let told = wait_told(&ns, &lock_run("b"), slow()).await?;
    ensure!(
        told.reason.as_deref() == Some("Waiting"),
        "the patched release-after let a's slot go while it deploys: b is {told:?}"
    );
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    release(&ns, "b").await?;
    for pr in ["a", "b"] {
        succeeded(&ns, pr).await?;
    }
    timeline.check_exclusion(1)?;
    Ok(())
}

/// Item 2, before the lock's first status write: a run whose spec was edited before the lock
/// first saw it fails `InvalidParams`, for the key its pipeline guards is not known (the chaos
/// campaign's seed 601721574: re-pointed that early, a run joined its new key). A run of another
/// custom task, never told, is moved onto a Mutex: the API server's generation is 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_run_edited_before_the_lock_first_saw_it_fails_invalid_params() -> Result<()> {
    let ns = TestNamespace::create("edited-unseen").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    ns.apply(
        r#"
apiVersion: tekton.dev/v1beta1
kind: CustomRun
metadata: {name: moved}
spec:
  customRef: {apiVersion: example.dev/v1, kind: Other}
  params: [{name: key, value: prod}]
"#,
    )
    .await?;
    let patch = json!({"spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"}}});
    ns.api::<CustomRun>()
        .patch("moved", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let failed = wait_reason(&ns, "moved", "InvalidParams", slow()).await?;
    let message = failed.message.unwrap_or_default();
    ensure!(
        message.contains("generation 2") && message.contains("create a new run"),
        "the refusal does not say why: {message}"
    );
    let prod = mutex_status(&ns, "prod").await.unwrap_or_default();
    ensure!(
        prod.holders.is_empty(),
        "prod granted it: {:?}",
        prod.holders
    );
    Ok(())
}

/// Sets param `name` of CustomRun `run` to `value` (adding it if missing), as a user may.
async fn set_param(ns: &TestNamespace, run: &str, name: &str, value: &str) -> Result<()> {
    let cr = ns.api::<CustomRun>().get(run).await?;
    let mut params = serde_json::to_value(&cr.spec.params)?;
    let list = params.as_array_mut().context("params")?;
    list.retain(|p| p["name"] != name);
    list.push(json!({"name": name, "value": value}));
    let patch = json!({"spec": {"params": params}});
    ns.api::<CustomRun>()
        .patch(run, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
