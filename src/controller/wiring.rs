//! Building and running the controllers over shared caches, optionally behind
//! a leader Lease.

use super::backoff::backoff_key;
use super::cache::index::{Index, Indexed};
use super::cache::shared::{self, ChangeStream, SharedWatch};
use super::cache::told::{HistoryBreaks, Told, Written};
use super::cache::triggers::{
    Triggers, mutex_of, mutex_tags, queued_mutexes, queued_tags, run_tags,
};
use super::cache::{strip, tolerant};
use super::cluster_wiring;
#[cfg(feature = "fault-injection")]
use super::context::Fault;
use super::context::{Context, Error, scoped};
use super::crd_wait;
use super::leader::LeaderElection;
use super::leader::{self, became_leader};
use super::lock_object::LockObject;
use super::queued_wiring;
use super::reconcile::{intake, lock as sync, queued_intake, token_floor};
use super::recorder::EventRecorder;
use super::wake::Wake;
use crate::core::observe::{LIVE_PODS, Observe};
use crate::http::{self, Health};
use crate::metrics::Metrics;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::labels::PIPELINE_RUN_LABEL;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

/// How the controller runs.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Where it acts: one namespace, or None for the whole cluster.
    pub namespace: Option<String>,
    /// Where to serve /healthz, /readyz and /metrics; None serves nothing.
    pub http_addr: Option<std::net::SocketAddr>,
    /// Act only while holding this Lease; None acts at once.
    pub leader_election: Option<LeaderElection>,
    /// How long to wait at start for the CRDs to be served (zero: check once).
    pub crd_wait: Duration,
    /// The namespace of the ClusterMutexes' token ledger; empty: kube-system
    /// ([`CLUSTER_LEDGER_NAMESPACE`](super::CLUSTER_LEDGER_NAMESPACE)).
    pub cluster_ledger_namespace: String,
    /// Test hook: exit between the two writes of a supersede.
    #[cfg(feature = "fault-injection")]
    pub fault: Option<Fault>,
}

/// Is the CRD behind this API served? (404 means not installed.)
async fn served<K>(api: &Api<K>) -> Result<bool, kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // Metadata only: one object the types cannot read must not fail the check.
    match api
        .list_metadata(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// Which run kinds this cluster serves.
struct Served {
    custom_runs: bool,
    runs: bool,
    /// ClusterMutexes can be read (CRD installed, cluster-wide rights).
    cluster_mutexes: bool,
}

/// Names the missing CRD the controller needs, with the fix (see [`crd_wait`]).
async fn check_crds(client: &Client, namespace: &Option<String>) -> Result<Served, Error> {
    if !served(&scoped::<Mutex>(client, namespace)).await? {
        return Err(Error::MissingCrd(
            "Mutex",
            "install it with `kubectl apply -f config/`".into(),
        ));
    }
    // Tekton v0.43 to v0.46 serve both kinds; newer ones only CustomRun, older ones only Run.
    let custom_runs = served(&scoped::<CustomRun>(client, namespace)).await?;
    let runs = served(&scoped::<Run>(client, namespace)).await?;
    if !custom_runs && !runs {
        return Err(Error::MissingCrd(
            "CustomRun",
            "install Tekton Pipelines (CustomRun, or Run before v0.47)".into(),
        ));
    }
    Ok(Served {
        custom_runs,
        runs,
        cluster_mutexes: cluster_wiring::served(client).await?,
    })
}

/// Runs the controller until SIGTERM/SIGINT (or, under leader election,
/// until it loses the Lease).
pub async fn run(client: Client, opts: Options) -> Result<(), Error> {
    let state = Arc::new(http::State {
        health: Health::default(),
        metrics: Arc::new(Metrics::new()),
    });
    // Served while the CRDs are awaited: live (no restart), not ready.
    if let Some(addr) = opts.http_addr {
        tokio::spawn(http::serve(http::bind(addr).await?, state.clone()));
    }
    let check = || check_crds(&client, &opts.namespace);
    let kinds = crd_wait::wait_for(opts.crd_wait, check).await?;
    let cluster_ledger = match opts.cluster_ledger_namespace.as_str() {
        "" => token_floor::CLUSTER_LEDGER_NAMESPACE.to_string(),
        ns => ns.to_string(),
    };
    info!(
        version = crate::VERSION,
        revision = crate::REVISION,
        namespace = opts.namespace.as_deref().unwrap_or("<all>"),
        v1beta1_customruns = kinds.custom_runs,
        v1alpha1_runs = kinds.runs,
        leader_election = opts.leader_election.is_some(),
        cluster_mutex_ledger = %match kinds.cluster_mutexes {
            true => format!("{cluster_ledger}/{}", token_floor::LEDGER),
            false => "none (ClusterMutexes are not served)".into(),
        },
        "starting tekton-mutex"
    );
    // Nobody acts before every cache holds its first list: a run decided on a cache that
    // lacks its lock (or the selector that takes it) would be decided wrong, and once only.
    // Turning to acting reconciles everything, as a new leader does.
    let (acting_tx, acting_rx) = watch::channel(false);
    let leading = Some(acting_rx.clone());
    let controllers = Controllers::new(&client, &opts.namespace, &kinds, &state.metrics, &leading);
    let ctx = context(
        &client,
        &controllers,
        &opts,
        &state,
        acting_rx.clone(),
        cluster_ledger,
    );
    state.metrics.watch_mutexes(ctx.mutexes.clone());
    if let Some(store) = &ctx.cluster_mutexes {
        state.metrics.watch_cluster_mutexes(store.clone());
    }
    if kinds.cluster_mutexes {
        tokio::spawn(carry_over_cluster_ledger(ctx.clone()));
    }
    tokio::spawn(ctx.recorder.clone().renew_while_quiet());
    let synced = caches_synced(ctx.clone(), state.clone()).boxed().shared();
    tokio::spawn(synced.clone());
    let loops = controllers.run(ctx, leading);
    let result = match opts.leader_election {
        None => {
            act_once_synced(synced, acting_tx, loops).await;
            Ok(())
        }
        Some(le) => leader::act_while_leading(client, le, synced, acting_tx, loops).await,
    };
    state.health.stopped.store(true, Ordering::Relaxed);
    info!("stopped");
    result
}

/// What every reconcile shares, over the controllers' caches. (`opts` gives only the test
/// hook's fault, which release builds lack.)
#[cfg_attr(not(feature = "fault-injection"), allow(unused_variables))]
fn context(
    client: &Client,
    controllers: &Controllers,
    opts: &Options,
    state: &http::State,
    acting: watch::Receiver<bool>,
    cluster_ledger: String,
) -> Arc<Context> {
    Arc::new(Context {
        recorder: EventRecorder::new(client.clone(), reporter()),
        client: client.clone(),
        custom_runs: controllers.caches.custom_runs.clone(),
        runs: controllers.caches.runs.clone(),
        pipeline_runs: controllers.caches.pipeline_runs.store.clone(),
        queued_runs: controllers.caches.pipeline_runs.index.clone(),
        listed: controllers.caches.listed.clone(),
        mutexes: controllers.sync.store(),
        cluster_mutexes: controllers.cluster.as_ref().map(|c| c.store()),
        wake: controllers.wake.clone(),
        #[cfg(feature = "fault-injection")]
        fault: opts.fault,
        #[cfg(not(feature = "fault-injection"))]
        fault: None,
        metrics: state.metrics.clone(),
        backoff: Default::default(),
        told: Told::new(controllers.caches.breaks.clone()),
        written: Written::new(controllers.caches.breaks.clone()),
        cluster_written: Written::new(controllers.caches.breaks.clone()),
        history_breaks: controllers.caches.breaks.clone(),
        acting,
        previous_cluster_ledger: token_floor::previous_cluster_ledger(&cluster_ledger),
        cluster_ledger_namespace: cluster_ledger,
        ledger_writes: Default::default(),
        undelivered: Default::default(),
    })
}

/// Upgrade only: the ClusterMutexes' token floors of an earlier release's ledger, copied into
/// the new one (token_floor::carry_over) once this replica acts. A failure is not fatal: the
/// floors are still read from there while this release runs, and the next start tries again.
async fn carry_over_cluster_ledger(ctx: Arc<Context>) {
    // A standby leaves every object alone, this ledger too.
    if ctx.acting.clone().wait_for(|acting| *acting).await.is_err() {
        return;
    }
    let (from, to) = (&ctx.previous_cluster_ledger, &ctx.cluster_ledger_namespace);
    match token_floor::carry_over(&ctx).await {
        Ok(0) => {}
        Ok(n) => info!(
            entries = n,
            ?from,
            to,
            "carried the ClusterMutexes' token floors over to their new ledger"
        ),
        Err(e) => {
            warn!(error = %e, ?from, to, "could not carry the ClusterMutexes' token floors over to their new ledger; they are still read where they are")
        }
    }
}

/// Who writes the Events: this pod, when the Deployment says so.
fn reporter() -> Reporter {
    Reporter {
        controller: "tekton-mutex".into(),
        instance: std::env::var("POD_NAME")
            .ok()
            .or_else(|| std::env::var("HOSTNAME").ok()),
    }
}

/// A lone replica (no leader election) acts from the moment its caches are listed.
async fn act_once_synced(
    synced: impl Future<Output = ()>,
    acting: watch::Sender<bool>,
    loops: impl Future<Output = ()>,
) {
    let act = async move {
        synced.await;
        acting.send_replace(true);
        std::future::pending::<()>().await
    };
    tokio::select! {
        () = loops => {}
        () = act => {}
    }
}

/// Resolves once every cache has its first full list, and marks /readyz.
async fn caches_synced(ctx: Arc<Context>, state: Arc<http::State>) {
    shared::all_listed(&ctx.listed).await;
    state.health.ready.store(true, Ordering::Relaxed);
    info!("caches synced");
}

/// The three controllers, built but not yet running, and the caches they share.
struct Controllers {
    sync: Controller<Mutex>,
    custom_runs: Option<Controller<CustomRun>>,
    runs: Option<Controller<Run>>,
    cluster: Option<Controller<ClusterMutex>>,
    /// Intake of the PipelineRuns queued as a whole.
    queued: Controller<PipelineRun>,
    caches: Caches,
    /// How a lock's sync wakes another's (the two lock controllers reconcile on it).
    wake: Wake,
}

/// What the reconcilers read besides the Mutexes.
struct Caches {
    custom_runs: Option<Indexed<CustomRun>>,
    runs: Option<Indexed<Run>>,
    pipeline_runs: Indexed<PipelineRun>,
    listed: Vec<shared::Listed>,
    breaks: HistoryBreaks,
}

/// The shared watches: PipelineRuns, and each run kind split between its consumers.
struct Watches {
    prs: SharedWatch<PipelineRun>,
    crs: Option<Split<CustomRun>>,
    runs: Option<Split<Run>>,
    /// Every watch's failures and new lists (the memos of `cache::told` go by them).
    breaks: HistoryBreaks,
}

impl Watches {
    fn new(
        client: &Client,
        namespace: &Option<String>,
        wc: &watcher::Config,
        kinds: &Served,
        leading: &Option<watch::Receiver<bool>>,
    ) -> Self {
        // The ClusterMutex controller, when there is one, is one more consumer.
        let cluster = usize::from(kinds.cluster_mutexes);
        let breaks = HistoryBreaks::default();
        let prs = shared::watch(
            scoped::<PipelineRun>(client, namespace),
            wc.clone(),
            strip::pipeline_run,
            Index::new(queued_tags),
            2 + cluster,
            breaks.clone(),
        );
        // Runs are watched once: intake and the key's sync share the watch, and
        // the sync hears of a run only once the cache it reads has it.
        let consumers = 2 + cluster;
        let crs = kinds.custom_runs.then(|| {
            let api = scoped(client, namespace);
            let watch = run_watch(api, wc, strip::custom_run, consumers, &breaks);
            split(watch, leading)
        });
        let runs = kinds.runs.then(|| {
            let api = scoped(client, namespace);
            split(run_watch(api, wc, strip::run, consumers, &breaks), leading)
        });
        Watches {
            prs,
            crs,
            runs,
            breaks,
        }
    }
}

impl Watches {
    /// Each watch's first-list signal: /readyz waits for them all.
    fn listed(&self) -> Vec<shared::Listed> {
        let mut listed = vec![self.prs.listed.clone()];
        listed.extend(self.crs.as_ref().map(|s| s.listed.clone()));
        listed.extend(self.runs.as_ref().map(|s| s.listed.clone()));
        listed
    }
}

/// Objects per page of a watch's list. Pages are decoded whole; at kube's
/// default of 500, a page of PipelineRuns with their embedded pipeline specs
/// was a fifth of the controller's peak memory on a cluster of 10,000.
const LIST_PAGE: u32 = 100;

impl Controllers {
    fn new(
        client: &Client,
        namespace: &Option<String>,
        kinds: &Served,
        metrics: &Arc<Metrics>,
        leading: &Option<watch::Receiver<bool>>,
    ) -> Self {
        let wc = watcher::Config::default().page_size(LIST_PAGE);
        let watches = Watches::new(client, namespace, &wc, kinds, leading);
        let mut listed = watches.listed();
        let breaks = watches.breaks.clone();
        let Watches { prs, crs, runs, .. } = watches;
        let (cr_cache, run_cache) = (Split::cache(&crs), Split::cache(&runs));
        let (crs, intake_crs, cluster_crs) = Split::parts(crs);
        let (runs, intake_runs, cluster_runs) = Split::parts(runs);

        let SharedWatch {
            cache: pr_cache,
            changes: mut pr_changes,
            ..
        } = prs;
        let queued = queued_wiring::controller(
            pr_changes.pop().expect("one stream per consumer"),
            &pr_cache.store,
            leading,
            client,
            namespace,
            &wc,
            kinds.cluster_mutexes,
        );
        let related = Related {
            pipeline_runs: pr_changes.pop().expect("one stream per consumer"),
            custom_runs: crs,
            runs,
        };
        let (wake, woken) = Wake::new();
        let caches = (cr_cache.clone(), run_cache.clone());
        let sync = mutex_controller(
            client,
            namespace,
            &wc,
            caches,
            related,
            metrics,
            &mut listed,
        )
        .reconcile_on(woken.mutexes);
        let cluster = kinds.cluster_mutexes.then(|| {
            let feeds = cluster_wiring::Feeds {
                custom_runs: cr_cache.clone().zip(cluster_crs),
                runs: run_cache.clone().zip(cluster_runs),
                pipeline_runs: pr_changes.pop().expect("one stream per consumer"),
            };
            let (cluster, cluster_listed) = cluster_wiring::controller(client, namespace, feeds);
            listed.push(cluster_listed);
            cluster.reconcile_on(woken.cluster_mutexes)
        });
        Controllers {
            wake,
            cluster,
            sync,
            custom_runs: intake_crs,
            runs: intake_runs,
            queued,
            caches: Caches {
                custom_runs: cr_cache,
                runs: run_cache,
                pipeline_runs: pr_cache,
                listed,
                breaks,
            },
        }
    }

    /// Every controller loop, ending when a signal has drained them all.
    /// `leading` makes them reconcile everything each time this replica starts to
    /// act: once its caches are listed, and under leader election each time it
    /// becomes the leader (intake hears of its runs through its own triggers).
    fn run(
        self,
        ctx: Arc<Context>,
        leading: Option<watch::Receiver<bool>>,
    ) -> BoxFuture<'static, ()> {
        let mut loops = vec![drive(
            "mutex",
            self.sync,
            sync_when_acting::<Mutex>,
            &ctx,
            &leading,
        )];
        if let Some(c) = self.custom_runs {
            loops.push(drive(
                "customrun",
                c,
                intake_when_acting::<CustomRun>,
                &ctx,
                &None,
            ));
        }
        if let Some(c) = self.runs {
            loops.push(drive("run", c, intake_when_acting::<Run>, &ctx, &None));
        }
        loops.push(drive(
            "pipelinerun",
            self.queued,
            queued_intake_when_acting,
            &ctx,
            &None,
        ));
        if let Some(c) = self.cluster {
            let reconcile = sync_when_acting::<ClusterMutex>;
            loops.push(drive("clustermutex", c, reconcile, &ctx, &leading));
        }
        futures::future::join_all(loops).map(|_| ()).boxed()
    }
}

/// A run kind's shared watch, indexed by key, ClusterMutex and PipelineRun.
fn run_watch<K>(
    api: Api<K>,
    wc: &watcher::Config,
    strip: fn(&mut K),
    consumers: usize,
    breaks: &HistoryBreaks,
) -> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Observe + Send + Sync + 'static,
{
    let index = Index::new(run_tags::<K>);
    shared::watch(api, wc.clone(), strip, index, consumers, breaks.clone())
}

/// The Mutex sync's controller: its Mutexes, woken by their runs, those runs'
/// PipelineRuns and the live pods of those.
fn mutex_controller(
    client: &Client,
    namespace: &Option<String>,
    wc: &watcher::Config,
    (custom_runs, runs): (Option<Indexed<CustomRun>>, Option<Indexed<Run>>),
    related: Related,
    metrics: &Arc<Metrics>,
    listed: &mut Vec<shared::Listed>,
) -> Controller<Mutex> {
    let (mutexes, mutex_cache, mutexes_listed) = tolerant_mutexes(client, namespace, wc);
    listed.push(mutexes_listed);
    let sync = Controller::for_stream(mutexes, mutex_cache.store.clone());
    let triggers = Triggers {
        custom_runs,
        runs,
        mutexes: mutex_cache,
    };
    watch_related(sync, client, namespace, triggers, related, metrics.clone())
}

/// The Mutexes, read through [`tolerant`]: an object the types cannot read is
/// reported and left out, never failing the list of the others.
fn tolerant_mutexes(
    client: &Client,
    namespace: &Option<String>,
    wc: &watcher::Config,
) -> (
    impl Stream<Item = Result<Mutex, watcher::Error>> + Send + 'static,
    Indexed<Mutex>,
    shared::Listed,
) {
    let (listed_tx, listed) = watch::channel(false);
    let (store, mut writer) = reflector::store();
    let index = Index::new(mutex_tags);
    let cache = Indexed {
        store: store.clone(),
        index: index.clone(),
    };
    let recorder = EventRecorder::new(client.clone(), reporter());
    let events = watcher(tolerant::api(client, namespace), wc.clone())
        .default_backoff()
        .filter_map(move |e| {
            let typed = match e {
                Ok(e) => tolerant::typed(&recorder, e).map(Ok),
                Err(e) => Some(Err(e)),
            };
            futures::future::ready(typed)
        })
        // The cache and its index, then whoever hears of the change.
        .inspect(move |e| {
            if let Ok(e) = e {
                index.apply(&mut writer, e);
                if matches!(e, watcher::Event::InitDone) {
                    listed_tx.send_replace(true);
                }
            }
        });
    (shared::applied_once_stored(events), cache, listed)
}

/// Reconciles in flight at once, per controller. Unbounded (kube's default),
/// a start-up over 10,000 runs spawned a reconcile for each at once, a tenth of
/// the peak memory. At 64, a burst of 10,000 new runs queued the first run of
/// each key behind the others' intake for 45 s; at 256 it took 8 s, with the
/// same memory.
const CONCURRENCY: u16 = 256;

fn drive<K, F, Fut>(
    what: &'static str,
    controller: Controller<K>,
    reconcile: F,
    ctx: &Arc<Context>,
    leading: &Option<watch::Receiver<bool>>,
) -> BoxFuture<'static, ()>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
    F: FnMut(Arc<K>, Arc<Context>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let breaks = ctx.history_breaks.clone();
    let controller = controller.with_config(Config::default().concurrency(CONCURRENCY));
    let controller = match leading {
        Some(rx) => controller.reconcile_all_on(became_leader(rx.clone())),
        None => controller,
    };
    controller
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx.clone())
        .for_each(move |res| {
            let breaks = breaks.clone();
            async move { log_result(what, res, &breaks) }
        })
        .boxed()
}

/// A standby keeps its caches warm but leaves every object alone; it
/// reconciles them all when it becomes the leader.
async fn sync_when_acting<L: LockObject>(lock: Arc<L>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.acting() {
        return Ok(Action::await_change());
    }
    let object = backoff_key(lock.as_ref());
    let result = sync::reconcile(lock, ctx.clone()).await;
    if result.is_ok() {
        ctx.backoff.succeeded(&object);
    }
    result
}

pub(super) async fn intake_when_acting<K: Observe + Resource<DynamicType = ()>>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    when_acting(obj, ctx, intake::reconcile).await
}

async fn queued_intake_when_acting(
    pr: Arc<PipelineRun>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    when_acting(pr, ctx, queued_intake::reconcile).await
}

/// An intake that acts only while this replica acts; a success resets the object's backoff.
async fn when_acting<K, Fut>(
    obj: Arc<K>,
    ctx: Arc<Context>,
    reconcile: fn(Arc<K>, Arc<Context>) -> Fut,
) -> Result<Action, Error>
where
    K: Resource<DynamicType = ()>,
    Fut: std::future::Future<Output = Result<Action, Error>>,
{
    if !ctx.acting() {
        return Ok(Action::await_change());
    }
    let object = backoff_key(obj.as_ref());
    let result = reconcile(obj, ctx.clone()).await;
    if result.is_ok() {
        ctx.backoff.succeeded(&object);
    }
    result
}

/// A run kind's watch, split between its two consumers.
struct Split<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    /// The changes, as the key's sync hears of them.
    changes: ChangeStream<K>,
    /// The intake controller, fed by the same watch.
    intake: Controller<K>,
    cache: Indexed<K>,
    listed: shared::Listed,
    /// The changes, as the ClusterMutex controller hears of them (if it runs).
    for_cluster: Option<ChangeStream<K>>,
}

fn split<K>(watch: SharedWatch<K>, leading: &Option<watch::Receiver<bool>>) -> Split<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Observe + Send + Sync + 'static,
{
    let SharedWatch {
        cache,
        mut changes,
        listed,
    } = watch;
    let for_sync = changes.pop().expect("one stream per consumer");
    let for_intake = changes.pop().expect("one stream per consumer");
    Split {
        changes: for_sync,
        intake: Controller::for_shared_stream(
            intake::triggers(for_intake, &cache.store, leading.clone()),
            cache.store.clone(),
        ),
        cache,
        listed,
        for_cluster: changes.pop(),
    }
}

impl<K> Split<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K: Send + Sync + 'static,
{
    /// The cache of a kind that may not be served.
    fn cache(split: &Option<Self>) -> Option<Indexed<K>> {
        split.as_ref().map(|s| s.cache.clone())
    }

    /// The sync's changes, the intake controller and the ClusterMutex
    /// controller's changes, of a kind that may not be served.
    #[allow(clippy::type_complexity)]
    fn parts(
        split: Option<Self>,
    ) -> (
        Option<ChangeStream<K>>,
        Option<Controller<K>>,
        Option<ChangeStream<K>>,
    ) {
        match split {
            Some(s) => (Some(s.changes), Some(s.intake), s.for_cluster),
            None => (None, None, None),
        }
    }
}

/// The watches besides the Mutexes' own that wake a key.
struct Related {
    pipeline_runs: ChangeStream<PipelineRun>,
    custom_runs: Option<ChangeStream<CustomRun>>,
    runs: Option<ChangeStream<Run>>,
}

/// What wakes a key: its runs, their PipelineRuns, and the live pods of those.
fn watch_related(
    mut sync: Controller<Mutex>,
    client: &Client,
    namespace: &Option<String>,
    triggers: Triggers,
    related: Related,
    metrics: Arc<Metrics>,
) -> Controller<Mutex> {
    let wc = watcher::Config::default();
    let by_pr = triggers.clone();
    sync = sync.watches_shared_stream(related.pipeline_runs, move |pr: Arc<PipelineRun>| {
        let (ns, name) = (pr.namespace(), pr.name_any());
        let mut refs = by_pr.of_pipeline_run(ns.clone(), &name);
        refs.extend(queued_mutexes(&pr));
        let keys: Vec<String> = refs.iter().map(|r| r.name.clone()).collect();
        metrics.pipeline_run_seen(&ns.unwrap_or_default(), &name, pr.is_done(), &keys);
        refs
    });
    // Only pods of PipelineRuns that have not ended, metadata only: a pod leaving
    // this selector (it ended, or was removed) is what frees a draining holder's slot.
    let pods: Api<PartialObjectMeta<Pod>> = scoped(client, namespace);
    let live_pods = wc.clone().labels(PIPELINE_RUN_LABEL).fields(LIVE_PODS);
    let pod_stream = watcher(pods, live_pods).default_backoff().touched_objects();
    sync = sync.watches_stream(pod_stream, move |pod: PartialObjectMeta<Pod>| {
        match pod.labels().get(PIPELINE_RUN_LABEL) {
            Some(pr) => triggers.of_pipeline_run(pod.namespace(), pr),
            None => Vec::new(),
        }
    });
    if let Some(crs) = related.custom_runs {
        sync = sync.watches_shared_stream(crs, |cr| mutex_of(cr.as_ref()));
    }
    if let Some(runs) = related.runs {
        sync = sync.watches_shared_stream(runs, |r| mutex_of(r.as_ref()));
    }
    sync
}

fn log_result<K, E: std::fmt::Display, W: std::fmt::Display>(
    what: &str,
    res: Result<(ObjectRef<K>, Action), kube::runtime::controller::Error<E, W>>,
    breaks: &HistoryBreaks,
) where
    K: Resource,
    K::DynamicType: std::fmt::Debug,
{
    match res {
        Ok(_) => {}
        // Triggers for objects that are gone (or not created yet) are expected.
        Err(kube::runtime::controller::Error::ObjectNotFound(_)) => {}
        // Logged, with its cause and retry delay, by `error_policy`.
        Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
        // The lock objects' own watch failed: their versions' history may have broken.
        Err(e) => {
            breaks.broke();
            warn!(controller = what, error = %e, "reconcile failed")
        }
    }
}

pub(super) fn error_policy<K: Resource<DynamicType = ()>>(
    obj: Arc<K>,
    err: &Error,
    ctx: Arc<Context>,
) -> Action {
    let controller = K::kind(&()).to_lowercase();
    ctx.metrics.reconcile_error(&controller, err.kind());
    let object = backoff_key(obj.as_ref());
    let delay = match err {
        Error::Conflict => Duration::from_millis(50),
        _ => ctx.backoff.failed(object.clone()),
    };
    warn!(%object, error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lone replica acts only once its caches are listed (a run decided on a cache that
    /// still lacks its lock was decided wrong), and from then on while its loops run.
    #[tokio::test]
    async fn a_lone_replica_acts_once_its_caches_are_listed() {
        let (listed_tx, listed_rx) = tokio::sync::oneshot::channel::<()>();
        let (acting_tx, mut acting) = watch::channel(false);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let synced = async move {
            let _ = listed_rx.await;
        };
        let loops = async move {
            let _ = stop_rx.await;
        };
        let task = tokio::spawn(act_once_synced(synced, acting_tx, loops));
        tokio::task::yield_now().await;
        assert!(!*acting.borrow(), "acting before the caches were listed");
        listed_tx.send(()).unwrap();
        acting.wait_for(|a| *a).await.unwrap();
        assert!(!task.is_finished(), "stopped acting while its loops ran");
        stop_tx.send(()).unwrap();
        task.await.unwrap();
    }
}
