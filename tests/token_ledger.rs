//! Tokens that never go back, and finalizers that never strand anything (issue 23, items 6 and
//! 12), on the local control plane with the real Tekton controller. An idle lock carries no
//! finalizer, so it can be deleted with no controller running; its last token is in the token
//! ledger (ConfigMap tekton-mutex-token-floors) first, so the next lock object of its name hands
//! out tokens above every earlier one, even after a restart and with every earlier run gone.
//! The ClusterMutexes' ledger lives in kube-system (issue 37 items 7 and 11): no uninstall
//! deletes it, and it needs no namespace of the install's.

mod support;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use support::controller::ControllerProcess;
use support::locks::ClusterMutexGuard;
use support::pipelines::*;
use support::*;
use tekton_mutex::model::cluster_mutex::{ClusterMutex, ClusterMutexSpec};
use tekton_mutex::model::mutex::Mutex;
use tekton_mutex::model::tekton::customrun::CustomRun;

const KEY: &str = "k";
const LEDGER: &str = "tekton-mutex-token-floors";
const FINALIZER: &str = "tekton-mutex.dev/lock-state";
/// Where the ClusterMutexes' ledger lives (the controller's `--cluster-ledger-namespace`).
const CLUSTER_LEDGER: &str = "kube-system";
/// The install's namespace (release.yaml's), which the README's uninstall deletes.
const INSTALL_NAMESPACE: &str = "tekton-mutex";

/// A cluster-wide controller would act in the other tests' namespaces too:
/// the test that starts one runs alone.
static CLUSTER_WIDE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// Pipeline `deploy`: the lock (a Mutex of key [`KEY`]), then a gated deploy.
async fn mutex_pipeline(ns: &TestNamespace) -> Result<()> {
    let opts = Opts {
        lock_params: &[("key", KEY), ("supersede", "none")],
        ..Default::default()
    };
    ns.apply(&pipeline("deploy", &opts)).await?;
    Ok(())
}

/// Pipeline `deploy` whose lock is ClusterMutex `name`.
async fn cluster_mutex_pipeline(ns: &TestNamespace, name: &str) -> Result<()> {
    let opts = Opts {
        lock_params: &[("supersede", "none")],
        mutex_name: Some(name),
        ..Default::default()
    };
    let yaml = pipeline("deploy", &opts);
    let kind = r#""kind":"Mutex""#;
    ensure!(yaml.contains(kind), "the lock task's taskRef: {yaml}");
    ns.apply(&yaml.replace(kind, r#""kind":"ClusterMutex""#))
        .await?;
    Ok(())
}

/// Did token `later` come from the ledger's floor rather than the clock? Tokens follow the
/// clock, which alone would put a later token above an earlier one while clocks agree; the
/// ledger's floor is the end of the block the key's `first` grant reserved, so a token taken
/// from it is past that block (ten minutes of tokens ahead of the clock).
fn from_the_ledger(first: i64, later: i64) -> bool {
    later >= first + tekton_mutex::model::mutex::TOKEN_BLOCK
}

async fn token_of(ns: &TestNamespace, pr: &str) -> Result<i64> {
    token_result(ns, &lock_run(pr)).await
}

/// PipelineRun `pr` through the lock: granted, deploys, done. Its token.
async fn pass(ns: &TestNamespace, pr: &str) -> Result<i64> {
    ns.apply(&pipeline_run(pr, "deploy", &[])).await?;
    wait_reason(ns, &lock_run(pr), "Acquired", slow()).await?;
    release(ns, pr).await?;
    succeeded(ns, pr).await?;
    token_of(ns, pr).await
}

/// Every run that showed a token goes: the PipelineRuns and their lock runs.
async fn forget_runs(ns: &TestNamespace, prs: &[&str]) -> Result<()> {
    for pr in prs {
        ns.kubectl(&["delete", "pipelinerun", pr, "--ignore-not-found"])?;
        ns.kubectl(&["delete", "customrun", &lock_run(pr), "--ignore-not-found"])?;
    }
    wait_until("the lock runs to be gone", slow(), || async {
        let runs = ns.api::<CustomRun>().list(&Default::default()).await?;
        Ok(runs.items.is_empty().then_some(()))
    })
    .await
}

/// Waits until lock object `lock` (as read by `get`) is idle and carries no finalizer of ours.
async fn wait_unprotected<K, F, Fut>(what: &str, get: F) -> Result<()>
where
    K: Resource,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<K, kube::Error>>,
{
    let mut get = get;
    wait_until(&format!("{what} to lose its finalizer"), slow(), || {
        let read = get();
        async move {
            let lock = read.await?;
            let fins = lock.meta().finalizers.clone().unwrap_or_default();
            Ok((!fins.iter().any(|f| f == FINALIZER)).then_some(()))
        }
    })
    .await
}

/// `kubectl delete ... --wait`, bounded: an error instead of a hang if something holds it.
fn delete_bounded(ns: Option<&TestNamespace>, what: &[&str]) -> Result<()> {
    let mut args = vec!["delete"];
    args.extend(what);
    args.extend(["--wait=true", "--timeout=30s"]);
    match ns {
        Some(ns) => ns.kubectl(&args),
        None => kubectl(&args),
    }
    .map(drop)
    .with_context(|| format!("kubectl {args:?} did not finish"))
}

/// The ledger's entry for a lock, as the API server holds it.
async fn ledger_entry(namespace: &str, entry: &str) -> Result<Option<i64>> {
    let api: Api<ConfigMap> = Api::namespaced(client().await?, namespace);
    let cm = api.get_opt(LEDGER).await?;
    let value = cm.and_then(|c| c.data).and_then(|d| d.get(entry).cloned());
    value
        .map(|v| v.parse().context("a ledger entry"))
        .transpose()
}

/// Makes namespace `name` exist (`present`), or be gone, waiting until it is.
async fn namespace_state(name: &str, present: bool) -> Result<()> {
    let api: Api<Namespace> = Api::all(client().await?);
    if present {
        let object = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        // One still Terminating must go first: it refuses every write.
        wait_until(&format!("namespace {name} to exist"), slow(), || async {
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => Ok(Some(())),
                Err(kube::Error::Api(e)) if e.code == 409 => {
                    let ns = api.get(name).await?;
                    Ok(ns.metadata.deletion_timestamp.is_none().then_some(()))
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
    } else {
        match api.delete(name, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e).context(format!("deleting namespace {name}")),
        }
        wait_until(&format!("namespace {name} to be gone"), slow(), || async {
            Ok(api.get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }
}

/// ClusterMutex `name`, allowing namespace `ns`, created (again) by its administrator.
async fn create_cluster_mutex(
    api: &Api<ClusterMutex>,
    name: &str,
    ns: &TestNamespace,
) -> Result<()> {
    let spec: ClusterMutexSpec = serde_json::from_value(json!({"namespaces": [ns.name()]}))?;
    api.create(&PostParams::default(), &ClusterMutex::new(name, spec))
        .await?;
    Ok(())
}

/// A ClusterMutex name of its own for the test of namespace `ns`.
fn cluster_mutex_name(prefix: &str, ns: &TestNamespace) -> String {
    format!("{prefix}-{}", ns.name().rsplit('-').next().unwrap_or("x"))
}

/// Item 6: GitOps prunes an idle Mutex, every run that showed its tokens goes, the controller
/// restarts (its memory is gone); a new run must still get a token above every earlier one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn tokens_climb_after_an_idle_mutex_is_pruned_and_the_controller_restarts() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("floor-prune").await?;
    let mut c = ControllerProcess::start(ns.name()).await?;
    mutex_pipeline(&ns).await?;
    let (a, b) = (pass(&ns, "a").await?, pass(&ns, "b").await?);
    ensure!(a < b, "tokens rise: a {a}, b {b}");
    // The prune, with the controller running; then the runs go, then a restart.
    delete_bounded(Some(&ns), &["mutex", KEY])?;
    forget_runs(&ns, &["a", "b"]).await?;
    c.kill();
    let _c = ControllerProcess::start(ns.name()).await?;
    let d = pass(&ns, "d").await?;
    ensure!(
        d > b && from_the_ledger(a, d),
        "a token handed out again after the prune and a restart: a {a}, b {b}, then d {d}"
    );
    let st = mutex_status(&ns, KEY).await?;
    ensure!(st.last_token == d, "{st:?}");
    let entry = format!("mutex.{KEY}");
    ensure!(
        ledger_entry(ns.name(), &entry).await? >= Some(b),
        "the ledger keeps b's token"
    );
    Ok(())
}

/// Item 12: an idle Mutex carries no finalizer, so it is deleted with no controller running
/// (`kubectl delete --wait` returns); the key still grants afterwards, above the old tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn an_idle_mutex_deletes_with_no_controller_and_the_key_still_grants() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("floor-nocontroller").await?;
    let mut c = ControllerProcess::start(ns.name()).await?;
    mutex_pipeline(&ns).await?;
    let a = pass(&ns, "a").await?;
    let mutexes = ns.api::<Mutex>();
    wait_unprotected("the idle Mutex", || mutexes.get(KEY)).await?;
    c.kill();
    delete_bounded(Some(&ns), &["mutex", KEY])?;
    ensure!(mutexes.get_opt(KEY).await?.is_none(), "the Mutex is gone");
    forget_runs(&ns, &["a"]).await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let d = pass(&ns, "d").await?;
    ensure!(
        from_the_ledger(a, d),
        "the key grants again, above a's token {a} and its block: d {d}"
    );
    Ok(())
}

/// Item 6 for a ClusterMutex: deleted while idle (controller running), runs gone, a restart,
/// created again by its administrator: tokens continue above the old ones. Then, idle again, it
/// is deleted with no controller running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn cluster_mutex_tokens_climb_across_its_deletion_and_a_restart() -> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let ns = TestNamespace::create("floor-cluster").await?;
    let name = format!("floor-{}", ns.name().rsplit('-').next().unwrap_or("x"));
    let api: Api<ClusterMutex> = Api::all(ns.client());
    let spec: ClusterMutexSpec = serde_json::from_value(json!({"namespaces": [ns.name()]}))?;
    let object = ClusterMutex::new(&name, spec);
    let create = || async { api.create(&PostParams::default(), &object).await };
    create().await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    let mut c = ControllerProcess::start_cluster_wide("floor-cluster").await?;
    cluster_mutex_pipeline(&ns, &name).await?;
    let (a, b) = (pass(&ns, "a").await?, pass(&ns, "b").await?);
    delete_bounded(None, &["clustermutex", &name])?;
    forget_runs(&ns, &["a", "b"]).await?;
    c.kill();
    create().await?;
    let mut c = ControllerProcess::start_cluster_wide("floor-cluster").await?;
    let d = pass(&ns, "d").await?;
    ensure!(
        d > b && from_the_ledger(a, d),
        "a token handed out again after the ClusterMutex was deleted and the controller restarted: a {a}, b {b}, then d {d}"
    );
    let entry = format!("clustermutex.{name}");
    ensure!(
        ledger_entry(CLUSTER_LEDGER, &entry).await? >= Some(b),
        "the ledger keeps b's token"
    );
    wait_unprotected("the idle ClusterMutex", || api.get(&name)).await?;
    c.kill();
    delete_bounded(None, &["clustermutex", &name])?;
    ensure!(
        api.get_opt(&name).await?.is_none(),
        "the ClusterMutex is gone"
    );
    Ok(())
}

/// Issue 37 item 7: an idle ClusterMutex, used once, deletes promptly, as an idle Mutex does.
/// Its last token went into a ledger in the controller's namespace; where that namespace did not
/// exist (a controller run outside the release install, or after an uninstall), the write failed,
/// the finalizer stayed on and `kubectl delete` waited for ever, with only a retry in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn an_idle_cluster_mutex_used_once_deletes_promptly_without_the_install_namespace()
-> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let ns = TestNamespace::create("floor-idle-cm").await?;
    let name = cluster_mutex_name("idle", &ns);
    let api: Api<ClusterMutex> = Api::all(ns.client());
    create_cluster_mutex(&api, &name, &ns).await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    let _c = ControllerProcess::start_cluster_wide("floor-idle-cm").await?;
    // No namespace of the install's: the controller runs as a process of its own.
    namespace_state(INSTALL_NAMESPACE, false).await?;
    cluster_mutex_pipeline(&ns, &name).await?;
    let a = pass(&ns, "a").await?;
    wait_until("the ClusterMutex to be idle", slow(), || async {
        let st = api.get(&name).await?.status.unwrap_or_default();
        let idle = st.holders.is_empty() && st.queue.is_empty() && st.reservations.is_empty();
        Ok((idle && st.last_token == a).then_some(()))
    })
    .await?;
    let asked = std::time::Instant::now();
    kubectl(&["delete", "clustermutex", &name, "--wait=false"])?;
    wait_until("the idle ClusterMutex to be gone", secs(60), || async {
        Ok(api.get_opt(&name).await?.is_none().then_some(()))
    })
    .await?;
    eprintln!(
        "the idle ClusterMutex was gone {:?} after the delete",
        asked.elapsed()
    );
    let entry = format!("clustermutex.{name}");
    ensure!(
        ledger_entry(CLUSTER_LEDGER, &entry).await? >= Some(a),
        "the ledger in {CLUSTER_LEDGER} keeps a's token {a}"
    );
    Ok(())
}

/// Issue 37 item 11: uninstall as the README says, keeping the ledgers, then reinstall. The
/// ClusterMutex handed out tokens 1 and 2, went idle and was deleted (its last token recorded),
/// then `kubectl delete -f release.yaml` took the controller and its namespace, and the runs were
/// pruned. After the reinstall, the ClusterMutex created again hands out a token past the block
/// its first grant reserved, not one of it: its
/// ledger is not in a namespace the uninstall deletes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn cluster_mutex_tokens_continue_after_an_uninstall_that_keeps_the_ledgers() -> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    // The install's namespace, as release.yaml creates it.
    namespace_state(INSTALL_NAMESPACE, true).await?;
    let ns = TestNamespace::create("floor-reinstall").await?;
    let name = cluster_mutex_name("reinstall", &ns);
    let api: Api<ClusterMutex> = Api::all(ns.client());
    create_cluster_mutex(&api, &name, &ns).await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    let c = ControllerProcess::start_cluster_wide("floor-reinstall").await?;
    cluster_mutex_pipeline(&ns, &name).await?;
    let (a, b) = (pass(&ns, "a").await?, pass(&ns, "b").await?);
    ensure!(
        a < b && !from_the_ledger(a, b),
        "a new ClusterMutex: two tokens of one block, not {a} and {b}"
    );
    // The uninstall: 1. the runs have ended; the lock objects go while the controller runs.
    delete_bounded(None, &["clustermutex", &name])?;
    // 2. `kubectl delete -f release.yaml`: the controller, and its namespace with it.
    c.terminate()?;
    drop(c);
    namespace_state(INSTALL_NAMESPACE, false).await?;
    // The PipelineRuns that showed the tokens are pruned since.
    forget_runs(&ns, &["a", "b"]).await?;
    // The reinstall: the namespace and the controller, then the ClusterMutex again.
    namespace_state(INSTALL_NAMESPACE, true).await?;
    let _c = ControllerProcess::start_cluster_wide("floor-reinstall").await?;
    create_cluster_mutex(&api, &name, &ns).await?;
    let d = pass(&ns, "d").await?;
    ensure!(
        d > b && from_the_ledger(a, d),
        "after an uninstall that keeps the ledgers and a reinstall, the ClusterMutex handed out token {d} after {a} and {b}"
    );
    Ok(())
}

/// The uninstall order of the README: the runs end, the lock objects are deleted while the
/// controller still runs (a lock in use goes once empty), then the controller goes. Nothing is
/// left Terminating, nothing was created again, and the ledger keeps the tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn the_uninstall_order_leaves_nothing_terminating() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("floor-uninstall").await?;
    let c = ControllerProcess::start(ns.name()).await?;
    mutex_pipeline(&ns).await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    // 1. The runs end (here: they finish; cancelling them is the same).
    for pr in ["a", "b"] {
        release(&ns, pr).await?;
    }
    for pr in ["a", "b"] {
        succeeded(&ns, pr).await?;
    }
    // 2. The lock objects go while the controller runs.
    delete_bounded(Some(&ns), &["mutexes", "--all"])?;
    // 3. The controller goes (then the CRD, which waits only for objects with finalizers).
    c.terminate()?;
    let mutexes = ns.api::<Mutex>();
    let left = mutexes.list(&Default::default()).await?;
    ensure!(
        left.items.is_empty(),
        "left behind: {:?}",
        left.items
            .iter()
            .map(|m| (
                &m.metadata.name,
                &m.metadata.deletion_timestamp,
                &m.metadata.finalizers
            ))
            .collect::<Vec<_>>()
    );
    let b = token_of(&ns, "b").await?;
    let entry = format!("mutex.{KEY}");
    ensure!(
        ledger_entry(ns.name(), &entry).await? >= Some(b),
        "the ledger keeps b's token {b}"
    );
    Ok(())
}

/// Item 11: free-form keys must not leave Mutexes behind for ever. A Mutex the controller created
/// goes once idle for `spec.idleDeleteDays` (here: its idle-since stamp moved 31 days back); one a
/// person applied stays; the key that comes back gets a new Mutex, with tokens above the old ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn an_idle_mutex_the_controller_created_goes_after_idle_delete_days() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("idle-delete").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let applied = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": "applied"}, "spec": {}});
    ns.apply(&applied.to_string()).await?;
    let by_key = |name: &str, key: &'static str| {
        pipeline(
            name,
            &Opts {
                lock_params: &[("key", key), ("supersede", "none")],
                ..Default::default()
            },
        )
    };
    ns.apply(&by_key("deploy", KEY)).await?;
    ns.apply(&by_key("other", "applied")).await?;
    let first = pass(&ns, "a").await?;
    ns.apply(&pipeline_run("o", "other", &[])).await?;
    wait_reason(&ns, &lock_run("o"), "Acquired", slow()).await?;
    release(&ns, "o").await?;
    succeeded(&ns, "o").await?;
    let api = ns.api::<Mutex>();
    let stamped = |name: &'static str| {
        let api = api.clone();
        async move {
            let m = api.get(name).await?;
            let idle = m.annotations().contains_key("tekton-mutex.dev/idle-since")
                && !m.finalizers().iter().any(|f| f == FINALIZER);
            Ok(idle.then_some(()))
        }
    };
    wait_until("k to be idle and stamped", slow(), || stamped(KEY)).await?;
    wait_until("applied to be idle and stamped", slow(), || {
        stamped("applied")
    })
    .await?;
    let long_ago = (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24 * 31)).to_string();
    for name in ["applied", KEY] {
        let stamp = format!("tekton-mutex.dev/idle-since={long_ago}");
        ns.kubectl(&["annotate", "--overwrite", "mutex", name, &stamp])?;
    }
    wait_until("k to be deleted", slow(), || async {
        Ok(api.get_opt(KEY).await?.is_none().then_some(()))
    })
    .await?;
    ensure!(
        api.get_opt("applied").await?.is_some(),
        "a Mutex a person applied is never deleted"
    );
    let again = pass(&ns, "b").await?;
    ensure!(
        from_the_ledger(first, again),
        "tokens continue over the deletion, from the ledger: {first} then {again}"
    );
    Ok(())
}

/// Issue 37 item 10: an idle Mutex is deleted, then restored from an older backup with its
/// status (as Velero does with status included) while the controller is down. The restored
/// status names an earlier `lastToken`; the controller reads the ledger for the restored
/// object before it grants, so the next token is above every one handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_mutex_restored_from_an_older_backup_never_hands_out_a_lower_token() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("floor-restore").await?;
    let mut c = ControllerProcess::start(ns.name()).await?;
    mutex_pipeline(&ns).await?;
    let a = pass(&ns, "a").await?;
    let mutexes = ns.api::<Mutex>();
    wait_unprotected("the idle Mutex", || mutexes.get(KEY)).await?;
    let backup = mutexes.get(KEY).await?;
    let b = pass(&ns, "b").await?;
    wait_unprotected("the idle Mutex", || mutexes.get(KEY)).await?;
    c.kill();
    delete_bounded(Some(&ns), &["mutex", KEY])?;
    // The runs that showed the tokens are pruned too: only the ledger remembers b's token.
    forget_runs(&ns, &["a", "b"]).await?;
    // The restore: the object as backed up, then its status through the status subresource.
    let mut restored = Mutex::new(KEY, backup.spec.clone());
    restored.metadata.labels = backup.metadata.labels.clone();
    let created = mutexes.create(&PostParams::default(), &restored).await?;
    let mut with_status = created.clone();
    with_status.status = backup.status.clone();
    mutexes
        .replace_status(KEY, &PostParams::default(), &with_status)
        .await?;
    let st = mutex_status(&ns, KEY).await?;
    ensure!(
        st.last_token == a,
        "the restored status is the backup's: {st:?}"
    );
    let _c = ControllerProcess::start(ns.name()).await?;
    let d = pass(&ns, "d").await?;
    ensure!(
        d > b && from_the_ledger(a, d),
        "a token handed out again after the restore: a {a}, b {b}, then d {d}"
    );
    Ok(())
}

/// Issue 37 item 8: a freeze outlives a quiet spell. Two Mutexes the controller created go
/// idle and are stamped long ago; the unfrozen one is deleted, the frozen one is kept (a new
/// Mutex of its key would grant at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_frozen_mutex_is_never_deleted_for_being_idle() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("idle-frozen").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let by_key = |name: &str, key: &'static str| {
        pipeline(
            name,
            &Opts {
                lock_params: &[("key", key), ("supersede", "none")],
                ..Default::default()
            },
        )
    };
    ns.apply(&by_key("deploy", KEY)).await?;
    ns.apply(&by_key("frozen", "kept")).await?;
    pass(&ns, "a").await?;
    ns.apply(&pipeline_run("f", "frozen", &[])).await?;
    wait_reason(&ns, &lock_run("f"), "Acquired", slow()).await?;
    release(&ns, "f").await?;
    succeeded(&ns, "f").await?;
    ns.kubectl(&[
        "patch",
        "mutex",
        "kept",
        "--type=merge",
        "-p",
        r#"{"spec":{"frozen":true}}"#,
    ])?;
    let api = ns.api::<Mutex>();
    for name in [KEY, "kept"] {
        wait_until(
            &format!("{name} to be idle and stamped"),
            slow(),
            || async {
                let m = api.get(name).await?;
                let idle = m.annotations().contains_key("tekton-mutex.dev/idle-since")
                    && !m.finalizers().iter().any(|f| f == FINALIZER);
                Ok(idle.then_some(()))
            },
        )
        .await?;
    }
    let long_ago = (jiff::Timestamp::now() - jiff::SignedDuration::from_hours(24 * 31)).to_string();
    for name in ["kept", KEY] {
        let stamp = format!("tekton-mutex.dev/idle-since={long_ago}");
        ns.kubectl(&["annotate", "--overwrite", "mutex", name, &stamp])?;
    }
    wait_until("the unfrozen Mutex to be deleted", slow(), || async {
        Ok(api.get_opt(KEY).await?.is_none().then_some(()))
    })
    .await?;
    let kept = api
        .get_opt("kept")
        .await?
        .context("the frozen Mutex was deleted")?;
    ensure!(kept.spec.lock.frozen, "still frozen: {:?}", kept.spec);
    Ok(())
}

/// A namespace editor cannot make tokens repeat (issue 46, item 8). With the cluster install's
/// policy (config/402-admission-token-ledger.yaml), one who may write the namespace's ConfigMaps
/// is refused lowering the key's ledger entry, removing it and deleting the ledger; raising it
/// passes (tokens skip, never repeat); the next grant still rises; and the namespace, its ledger
/// with it, is still deleted as a whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_namespace_editor_cannot_lower_the_token_ledger() -> Result<()> {
    let ns = TestNamespace::create("ledger-tenant").await?;
    let controller = ControllerProcess::start(ns.name()).await?;
    let policy = "402-admission-token-ledger.yaml";
    let _policy = support::policies::NamespacePolicy::install(&ns, policy).await?;
    mutex_pipeline(&ns).await?;
    let a = pass(&ns, "a").await?;
    let entry = format!("mutex.{KEY}");
    let covered = ledger_entry(ns.name(), &entry)
        .await?
        .context("no ledger entry after a grant")?;
    let as_tenant = support::policies::tenant(&ns, "configmaps", "get,list,patch,update,delete")?;
    let patch = |value: serde_json::Value| {
        let data = json!({"data": {entry.clone(): value}}).to_string();
        as_tenant(&["patch", "configmap", LEDGER, "--type=merge", "-p", &data])
    };
    let refused = |r: Result<String>, what: &str| match r {
        Err(e) if e.to_string().contains(what) => Ok(Some(())),
        Err(e) => Err(e),
        Ok(_) => Ok(None),
    };
    let lower = || patch(json!("1"));
    wait_until("the admission policy to take effect", slow(), || async {
        let dry = as_tenant(&[
            "patch",
            "configmap",
            LEDGER,
            "--type=merge",
            "--dry-run=server",
            "-p",
            &json!({"data": {entry.clone(): "1"}}).to_string(),
        ]);
        refused(dry, "never be lowered or removed")
    })
    .await?;
    ensure!(
        refused(lower(), "never be lowered")?.is_some(),
        "the entry was lowered"
    );
    ensure!(
        refused(patch(json!(null)), "never be lowered")?.is_some(),
        "the entry was removed"
    );
    let deleted = as_tenant(&["delete", "configmap", LEDGER]);
    ensure!(
        refused(deleted, "goes with its namespace")?.is_some(),
        "the ledger was deleted"
    );
    patch(json!((covered + 1).to_string()))?;
    ensure!(
        ledger_entry(ns.name(), &entry).await? == Some(covered + 1),
        "a raise was refused"
    );
    let b = pass(&ns, "b").await?;
    ensure!(b > a, "b's token {b} is not above a's {a}");
    drop(controller);
    namespace_state(ns.name(), false).await?;
    Ok(())
}

/// Issue 46 item 6: nothing creates a ClusterMutex again but its administrator. A run that
/// arrives while one in use is being deleted ends `LockDeleted` at once, instead of waiting for a
/// ClusterMutex that never comes; the holder keeps its slot until it is done, and the
/// ClusterMutex then goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_run_arriving_while_its_cluster_mutex_is_deleted_ends_at_once() -> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let ns = TestNamespace::create("cluster-deleting").await?;
    let name = cluster_mutex_name("deleting", &ns);
    let api: Api<ClusterMutex> = Api::all(ns.client());
    create_cluster_mutex(&api, &name, &ns).await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    let _c = ControllerProcess::start_cluster_wide("cluster-deleting").await?;
    cluster_mutex_pipeline(&ns, &name).await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    kubectl(&["delete", "clustermutex", &name, "--wait=false"])?;
    ns.apply(&pipeline_run("b", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "LockDeleted", slow()).await?;
    let held = api.get(&name).await?.status.unwrap_or_default();
    ensure!(held.holders.len() == 1, "a lost its slot: {held:?}");
    release(&ns, "a").await?;
    succeeded(&ns, "a").await?;
    wait_until("the drained ClusterMutex to go", slow(), || async {
        Ok(api.get_opt(&name).await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}
