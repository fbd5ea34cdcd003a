//! The ClusterMutex controller: the lock engine over ClusterMutexes,
//! woken by their runs, those runs' PipelineRuns and the live pods of those.
//! It runs only where ClusterMutexes can be read (the cluster-wide install).

use crate::controller::cache::index::{Indexed, Tag};
use crate::controller::cache::shared::{self, ChangeStream};
use crate::controller::context::Error;
use crate::controller::context::scoped;
use crate::core::observe::{LIVE_PODS, Observe};
use crate::model::cluster_mutex::{ClusterMutex, qualify};
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::labels::PIPELINE_RUN_LABEL;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::sync::Arc;
use tracing::warn;

/// Can this controller read ClusterMutexes? Not when the CRD is missing, nor
/// under the namespace-scoped install (a Role cannot grant a cluster-scoped kind).
pub async fn served(client: &Client) -> Result<bool, Error> {
    let api: Api<ClusterMutex> = Api::all(client.clone());
    match api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => {
            warn!(
                code = e.code,
                "ClusterMutexes cannot be read: runs that refer to one wait for a controller that can"
            );
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

/// The ClusterMutexes a run refers to (several with `keys`), if any.
fn cluster_of<K: Observe>(obj: &K) -> Vec<ObjectRef<ClusterMutex>> {
    match crate::core::observe::cluster_mutex_targets(&obj.observe()) {
        Some(Ok(names)) => names.iter().map(|n| ObjectRef::new(n)).collect(),
        _ => Vec::new(),
    }
}

/// The ClusterMutexes PipelineRun `ns/name` waits for or holds.
#[derive(Clone)]
struct ByPipelineRun {
    custom_runs: Option<Indexed<CustomRun>>,
    runs: Option<Indexed<Run>>,
    clusters: Store<ClusterMutex>,
}

impl ByPipelineRun {
    fn refs(&self, ns: Option<String>, name: &str) -> Vec<ObjectRef<ClusterMutex>> {
        let ns = ns.unwrap_or_default();
        let tag = Tag::pipeline_run(&ns, name);
        let mut refs: Vec<ObjectRef<ClusterMutex>> = Vec::new();
        if let Some(c) = &self.custom_runs {
            refs.extend(c.get(&tag).iter().flat_map(|r| cluster_of(r.as_ref())));
        }
        if let Some(c) = &self.runs {
            refs.extend(c.get(&tag).iter().flat_map(|r| cluster_of(r.as_ref())));
        }
        // ClusterMutexes are few (an administrator creates each): scanning them is cheap.
        let qualified = qualify(&ns, name);
        let holds = |cm: &ClusterMutex| {
            cm.status.as_ref().is_some_and(|s| {
                s.holders
                    .iter()
                    .any(|h| h.pipeline_run.as_deref() == Some(qualified.as_str()))
            })
        };
        let held = self.clusters.state().into_iter().filter(|cm| holds(cm));
        refs.extend(held.map(|cm| ObjectRef::from_obj(cm.as_ref())));
        refs.sort_by(|a, b| a.name.cmp(&b.name));
        refs.dedup();
        refs
    }
}

/// The shared watches' caches and change streams that wake a ClusterMutex.
pub struct Feeds {
    pub custom_runs: Option<(Indexed<CustomRun>, ChangeStream<CustomRun>)>,
    pub runs: Option<(Indexed<Run>, ChangeStream<Run>)>,
    pub pipeline_runs: ChangeStream<PipelineRun>,
}

/// The ClusterMutex controller, woken by what wakes a Mutex's sync: the runs
/// and PipelineRuns of the shared watches (each kind is watched once), and the
/// live pods of those PipelineRuns.
/// With it, the signal that its cache holds its first full list (selection reads it).
pub fn controller(
    client: &Client,
    namespace: &Option<String>,
    feeds: Feeds,
) -> (Controller<ClusterMutex>, shared::Listed) {
    let wc = watcher::Config::default();
    let (clusters, store, listed) = listed_cluster_mutexes(client, &wc);
    let mut c = Controller::for_stream(clusters, store);
    let (custom_runs, cr_changes) = feeds.custom_runs.unzip();
    let (runs, run_changes) = feeds.runs.unzip();
    let by_pr = ByPipelineRun {
        custom_runs,
        runs,
        clusters: c.store(),
    };
    if let Some(changes) = cr_changes {
        c = c.watches_shared_stream(changes, |r| cluster_of(r.as_ref()));
    }
    if let Some(changes) = run_changes {
        c = c.watches_shared_stream(changes, |r| cluster_of(r.as_ref()));
    }
    let by = by_pr.clone();
    c = c.watches_shared_stream(feeds.pipeline_runs, move |pr: Arc<PipelineRun>| {
        let mut refs = by.refs(pr.namespace(), &pr.name_any());
        refs.extend(crate::controller::cache::triggers::queued_cluster_mutexes(
            &pr,
        ));
        refs
    });
    let pods: Api<PartialObjectMeta<Pod>> = scoped(client, namespace);
    let live = wc.labels(PIPELINE_RUN_LABEL).fields(LIVE_PODS);
    let pods = watcher(pods, live).default_backoff().touched_objects();
    let c = c.watches_stream(pods.boxed(), move |pod: PartialObjectMeta<Pod>| {
        match pod.labels().get(PIPELINE_RUN_LABEL) {
            Some(pr) => by_pr.refs(pod.namespace(), pr),
            None => Vec::new(),
        }
    });
    (c, listed)
}

/// The ClusterMutexes, cached, and a signal that turns true once the cache holds its first
/// full list. (kube's `Store::wait_until_ready` wakes one waiter, and the controller is it.)
fn listed_cluster_mutexes(
    client: &Client,
    wc: &watcher::Config,
) -> (
    impl futures::Stream<Item = Result<ClusterMutex, watcher::Error>> + Send + 'static,
    Store<ClusterMutex>,
    shared::Listed,
) {
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let (store, writer) = kube::runtime::reflector::store();
    let events = watcher(Api::<ClusterMutex>::all(client.clone()), wc.clone())
        .default_backoff()
        .reflect(writer)
        .inspect(move |e| {
            if matches!(e, Ok(watcher::Event::InitDone)) {
                listed_tx.send_replace(true);
            }
        });
    (shared::applied_once_stored(events), store, listed)
}
