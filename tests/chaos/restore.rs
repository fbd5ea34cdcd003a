//! Issue 49's `etcd-restore`: etcd snapshotted while a key is held and waited on, the round let
//! go on (grants happen), then etcd restored from the snapshot as Kubernetes documents it
//! (`support::components::restore_etcd`: the revision bumped and marked compacted, so every
//! watch lists again). The restore takes PipelineRuns, lock runs, Mutexes and the token ledger
//! back together; Tekton's controller is restarted and the round's pods run again (see
//! [`restore`]), the controller under test is left as it is. How the checker judges such a round:
//! `checker::EtcdRestore`.

use super::faults;
use super::observe;
use crate::support::components::{etcd_snapshot, restart_component, restore_etcd, wait_api};
use crate::support::{secs, wait_until};
use anyhow::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

/// Waits (bounded, 20 s) until a run waits for a key (run `preferred` if it does), then
/// snapshots etcd to `to`. Returns the waiter seen, if any.
pub async fn snapshot(
    client: &Client,
    ns: &str,
    preferred: &str,
    to: &Path,
) -> Result<Option<String>> {
    let waiter = wait_until("a run to wait for a key", secs(20), || async {
        Ok(faults::a_waiter(client, ns, preferred).await.ok().flatten())
    })
    .await
    .ok();
    etcd_snapshot(to)?;
    Ok(waiter)
}

/// The components restarted after a restore, as Kubernetes' restore procedure asks of those
/// that cache the API (they would go on from objects the restore took away): not the
/// controller under test, which must cope by itself.
const CACHING: [&str; 2] = ["kube-controller-manager", "tekton-controller"];

/// Restores etcd from `from`, waits for the API server, restarts the [`CACHING`] components
/// and deletes the round's TaskRun pods; the snapshot file goes. Returns how many pods went.
///
/// The pods: the restore brings back as Running pods whose steps had ended since, and the
/// stand-in kubelet, which keeps no status resync as a kubelet does, would never report them
/// again. Deleted, Tekton creates each again (a TaskRun whose pod is missing gets a new one) and
/// its steps run again, under the grant the restore left them.
pub async fn restore(client: &Client, ns: &str, from: &Path) -> Result<usize> {
    restore_etcd(from).await?;
    wait_api(client).await?;
    let _ = std::fs::remove_file(from);
    for name in CACHING {
        restart_component(name, Duration::ZERO).await?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels("tekton.dev/pipelineRun");
    let mut deleted = 0;
    for pod in pods.list(&lp).await?.items {
        if pods
            .delete(&pod.name_any(), &DeleteParams::default())
            .await
            .is_ok()
        {
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Of the PipelineRuns `names` (created before the restore began), those the restore erased:
/// created after the snapshot. The campaign counts them as deleted (it waits for them no more);
/// their deploys, if any, are still sections of their keys.
pub async fn erased(client: &Client, ns: &str, names: &[String]) -> Result<BTreeSet<String>> {
    let there = observe::pipeline_runs(client, ns).await?;
    Ok(names
        .iter()
        .filter(|n| !there.contains_key(*n))
        .cloned()
        .collect())
}
