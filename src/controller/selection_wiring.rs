//! What brings a PipelineRun back to selection when a lock's selector appears or
//! changes: the PipelineRuns the admission policy made Pending that it may now take (one
//! may have been created before the controller's cache showed the lock). Only a lock's
//! new generation (its spec) wakes them: its status writes, one per grant, do not.

use super::context::scoped;
use super::reconcile::selection::awaits_selection;
use super::wiring::Served;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use crate::model::tekton::pipelinerun::PipelineRun;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

/// `queued`, also woken by every new spec of a Mutex (and ClusterMutex) that has a selector.
pub fn watch_selectors(
    queued: Controller<PipelineRun>,
    client: &Client,
    namespace: &Option<String>,
    wc: &watcher::Config,
    kinds: &Served,
    prs: &Store<PipelineRun>,
) -> Controller<PipelineRun> {
    let in_namespace = prs.clone();
    let queued = queued.watches_stream(
        specs(scoped::<Mutex>(client, namespace), wc),
        move |m: Mutex| {
            let waiting = m
                .spec
                .selector
                .is_some()
                .then(|| unstamped(&in_namespace, m.namespace().as_deref()));
            waiting.unwrap_or_default()
        },
    );
    if !kinds.cluster_mutexes {
        return queued;
    }
    let anywhere = prs.clone();
    queued.watches_stream(
        specs(Api::<ClusterMutex>::all(client.clone()), wc),
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

/// The objects of `api` each time their spec changes.
fn specs<K>(
    api: Api<K>,
    wc: &watcher::Config,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned + Send + 'static,
{
    watcher(api, wc.clone())
        .default_backoff()
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default())
}

/// The PipelineRuns (of `namespace`, or of all) that wait for a selector to take them.
fn unstamped(prs: &Store<PipelineRun>, namespace: Option<&str>) -> Vec<ObjectRef<PipelineRun>> {
    prs.state()
        .iter()
        .filter(|pr| namespace.is_none() || pr.namespace().as_deref() == namespace)
        .filter(|pr| awaits_selection(pr))
        .map(|pr| ObjectRef::from_obj(pr.as_ref()))
        .collect()
}
