//! Fencing survives an etcd restore (issue 49 item 4). A snapshot of the cluster's etcd is taken
//! while a key is held and waited on; the key then grants twice more; etcd is restored from the
//! snapshot (as Kubernetes documents it: `etcdutl snapshot restore`, the revision bumped and
//! marked compacted). The restore rolls back the lock, its runs and the token ledger together and
//! keeps the lock's uid, so nothing in the cluster remembers the later tokens: only the clock
//! does (tokens follow it, `mutex::next_token`). The next grant must be above every token handed
//! out before the restore, and the controller, which is not restarted, must tell it: its memos of
//! what it wrote go by resourceVersions, which the restore brings back (`cache::told`).
//!
//! The runs are standalone CustomRuns (held until deleted): a PipelineRun's own state after a
//! restore is the Tekton controller's, which decides from its caches of before the restore.
//! It restarts etcd and the kube-apiserver, so it is a test binary of its own (cargo runs one
//! binary at a time).

mod support;

use anyhow::{Result, ensure};
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use support::components::{cluster_dir, etcd_snapshot, restore_etcd, wait_api};
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::*;
use tekton_mutex::model::tekton::customrun::CustomRun;

const KEY: &str = "env";

/// A CustomRun that takes `KEY` with no PipelineRun: it holds until it is deleted.
async fn create(ns: &TestNamespace, name: &str) -> Result<()> {
    let run: CustomRun = serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
        "metadata": {"name": name},
        "spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
                 "params": [{"name": "key", "value": KEY}, {"name": "supersede", "value": "none"}]},
    }))?;
    ns.api::<CustomRun>()
        .create(&PostParams::default(), &run)
        .await?;
    Ok(())
}

/// `holder` is deleted and `next` is granted: `next`'s token.
async fn hand_over(ns: &TestNamespace, holder: &str, next: &str) -> Result<i64> {
    ns.api::<CustomRun>()
        .delete(holder, &DeleteParams::default())
        .await?;
    wait_reason(ns, next, "Acquired", slow()).await?;
    token_result(ns, next).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn tokens_stay_above_every_earlier_one_after_an_etcd_restore() -> Result<()> {
    let ns = TestNamespace::create("etcd-restore").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    create(&ns, "r1").await?;
    wait_reason(&ns, "r1", "Acquired", slow()).await?;
    create(&ns, "r2").await?;
    wait_reason(&ns, "r2", "Waiting", slow()).await?;
    let t1 = token_result(&ns, "r1").await?;

    // Beside the cluster's state, which `hack/cluster.sh down` removes.
    let snapshot = cluster_dir().join(format!("{}.etcd-snapshot", ns.name()));
    etcd_snapshot(&snapshot)?;

    // After the snapshot: r2, then r3, hold the key.
    let t2 = hand_over(&ns, "r1", "r2").await?;
    create(&ns, "r3").await?;
    wait_reason(&ns, "r3", "Waiting", slow()).await?;
    let t3 = hand_over(&ns, "r2", "r3").await?;
    ensure!(t1 < t2 && t2 < t3, "tokens rise: {t1}, {t2}, {t3}");

    restore_etcd(&snapshot).await?;
    wait_api(&ns.client()).await?;
    std::fs::remove_file(&snapshot)?;
    // The restore took: the key is as the snapshot had it, r1 holding with its token.
    let st = mutex_status(&ns, KEY).await?;
    ensure!(
        st.last_token == t1 && st.holders.len() == 1 && st.holders[0].token == t1,
        "the lock is not as the snapshot had it: {st:?}"
    );

    // r1 goes: r2, waiting again, is granted again, above every token of before the restore.
    let again = hand_over(&ns, "r1", "r2").await?;
    ensure!(
        again > t3,
        "a token handed out again after the etcd restore: {t1}, {t2}, {t3}, then {again}"
    );
    eprintln!("MEASUREMENT etcd restore: tokens {t1}, {t2}, {t3}; after the restore {again}");
    Ok(())
}
