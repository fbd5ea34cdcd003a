//! What every reconcile shares: the client, the caches, the memos of writes in
//! flight and the recorder ([`Context`]), and the one error type ([`Error`]).

use super::backoff::Backoff;
use super::cache::index::{Index, Indexed};
use super::cache::shared::Listed;
use super::cache::told::{HistoryBreaks, Told, Written};
use super::ledger_batch::LedgerWrites;
use super::recorder::EventRecorder;
use super::wake::Wake;
use crate::metrics::Metrics;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource};
use std::sync::Arc;
use tokio::sync::watch;

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
    #[error("token ledger {0}")]
    Ledger(String),
    #[error("leader election: {0}")]
    Lease(#[from] kube_lease_manager::LeaseManagerError),
    #[error("lost the leader Lease to another replica; exiting so that only one acts")]
    LostLease,
}

impl Error {
    /// A bounded name for the reconcile errors metric.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(e)) if e.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::Conflict => "conflict",
            Error::MissingCrd(..) => "missing-crd",
            Error::Ledger(_) => "ledger",
            Error::Http(_) => "io",
            Error::Lease(_) | Error::LostLease => "lease",
        }
    }
}

/// A crash the tests can ask for. Only builds with the `fault-injection`
/// feature read it (from TEKTON_MUTEX_FAULT); release builds never set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Exit after the lock state records a supersede, before the PipelineRun
    /// is cancelled and the run marked.
    ExitAfterLockWrite,
}

#[cfg(feature = "fault-injection")]
impl Fault {
    pub fn from_env() -> Result<Option<Fault>, String> {
        match std::env::var("TEKTON_MUTEX_FAULT").ok().as_deref() {
            None | Some("") => Ok(None),
            Some("exit-after-lock-write") => Ok(Some(Fault::ExitAfterLockWrite)),
            Some(other) => Err(format!(
                "unknown TEKTON_MUTEX_FAULT {other:?} (known: exit-after-lock-write)"
            )),
        }
    }
}

pub struct Context {
    pub(crate) client: Client,
    pub(crate) custom_runs: Option<Indexed<CustomRun>>,
    pub(crate) runs: Option<Indexed<Run>>,
    pub(crate) pipeline_runs: Store<PipelineRun>,
    /// The PipelineRuns queued as a whole, by the lock they queue on (of `pipeline_runs`).
    pub(crate) queued_runs: Index<PipelineRun>,
    pub(crate) mutexes: Store<Mutex>,
    /// The ClusterMutexes, where this controller serves them (deadlocks across keys read both kinds).
    pub(crate) cluster_mutexes: Option<Store<ClusterMutex>>,
    /// Asks another lock's controller for a sync.
    pub(crate) wake: Wake,
    /// One per cache: whether it holds its first full list.
    pub(crate) listed: Vec<Listed>,
    pub(crate) recorder: EventRecorder,
    pub(crate) fault: Option<Fault>,
    pub(crate) metrics: Arc<Metrics>,
    /// Failures per object, for the retry delay.
    pub(crate) backoff: Backoff,
    /// Run statuses written and not yet seen back in the cache.
    pub(crate) told: Told,
    pub(crate) written: Written<Mutex>,
    pub(crate) cluster_written: Written<ClusterMutex>,
    /// Counts the watches' failures and new lists, by which the memos above go.
    pub(crate) history_breaks: HistoryBreaks,
    /// Whether this replica acts (holds the Lease, or runs without election).
    pub(crate) acting: watch::Receiver<bool>,
    /// Where the ClusterMutexes' token ledger lives (token_floor.rs): kube-system by default.
    pub(crate) cluster_ledger_namespace: String,
    /// Where an earlier release kept it, still read for floors while upgrading (token_floor.rs).
    pub(crate) previous_cluster_ledger: Option<String>,
    /// The token ledgers' writes, one at a time per ledger (ledger_batch.rs).
    pub(crate) ledger_writes: LedgerWrites,
    /// Grants the API server refused to deliver for good, to take back (undelivered.rs).
    pub(crate) undelivered: super::undelivered::Undelivered,
}

impl Context {
    pub fn acting(&self) -> bool {
        *self.acting.borrow()
    }

    /// A Context as `wiring::run` builds one, over these caches and this client, acting, with
    /// no fault hook (the hermetic tests and the Sieve-style suite).
    #[cfg(test)]
    pub(crate) fn over(
        client: Client,
        custom_runs: Indexed<CustomRun>,
        pipeline_runs: Store<PipelineRun>,
        mutexes: Store<Mutex>,
        cluster_ledger_namespace: &str,
    ) -> Context {
        let reporter = kube::runtime::events::Reporter {
            controller: "tekton-mutex".into(),
            instance: None,
        };
        Context {
            recorder: EventRecorder::new(client.clone(), reporter),
            client,
            custom_runs: Some(custom_runs),
            runs: None,
            pipeline_runs,
            queued_runs: Index::new(super::cache::triggers::queued_tags),
            mutexes,
            cluster_mutexes: None,
            wake: Wake::default(),
            listed: Vec::new(),
            fault: None,
            metrics: Arc::new(Metrics::new()),
            backoff: Default::default(),
            told: Default::default(),
            written: Default::default(),
            cluster_written: Default::default(),
            history_breaks: Default::default(),
            acting: watch::channel(true).1,
            cluster_ledger_namespace: cluster_ledger_namespace.into(),
            previous_cluster_ledger: None,
            ledger_writes: Default::default(),
            undelivered: Default::default(),
        }
    }
}

pub fn scoped<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}
