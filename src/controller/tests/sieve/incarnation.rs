//! One run of the controller process: its connection (the fault layer), its
//! caches, fed from the fake API server's change log as a watch would feed
//! them, and the real `Context` over both, as `wiring.rs` builds it. A restart
//! is a new incarnation: empty memos, caches listed afresh.
//!
//! The harness drives the real reconcilers level-triggered: a pass reconciles
//! every run intake would hear of, then every Mutex, then every ClusterMutex,
//! each with the caches caught up first (as the shared watches tell a
//! reconciler of a change only once their cache has it). Which wake-up the
//! product would have used is not under test here; its state is.

use super::api_server::ApiServer;
use super::fault::{Line, Wire};
use super::store::{Change, Kind, ObjKey};
use crate::controller::cache::index::{Index, Indexed};
use crate::controller::cache::strip;
use crate::controller::cache::triggers::run_tags;
use crate::controller::context::{Context, Error};
use crate::controller::reconcile::{intake, lock};
use crate::core::observe::Observe;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::pipelinerun::PipelineRun;
use kube::Client;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use serde_json::Value;
use std::sync::Arc;

/// Where the ClusterMutexes' token ledger lives (the default of `--cluster-ledger-namespace`).
pub const LEDGER_NAMESPACE: &str = crate::controller::CLUSTER_LEDGER_NAMESPACE;

/// The caches of one incarnation, and how far into the change log they are.
pub struct Feed {
    runs: Writer<CustomRun>,
    run_index: Index<CustomRun>,
    prs: Writer<PipelineRun>,
    mutexes: Writer<Mutex>,
    clusters: Writer<ClusterMutex>,
    /// The next change of the log to deliver.
    pub cursor: usize,
}

impl Feed {
    /// Caches listed from `objects` (what a list returned), watching from `cursor` on.
    pub fn listed(objects: &[(ObjKey, Value)], cursor: usize) -> Feed {
        let mut feed = Feed {
            runs: Writer::default(),
            run_index: Index::new(run_tags::<CustomRun>),
            prs: Writer::default(),
            mutexes: Writer::default(),
            clusters: Writer::default(),
            cursor,
        };
        feed.relist(objects);
        feed
    }

    /// A full list, as the reflector takes one: the caches become exactly `objects`.
    pub fn relist(&mut self, objects: &[(ObjKey, Value)]) {
        let of = |kind: Kind| {
            objects
                .iter()
                .filter(move |(k, _)| k.kind == kind)
                .map(|(_, v)| v)
        };
        self.run_index.apply(&mut self.runs, &Event::Init);
        for v in of(Kind::CustomRun) {
            self.run_index
                .apply(&mut self.runs, &Event::InitApply(run(v)));
        }
        self.run_index.apply(&mut self.runs, &Event::InitDone);
        list_into(&mut self.prs, of(Kind::PipelineRun).map(pipeline_run));
        list_into(&mut self.mutexes, of(Kind::Mutex).map(typed::<Mutex>));
        list_into(
            &mut self.clusters,
            of(Kind::ClusterMutex).map(typed::<ClusterMutex>),
        );
    }

    /// One watch event: the object as `object` shows it, or gone.
    pub fn apply(&mut self, key: &ObjKey, object: &Value, deleted: bool) {
        match key.kind {
            Kind::CustomRun => self
                .run_index
                .apply(&mut self.runs, &event(run(object), deleted)),
            Kind::PipelineRun => self
                .prs
                .apply_watcher_event(&event(pipeline_run(object), deleted)),
            Kind::Mutex => self
                .mutexes
                .apply_watcher_event(&event(typed(object), deleted)),
            Kind::ClusterMutex => self
                .clusters
                .apply_watcher_event(&event(typed(object), deleted)),
            _ => {}
        }
    }

    /// Deliver one change of the log (of a cached kind; others are skipped).
    pub fn deliver(&mut self, change: &Change) {
        self.apply(&change.key, &change.object, change.deleted);
    }
}

fn event<K>(o: K, deleted: bool) -> Event<K> {
    match deleted {
        true => Event::Delete(o),
        false => Event::Apply(o),
    }
}

fn list_into<K>(writer: &mut Writer<K>, objects: impl Iterator<Item = K>)
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    writer.apply_watcher_event(&Event::Init);
    for o in objects {
        writer.apply_watcher_event(&Event::InitApply(o));
    }
    writer.apply_watcher_event(&Event::InitDone);
}

fn typed<K: serde::de::DeserializeOwned>(v: &Value) -> K {
    match serde_json::from_value(v.clone()) {
        Ok(k) => k,
        Err(e) => panic!("the fake API server holds an object its type cannot read ({e}): {v}"),
    }
}

/// A run as the shared watch caches it: stripped to what the controller reads.
fn run(v: &Value) -> CustomRun {
    let mut r = typed::<CustomRun>(v);
    strip::custom_run(&mut r);
    r
}

fn pipeline_run(v: &Value) -> PipelineRun {
    let mut p = typed::<PipelineRun>(v);
    strip::pipeline_run(&mut p);
    p
}

/// One controller process.
pub struct Incarnation {
    pub line: Arc<Line>,
    pub ctx: Arc<Context>,
    pub feed: Feed,
}

impl Incarnation {
    /// A process that starts now: caches listed from `objects`, nothing remembered.
    /// Process number `index` (0 for the first), dying after `crash_after` writes if given.
    pub fn start(
        server: &Arc<ApiServer>,
        index: usize,
        crash_after: Option<usize>,
        objects: &[(ObjKey, Value)],
        cursor: usize,
    ) -> Incarnation {
        let line = Line::new(server.clone(), index, crash_after);
        let client = Client::new(Wire(line.clone()), "default");
        let feed = Feed::listed(objects, cursor);
        let ctx = Arc::new(context(client, &feed));
        Incarnation { line, ctx, feed }
    }

    /// The runs intake would act on, as cached now, in name order.
    pub fn intake_targets(&self) -> Vec<ObjectRef<CustomRun>> {
        let mut runs: Vec<Arc<CustomRun>> = self.feed.runs.as_reader().state();
        runs.retain(|r| intake::needs_intake(&r.observe()));
        sorted_refs(runs)
    }

    pub fn mutex_targets(&self) -> Vec<ObjectRef<Mutex>> {
        sorted_refs(self.feed.mutexes.as_reader().state())
    }

    pub fn cluster_targets(&self) -> Vec<ObjectRef<ClusterMutex>> {
        sorted_refs(self.feed.clusters.as_reader().state())
    }

    /// Reconcile one object as cached now (if it still is), the way the
    /// product's controllers call their reconcilers.
    pub async fn reconcile(&self, target: &Target) -> Option<Result<(), Error>> {
        let ctx = self.ctx.clone();
        let result = match target {
            Target::Run(r) => {
                let run = self.feed.runs.as_reader().get(r)?;
                intake::reconcile(run, ctx).await
            }
            Target::Mutex(r) => lock::reconcile(self.feed.mutexes.as_reader().get(r)?, ctx).await,
            Target::Cluster(r) => {
                lock::reconcile(self.feed.clusters.as_reader().get(r)?, ctx).await
            }
        };
        Some(result.map(drop))
    }
}

/// What a reconcile is for.
#[derive(Clone, Debug)]
pub enum Target {
    Run(ObjectRef<CustomRun>),
    Mutex(ObjectRef<Mutex>),
    Cluster(ObjectRef<ClusterMutex>),
}

fn sorted_refs<K>(objects: Vec<Arc<K>>) -> Vec<ObjectRef<K>>
where
    K: kube::Resource<DynamicType = ()>,
{
    let mut refs: Vec<ObjectRef<K>> = objects
        .iter()
        .map(|o| ObjectRef::from_obj(o.as_ref()))
        .collect();
    refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    refs
}

/// A Context as `wiring::run` builds one, over these caches and this client.
fn context(client: Client, feed: &Feed) -> Context {
    let runs = Indexed {
        store: feed.runs.as_reader(),
        index: feed.run_index.clone(),
    };
    let (prs, mutexes) = (feed.prs.as_reader(), feed.mutexes.as_reader());
    Context::over(client, runs, prs, mutexes, LEDGER_NAMESPACE)
}
