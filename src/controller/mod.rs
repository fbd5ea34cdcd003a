//! Wiring: two controllers over shared caches.
//!
//! - `intake` reconciles each Mutex run: it rejects bad input and makes sure
//!   the Mutex object for the run's key exists.
//! - `sync` reconciles each Mutex object (one per key): it reads the key's runs,
//!   asks the pure decision core what to do, and applies it. It is triggered by
//!   changes to the Mutex, to its runs, to their PipelineRuns and to those
//!   PipelineRuns' live pods, so a holder's end (its last pod gone) hands the
//!   slot over straight from the watch event.

mod intake;
mod sync;
#[cfg(test)]
mod tests;
mod triggers;
mod writes;

use crate::metrics::{self, Metrics};
use crate::mutex::Mutex;
use crate::observe::{LIVE_PODS, PIPELINE_RUN_LABEL};
use crate::tekton::customrun::CustomRun;
use crate::tekton::pipelinerun::PipelineRun;
use crate::tekton::run::Run;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};
use triggers::{Triggers, mutex_of};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the Mutex changed while deciding; deciding again")]
    Conflict,
    #[error("the {0} CRD is not installed: {1}")]
    MissingCrd(&'static str, String),
    #[error("cannot serve http: {0}")]
    Http(#[from] std::io::Error),
}

/// Where the controller acts: the whole cluster or one namespace.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub namespace: Option<String>,
    /// Test hook: exit between the two writes of a supersede.
    pub fault: Option<Fault>,
    /// Where to serve /healthz, /readyz and /metrics; None serves nothing.
    pub http_addr: Option<std::net::SocketAddr>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Exit after the lock state records a supersede, before the PipelineRun
    /// is cancelled and the run marked.
    ExitAfterLockWrite,
}

pub struct Context {
    client: Client,
    custom_runs: Option<Store<CustomRun>>,
    runs: Option<Store<Run>>,
    pipeline_runs: Store<PipelineRun>,
    mutexes: Store<Mutex>,
    recorder: Recorder,
    fault: Option<Fault>,
    metrics: Arc<Metrics>,
}

fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// Is the CRD behind this API served? (404 means not installed.)
async fn served<K>(api: &Api<K>) -> Result<bool, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(&kube::api::ListParams::default().limit(1)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

pub async fn run(client: Client, opts: Options) -> Result<(), Error> {
    let mutexes: Api<Mutex> = scoped(&client, &opts.namespace);
    let custom_runs: Api<CustomRun> = scoped(&client, &opts.namespace);
    let runs: Api<Run> = scoped(&client, &opts.namespace);
    let pipeline_runs: Api<PipelineRun> = scoped(&client, &opts.namespace);

    if !served(&mutexes).await? {
        return Err(Error::MissingCrd(
            "Mutex",
            "install it with `kubectl apply -f config/`".into(),
        ));
    }
    // Tekton v0.43 to v0.46 serve both kinds; newer ones only CustomRun, older ones only Run.
    let with_custom_runs = served(&custom_runs).await?;
    let with_runs = served(&runs).await?;
    if !with_custom_runs && !with_runs {
        return Err(Error::MissingCrd(
            "CustomRun",
            "install Tekton Pipelines (CustomRun, or Run before v0.47)".into(),
        ));
    }
    let metrics = Arc::new(Metrics::default());
    if let Some(addr) = opts.http_addr {
        tokio::spawn(metrics::serve(metrics::bind(addr).await?, metrics.clone()));
    }
    info!(
        namespace = opts.namespace.as_deref().unwrap_or("<all>"),
        v1beta1_customruns = with_custom_runs,
        v1alpha1_runs = with_runs,
        "starting tekton-mutex"
    );

    let wc = watcher::Config::default();
    let (pr_store, pr_writer) = reflector::store();
    let pr_stream = reflector::reflector(pr_writer, watcher(pipeline_runs, wc.clone()))
        .default_backoff()
        .touched_objects();

    let intake_crs = with_custom_runs.then(|| Controller::new(custom_runs.clone(), wc.clone()));
    let cr_store = intake_crs.as_ref().map(|c| c.store());
    let intake_runs = with_runs.then(|| Controller::new(runs.clone(), wc.clone()));
    let run_store = intake_runs.as_ref().map(|c| c.store());

    let sync = Controller::new(mutexes, wc.clone());
    let triggers = Triggers {
        custom_runs: cr_store.clone(),
        runs: run_store.clone(),
        mutexes: sync.store(),
    };
    let sync = watch_related(
        sync,
        &client,
        &opts,
        triggers,
        pr_stream,
        with_custom_runs,
        with_runs,
    );

    let reporter = Reporter {
        controller: "tekton-mutex".into(),
        instance: std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok()),
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        custom_runs: cr_store,
        runs: run_store,
        pipeline_runs: pr_store,
        mutexes: sync.store(),
        fault: opts.fault,
        metrics: metrics.clone(),
    });
    metrics
        .ready
        .store(true, std::sync::atomic::Ordering::Relaxed);

    let mut loops = vec![
        sync.shutdown_on_signal()
            .run(sync::reconcile, error_policy, ctx.clone())
            .for_each(|res| async move { log_result("mutex", res) })
            .boxed(),
    ];
    if let Some(c) = intake_crs {
        loops.push(
            c.shutdown_on_signal()
                .run(intake::reconcile::<CustomRun>, error_policy, ctx.clone())
                .for_each(|res| async move { log_result("customrun", res) })
                .boxed(),
        );
    }
    if let Some(c) = intake_runs {
        loops.push(
            c.shutdown_on_signal()
                .run(intake::reconcile::<Run>, error_policy, ctx.clone())
                .for_each(|res| async move { log_result("run", res) })
                .boxed(),
        );
    }
    futures::future::join_all(loops).await;
    info!("stopped");
    Ok(())
}

/// What wakes a key: its runs, their PipelineRuns, and the pods of those.
fn watch_related(
    mut sync: Controller<Mutex>,
    client: &Client,
    opts: &Options,
    triggers: Triggers,
    pr_stream: impl futures::Stream<Item = Result<PipelineRun, watcher::Error>> + Send + 'static,
    with_custom_runs: bool,
    with_runs: bool,
) -> Controller<Mutex> {
    let wc = watcher::Config::default();
    let by_pr = triggers.clone();
    sync = sync.watches_stream(pr_stream, move |pr: PipelineRun| {
        by_pr.of_pipeline_run(pr.namespace(), &pr.name_any())
    });
    // Only pods of PipelineRuns that have not ended: a pod leaving this selector
    // (it ended, or was removed) is what frees a draining holder's slot.
    let pods: Api<PartialObjectMeta<Pod>> = scoped(client, &opts.namespace);
    let live_pods = wc.clone().labels(PIPELINE_RUN_LABEL).fields(LIVE_PODS);
    let pod_stream = watcher(pods, live_pods).default_backoff().touched_objects();
    sync = sync.watches_stream(pod_stream, move |pod: PartialObjectMeta<Pod>| {
        match pod.labels().get(PIPELINE_RUN_LABEL) {
            Some(pr) => triggers.of_pipeline_run(pod.namespace(), pr),
            None => Vec::new(),
        }
    });
    if with_custom_runs {
        let api: Api<CustomRun> = scoped(client, &opts.namespace);
        sync = sync.watches(api, wc.clone(), |cr| mutex_of(&cr));
    }
    if with_runs {
        let api: Api<Run> = scoped(client, &opts.namespace);
        sync = sync.watches(api, wc, |r| mutex_of(&r));
    }
    sync
}

fn log_result<K, E: std::fmt::Display, W: std::fmt::Display>(
    what: &str,
    res: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, W>>,
) where
    K: Resource,
    K::DynamicType: std::fmt::Debug,
{
    match res {
        Ok(_) => {}
        // Triggers for objects that are gone (or not created yet) are expected.
        Err(kube::runtime::controller::Error::ObjectNotFound(_)) => {}
        Err(e) => warn!(controller = what, error = %e, "reconcile failed"),
    }
}

fn error_policy<K>(_obj: Arc<K>, err: &Error, ctx: Arc<Context>) -> Action {
    Metrics::inc(&ctx.metrics.reconcile_errors);
    match err {
        Error::Conflict => Action::requeue(Duration::from_millis(50)),
        _ => Action::requeue(Duration::from_secs(2)),
    }
}
