//! Lock scopes (issue 16) on the local control plane, with the real Tekton
//! controller: `release-after` (hold the slot around a section of the
//! PipelineRun), free-form keys (any string names one Mutex) and ClusterMutex.
//!
//! Steps record marks as ConfigMaps with the host's clock in nanoseconds (the
//! steps all run on this host), and block on "gate" ConfigMaps that the test
//! creates, so the test decides when each task ends: no timing guesses.

mod support;

use anyhow::{Context, Result, ensure};
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::controller::ControllerProcess;
use support::locks::ClusterMutexGuard;
use support::pipelines::{
    condition_of, create_gate, lock_run, mark, mark_exists, mutex_status, slow, succeeded,
    wait_reason,
};
use support::*;
use tekton_mutex::model::cluster_mutex::{ClusterMutex, ClusterMutexSpec};
use tekton_mutex::model::mutex::Mutex;

/// A cluster-wide controller would act in the other tests' namespaces too:
/// the test that starts one runs alone.
static CLUSTER_WIDE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// A step that marks `<what>-start`, waits for gate `<what>-go-<pr>`, marks `<what>-end`.
fn gated_step(what: &str) -> Value {
    let script = format!(
        r#"
mark() {{ kubectl -n "$(params.ns)" create configmap "$1-$(params.pr)" --from-literal=at="$(date +%s%N)" >/dev/null; }}
mark {what}-start
kubectl -n "$(params.ns)" wait --for=create "configmap/{what}-go-$(params.pr)" --timeout=600s >/dev/null
mark {what}-end
"#
    );
    json!({"name": "run", "image": "busybox", "script": script})
}

/// A pipeline task running [`gated_step`] after `after`.
fn gated_task(name: &str, after: &str) -> Value {
    json!({
        "name": name, "runAfter": [after],
        "params": [
            {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
            {"name": "pr", "value": "$(context.pipelineRun.name)"},
        ],
        "taskSpec": {"params": [{"name": "ns"}, {"name": "pr"}], "steps": [gated_step(name)]},
    })
}

/// `lock` (Mutex, with `lock_params`), then `deploy`, then `test`: each gated.
fn section_pipeline(name: &str, task_ref: Value, lock_params: &[(&str, &str)]) -> String {
    let params: Vec<_> = lock_params
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let lock = json!({"name": "lock", "params": params, "taskRef": task_ref});
    let tasks = [
        lock,
        gated_task("deploy", "lock"),
        gated_task("test", "deploy"),
    ];
    json!({"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name},
           "spec": {"tasks": tasks}})
    .to_string()
}

fn mutex_ref() -> Value {
    json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"})
}

fn pipeline_run(name: &str, pipeline: &str) -> String {
    json!({"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": name},
           "spec": {"pipelineRef": {"name": pipeline}}})
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn release_after_deploy_hands_over_while_the_tests_still_run() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("scope-section").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let params = [("release-after", "deploy"), ("supersede", "none")];
    ns.apply(&section_pipeline("env", mutex_ref(), &params))
        .await?;
    ns.apply(&pipeline_run("a", "env")).await?;
    mark(&ns, "deploy-start", "a").await?;
    ns.apply(&pipeline_run("b", "env")).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    // a's deploy ends; its long test task starts and keeps running.
    create_gate(&ns, "deploy-go-a").await?;
    let a_deploy_end = mark(&ns, "deploy-end", "a").await?;
    mark(&ns, "test-start", "a").await?;
    let b_deploy_start = mark(&ns, "deploy-start", "b").await?;
    ensure!(
        b_deploy_start > a_deploy_end,
        "b started deploying {} ms before a's deploy step ended",
        (a_deploy_end - b_deploy_start) / 1_000_000
    );
    ensure!(
        !mark_exists(&ns, "test-end", "a").await?,
        "a's test task ended before b deployed: the test did not show the section release"
    );
    let token = |pr: &str| {
        let run = lock_run(pr);
        let ns = &ns;
        async move {
            support::pipelines::result_of(ns, &run, "token")
                .await?
                .context("no token")
        }
    };
    let (ta, tb): (i64, i64) = (token("a").await?.parse()?, token("b").await?.parse()?);
    ensure!(tb > ta, "tokens must keep increasing: a {ta}, b {tb}");
    for pr in ["a", "b"] {
        for task in ["deploy", "test"] {
            create_gate(&ns, &format!("{task}-go-{pr}")).await?;
        }
    }
    succeeded(&ns, "a").await?;
    succeeded(&ns, "b").await?;
    let key = ns.name().to_string();
    let st = wait_until("the Mutex to be free", slow(), || async {
        let st = mutex_status(&ns, &key).await?;
        Ok(st.holders.is_empty().then_some(st))
    })
    .await?;
    ensure!(st.queue.is_empty(), "{st:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn release_after_a_task_that_is_not_in_the_pipeline_is_invalid() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("scope-section-bad").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let params = [("release-after", "deploy,deplyo")];
    ns.apply(&section_pipeline("env", mutex_ref(), &params))
        .await?;
    ns.apply(&pipeline_run("a", "env")).await?;
    let c = wait_reason(&ns, &lock_run("a"), "InvalidParams", slow()).await?;
    let m = c.message.unwrap_or_default();
    ensure!(
        m.contains("deplyo not in the pipeline") && m.contains("lock, deploy, test"),
        "{m}"
    );
    Ok(())
}

/// `lock` with the `key` param, then a gated `deploy`.
fn keyed_pipeline(name: &str, key: &str) -> String {
    section_pipeline(name, mutex_ref(), &[("key", key), ("supersede", "none")])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn repo_url_keys_each_get_their_own_mutex() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("scope-keys").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    // Both map to the readable prefix github-com-org-repo-main.
    let (main_at, main_path) = (
        "https://github.com/org/repo@main",
        "https://github.com/org/repo/main",
    );
    ns.apply(&keyed_pipeline("at", main_at)).await?;
    ns.apply(&keyed_pipeline("path", main_path)).await?;
    ns.apply(&pipeline_run("a", "at")).await?;
    ns.apply(&pipeline_run("p", "path")).await?;
    // Different keys: both hold at once.
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    wait_reason(&ns, &lock_run("p"), "Acquired", slow()).await?;
    let mutexes = ns.api::<Mutex>().list(&Default::default()).await?.items;
    let mut keys: Vec<(String, Option<String>)> = mutexes
        .iter()
        .map(|m| (m.metadata.name.clone().unwrap(), m.spec.key.clone()))
        .collect();
    keys.sort();
    ensure!(keys.len() == 2, "{keys:?}");
    for (name, key) in &keys {
        ensure!(name.starts_with("github-com-org-repo-main-"), "{name}");
        ensure!(
            key.as_deref()
                .is_some_and(|k| k == main_at || k == main_path),
            "{key:?}"
        );
    }
    ensure!(keys[0].0 != keys[1].0 && keys[0].1 != keys[1].1, "{keys:?}");
    // `kubectl get mutexes` shows the key as written.
    let table = ns.kubectl(&["get", "mutexes"])?;
    ensure!(
        table.contains(main_at) && table.contains(main_path),
        "{table}"
    );
    // The same key still excludes.
    ns.apply(&pipeline_run("a2", "at")).await?;
    wait_reason(&ns, &lock_run("a2"), "Waiting", slow()).await?;
    create_gate(&ns, "deploy-go-a").await?;
    create_gate(&ns, "test-go-a").await?;
    wait_reason(&ns, &lock_run("a2"), "Acquired", slow()).await?;
    ensure!(
        condition_of(&ns, &lock_run("p"))
            .await?
            .and_then(|c| c.reason)
            .as_deref()
            == Some("Acquired"),
        "p lost its slot"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_cluster_mutex_excludes_across_its_namespaces_and_forbids_others() -> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let (a, b, c) = (
        TestNamespace::create("scope-cluster-a").await?,
        TestNamespace::create("scope-cluster-b").await?,
        TestNamespace::create("scope-cluster-c").await?,
    );
    let _ctl = ControllerProcess::start_cluster_wide("cluster-wide").await?;
    let name = format!("prod-db-{}", a.name().rsplit('-').next().unwrap_or("x"));
    let api: kube::Api<ClusterMutex> = kube::Api::all(a.client());
    let spec: ClusterMutexSpec =
        serde_json::from_value(json!({"namespaces": [a.name(), b.name()]}))?;
    api.create(&PostParams::default(), &ClusterMutex::new(&name, spec))
        .await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    let task_ref =
        json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": name});
    // The same Pipeline name (so the same supersede group) in every namespace. b's
    // priority orders b's own runs only: across namespaces, each one's next run goes
    // by its PipelineRun's creation (fair share), so a2 is created a second after b1.
    for (ns, lock_params) in [(&a, &[][..]), (&b, &[("priority", "1")][..]), (&c, &[][..])] {
        ns.apply(&section_pipeline("env", task_ref.clone(), lock_params))
            .await?;
    }
    a.apply(&pipeline_run("a1", "env")).await?;
    wait_reason(&a, &lock_run("a1"), "Acquired", slow()).await?;
    b.apply(&pipeline_run("b1", "env")).await?;
    wait_reason(&b, &lock_run("b1"), "Waiting", slow()).await?;
    // A newer run of the group in another namespace does not supersede b1.
    let prs = b.dynamic("tekton.dev/v1", "PipelineRun").await?;
    let b1_created = prs
        .get("b1")
        .await?
        .metadata
        .creation_timestamp
        .context("created")?
        .0;
    wait_until("a second after b1's creation", secs(5), || async {
        let later = jiff::Timestamp::now().as_second() > b1_created.as_second();
        Ok(later.then_some(()))
    })
    .await?;
    a.apply(&pipeline_run("a2", "env")).await?;
    wait_reason(&a, &lock_run("a2"), "Waiting", slow()).await?;
    let st = api.get(&name).await?.status.unwrap_or_default();
    let queued: Vec<_> = st.queue.iter().map(|w| w.run.name.clone()).collect();
    ensure!(
        queued
            == [
                format!("{}/b1-lock", b.name()),
                format!("{}/a2-lock", a.name())
            ],
        "queue: {queued:?}"
    );
    ensure!(
        st.holding == format!("{}/a1", a.name()),
        "holding: {}",
        st.holding
    );
    // A namespace that is not allowed is refused, and told how to be allowed.
    c.apply(&pipeline_run("c1", "env")).await?;
    let refused = wait_reason(&c, &lock_run("c1"), "Forbidden", slow()).await?;
    let m = refused.message.unwrap_or_default();
    ensure!(m.contains(c.name()) && m.contains("spec.namespaces"), "{m}");
    // a1 ends: b1 (first in line) gets the slot, only after a1 ended.
    create_gate(&a, "deploy-go-a1").await?;
    create_gate(&a, "test-go-a1").await?;
    let a1_end = mark(&a, "test-end", "a1").await?;
    wait_reason(&b, &lock_run("b1"), "Acquired", slow()).await?;
    let b1_start = mark(&b, "deploy-start", "b1").await?;
    ensure!(b1_start > a1_end, "b1 deployed while a1 still ran");
    ensure!(
        condition_of(&a, &lock_run("a2"))
            .await?
            .and_then(|c| c.reason)
            .as_deref()
            == Some("Waiting"),
        "a2 must wait for b1"
    );
    create_gate(&b, "deploy-go-b1").await?;
    create_gate(&b, "test-go-b1").await?;
    wait_reason(&a, &lock_run("a2"), "Acquired", slow()).await?;
    create_gate(&a, "deploy-go-a2").await?;
    create_gate(&a, "test-go-a2").await?;
    succeeded(&a, "a2").await?;
    let st = wait_until("the ClusterMutex to be free", slow(), || async {
        let st = api.get(&name).await?.status.unwrap_or_default();
        Ok(st.holders.is_empty().then_some(st))
    })
    .await?;
    ensure!(st.last_token >= 3 && st.queue.is_empty(), "{st:?}");
    Ok(())
}

/// Issue 23 item 7: one tenant cannot fill a ClusterMutex's queue. Beyond its share
/// (`spec.maxQueuePerNamespace`) its runs fail `QueueFull`, naming its namespace and the limit,
/// while another namespace's run still joins the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_tenant_beyond_its_share_of_a_cluster_mutex_is_refused_and_others_still_queue()
-> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let (a, b) = (
        TestNamespace::create("share-a").await?,
        TestNamespace::create("share-b").await?,
    );
    let _ctl = ControllerProcess::start_cluster_wide("cluster-wide").await?;
    let name = format!("shared-{}", a.name().rsplit('-').next().unwrap_or("x"));
    let api: kube::Api<ClusterMutex> = kube::Api::all(a.client());
    let spec: ClusterMutexSpec = serde_json::from_value(json!({
        "namespaces": [a.name(), b.name()], "maxQueue": 4, "maxQueuePerNamespace": 2}))?;
    api.create(&PostParams::default(), &ClusterMutex::new(&name, spec))
        .await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    let task_ref =
        json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": name});
    for ns in [&a, &b] {
        let params = [("supersede", "none")];
        ns.apply(&section_pipeline("env", task_ref.clone(), &params))
            .await?;
    }
    a.apply(&pipeline_run("a1", "env")).await?;
    wait_reason(&a, &lock_run("a1"), "Acquired", slow()).await?;
    for pr in ["a2", "a3"] {
        a.apply(&pipeline_run(pr, "env")).await?;
        wait_reason(&a, &lock_run(pr), "Waiting", slow()).await?;
    }
    a.apply(&pipeline_run("a4", "env")).await?;
    let full = wait_reason(&a, &lock_run("a4"), "QueueFull", slow()).await?;
    let m = full.message.unwrap_or_default();
    ensure!(
        m.contains(a.name()) && m.contains('2'),
        "the message names the namespace and its share: {m}"
    );
    b.apply(&pipeline_run("b1", "env")).await?;
    wait_reason(&b, &lock_run("b1"), "Waiting", slow()).await?;
    let st = api.get(&name).await?.status.unwrap_or_default();
    ensure!(st.queue.len() == 3 && st.holders.len() == 1, "{st:?}");
    Ok(())
}

/// Issue 37 item 12: a namespace taken out of a ClusterMutex's `spec.namespaces` while its run
/// waits is not granted: the wait ends `Cancelled`, naming the namespace and the field. The
/// holder of the allowed namespace keeps its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_namespace_removed_from_a_cluster_mutex_is_not_granted() -> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let (a, b) = (
        TestNamespace::create("scope-revoke-a").await?,
        TestNamespace::create("scope-revoke-b").await?,
    );
    let _ctl = ControllerProcess::start_cluster_wide("cluster-wide").await?;
    let name = format!("shared-{}", a.name().rsplit('-').next().unwrap_or("x"));
    let api: kube::Api<ClusterMutex> = kube::Api::all(a.client());
    let spec: ClusterMutexSpec =
        serde_json::from_value(json!({"namespaces": [a.name(), b.name()]}))?;
    api.create(&PostParams::default(), &ClusterMutex::new(&name, spec))
        .await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    let task_ref =
        json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": name});
    for ns in [&a, &b] {
        ns.apply(&section_pipeline("env", task_ref.clone(), &[]))
            .await?;
    }
    a.apply(&pipeline_run("a1", "env")).await?;
    wait_reason(&a, &lock_run("a1"), "Acquired", slow()).await?;
    b.apply(&pipeline_run("b1", "env")).await?;
    wait_reason(&b, &lock_run("b1"), "Waiting", slow()).await?;
    let only_a = json!({"spec": {"namespaces": [a.name()]}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&only_a))
        .await?;
    // Two writers may end the wait, whichever comes first: the lock (`CustomRunCancelled`, its
    // waiter revoked) or admission (`Forbidden`, the run no longer allowed). Both refuse the
    // grant and name the namespace and the field; neither is ever `Acquired`.
    let ended = wait_until("b1's wait to end, refused", slow(), || async {
        let c = condition_of(&b, &lock_run("b1")).await?;
        let reason = c
            .as_ref()
            .and_then(|c| c.reason.clone())
            .unwrap_or_default();
        ensure!(
            reason != "Acquired",
            "b1 was granted after its namespace was removed"
        );
        Ok(c.filter(|_| reason == "CustomRunCancelled" || reason == "Forbidden"))
    })
    .await?;
    let m = ended.message.unwrap_or_default();
    ensure!(m.contains(b.name()) && m.contains("spec.namespaces"), "{m}");
    let st = api.get(&name).await?.status.unwrap_or_default();
    ensure!(
        st.queue.is_empty() && st.holding == format!("{}/a1", a.name()),
        "{st:?}"
    );
    create_gate(&a, "deploy-go-a1").await?;
    create_gate(&a, "test-go-a1").await?;
    succeeded(&a, "a1").await?;
    Ok(())
}
