//! The intake of PipelineRuns queued as a whole, and what wakes it: a change of a
//! PipelineRun that asks to be queued or that a selector may take, and a lock's selector
//! appearing or changing (the PipelineRuns the admission policy made Pending that it may now
//! take: one may have been created before the controller's cache showed the lock). Only a
//! lock's new generation (its spec) wakes them: its status writes, one per grant, do not.

use super::cache::shared::ChangeStream;
use super::context::scoped;
use super::reconcile::intake::triggers_where;
use super::reconcile::queued_intake;
use super::reconcile::selection::awaits_selection;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use crate::model::tekton::pipelinerun::PipelineRun;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, predicates, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

/// The intake controller of queued PipelineRuns: `changes` of the PipelineRuns in `prs`, and
/// every new spec of a Mutex (and ClusterMutex) that has a selector.
pub fn controller(
    changes: ChangeStream<PipelineRun>,
    prs: &Store<PipelineRun>,
    leading: &Option<watch::Receiver<bool>>,
    client: &Client,
    namespace: &Option<String>,
    wc: &watcher::Config,
    cluster_mutexes: bool,
) -> Controller<PipelineRun> {
    let triggers = triggers_where(changes, prs, leading.clone(), queued_intake::needs_intake);
    let queued = Controller::for_shared_stream(triggers, prs.clone());
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
    if !cluster_mutexes {
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
