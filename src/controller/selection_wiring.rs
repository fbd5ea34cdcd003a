//! What brings a PipelineRun back to selection when a lock's selector appears or
//! changes: the PipelineRuns created Pending without an annotation that it may now take
//! (one may have been created before the controller's cache showed the lock).

use super::context::scoped;
use super::reconcile::selection::awaits_selection;
use super::wiring::Served;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use crate::model::tekton::pipelinerun::PipelineRun;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, ResourceExt};

/// `queued`, also woken by every Mutex (and ClusterMutex) that has a selector.
pub fn watch_selectors(
    queued: Controller<PipelineRun>,
    client: &Client,
    namespace: &Option<String>,
    wc: &watcher::Config,
    kinds: &Served,
    prs: &Store<PipelineRun>,
) -> Controller<PipelineRun> {
    let in_namespace = prs.clone();
    let queued = queued.watches(
        scoped::<Mutex>(client, namespace),
        wc.clone(),
        move |m: Mutex| {
            let ns = m.namespace();
            let waiting = m
                .spec
                .selector
                .is_some()
                .then(|| unstamped(&in_namespace, ns.as_deref()));
            waiting.unwrap_or_default()
        },
    );
    if !kinds.cluster_mutexes {
        return queued;
    }
    let anywhere = prs.clone();
    queued.watches(
        Api::<ClusterMutex>::all(client.clone()),
        wc.clone(),
        move |c: ClusterMutex| {
            let waiting = c
                .spec
                .selector
                .is_some()
                .then(|| unstamped(&anywhere, None));
            waiting.unwrap_or_default()
        },
    )
}

/// The PipelineRuns (of `namespace`, or of all) that selection may take.
fn unstamped(prs: &Store<PipelineRun>, namespace: Option<&str>) -> Vec<ObjectRef<PipelineRun>> {
    prs.state()
        .iter()
        .filter(|pr| namespace.is_none() || pr.namespace().as_deref() == namespace)
        .filter(|pr| awaits_selection(pr))
        .map(|pr| ObjectRef::from_obj(pr.as_ref()))
        .collect()
}
