//! The state of the modelled world: the API server's objects, each replica's
//! cache and in-flight sync, and the ghost history the properties read.
//! Everything is small and `Hash`: the checker fingerprints whole states.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use tekton_mutex_api::mutex::MutexStatus;
use tekton_mutex_promise::{Fence, Newest};

/// A Mutex status, shared and hashed once (through its JSON: the product's
/// type has no `Hash`). States are cloned and fingerprinted far more often
/// than statuses are made.
#[derive(Clone, Debug)]
pub struct Ledger(pub Arc<MutexStatus>, u64);

impl Ledger {
    pub fn new(st: MutexStatus) -> Ledger {
        let json = serde_json::to_string(&st).expect("a status serializes");
        let h = std::hash::BuildHasher::hash_one(
            &std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default(),
            json,
        );
        Ledger(Arc::new(st), h)
    }
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger::new(MutexStatus::default())
    }
}

impl PartialEq for Ledger {
    fn eq(&self, o: &Self) -> bool {
        self.1 == o.1 && (Arc::ptr_eq(&self.0, &o.0) || self.0 == o.0)
    }
}

impl Eq for Ledger {}

impl Hash for Ledger {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.1.hash(h);
    }
}

/// A Mutex object: `rv` is its resourceVersion (per object: only equality matters).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MutexObj {
    pub uid: u8,
    pub rv: u16,
    pub status: Ledger,
    pub deleting: bool,
    pub finalizer: bool,
}

/// Where a lock run (CustomRun) object is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Life {
    NotYet,
    Live,
    Deleted,
}

/// What the controller last wrote into a run's status (only what the protocol reads).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Told {
    Nothing,
    /// `Acquired`, with one token per key of the run (in the run's key order).
    Acquired(Vec<i64>),
    /// A final outcome other than `Acquired`.
    Ended {
        superseded: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunObj {
    pub life: Life,
    pub rv: u8,
    pub told: Told,
    /// spec.status = RunCancelled (Tekton propagates a PipelineRun's cancel).
    pub cancel: bool,
    /// Multi-key reservation epoch (status.extraFields).
    pub epoch: i64,
}

impl RunObj {
    pub fn new() -> Self {
        RunObj {
            life: Life::NotYet,
            rv: 0,
            told: Told::Nothing,
            cancel: false,
            epoch: 0,
        }
    }

    pub fn live(&self) -> bool {
        self.life == Life::Live
    }

    /// Its condition is final (told `Acquired` or an end).
    pub fn done(&self) -> bool {
        self.told != Told::Nothing
    }

    pub fn bump(&mut self) {
        self.rv = self.rv.wrapping_add(1);
    }
}

impl Default for RunObj {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrPhase {
    NotYet,
    /// Created `PipelineRunPending` and queued as a whole (issue 26): Tekton has
    /// started nothing of it; a grant clears `spec.status` and it runs.
    Pending,
    Running,
    /// Cancel requested: Tekton stops its tasks (pods get SIGTERM and a grace period).
    Stopping,
    Done,
    Deleted,
}

/// The pod of the guarded task: started when the lock run is told `Acquired`
/// while the PipelineRun runs; it ends when the task ends or its grace period does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pod {
    None,
    Live,
    Ended,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PrObj {
    pub phase: PrPhase,
    pub pod: Pod,
    /// The tasks a `release-after` lock run names are done and their pods ended.
    pub section_done: bool,
    /// A queued PipelineRun whose tenant cleared `spec.status` (Env::StartOwn), and nobody
    /// has set it to a stop since: Tekton runs it though the lock never granted it.
    pub started_by_tenant: bool,
}

impl PrObj {
    pub fn new() -> Self {
        PrObj {
            phase: PrPhase::NotYet,
            pod: Pod::None,
            section_done: false,
            started_by_tenant: false,
        }
    }

    /// Done or deleted as Tekton sees it (pods may still run).
    pub fn ended(&self) -> bool {
        matches!(self.phase, PrPhase::Done | PrPhase::Deleted)
    }
}

impl Default for PrObj {
    fn default() -> Self {
        Self::new()
    }
}

/// The API server's objects. PipelineRun i owns lock run i; for a PipelineRun
/// queued as a whole, "run i" is the lock's record on PipelineRun i itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Api {
    pub mutexes: Vec<Option<MutexObj>>,
    pub next_uid: u8,
    pub runs: Vec<RunObj>,
    pub prs: Vec<PrObj>,
    /// The run's current attempt has timed out (time, not an object change).
    pub timed_out: Vec<bool>,
    /// Per key: its entry in the token ledger ConfigMap (token_floor.rs), which only rises.
    pub ledger: Vec<i64>,
}

/// One replica's informer caches (a copy of some version of each object).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cache {
    pub mutexes: Vec<Option<MutexObj>>,
    pub runs: Vec<RunObj>,
    pub prs: Vec<PrObj>,
}

/// One write (or the last read) of a sync, in the product's order.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Write {
    /// sync_key's still_current: a decision that only tells runs rests on the
    /// API server's current Mutex (resourceVersion `rv`).
    CheckCurrent { rv: u16 },
    /// finalizer::protect, a compare-and-swap on `rv`.
    Protect { rv: u16 },
    /// writes::mutex_status, replace_status with the resourceVersion read.
    Status { rv: u16, status: Ledger },
    /// multikey::commit_reserved for run `run`, read at `run_rv` in `epoch`.
    /// `ledger` is this key's status as just decided.
    Commit {
        run: u8,
        run_rv: u8,
        epoch: i64,
        ledger: Ledger,
    },
    /// multikey::revoke: epoch + 1 on the run, if unchanged since read.
    Revoke { run: u8, run_rv: u8, epoch: i64 },
    /// Tell run `run` an outcome (run_status::patch, conditional on `run_rv`).
    Tell { run: u8, run_rv: u8, told: Told },
    /// writes::cancel_pipeline_run (read fresh; a done one is not patched).
    Cancel { pr: u8 },
    /// token_floor::record of a lock without a finalizer that hands out a token
    /// (it may be deleted at any time, so the token goes in the ledger first).
    RecordFloor { token: i64 },
    /// finalizer::unprotect's first half: read the Mutex fresh, refuse if it is in
    /// use (409), and record its `lastToken` in the ledger.
    RecordIdle,
    /// finalizer::unprotect's patch, a compare-and-swap on the version RecordIdle
    /// read (`rv`): the finalizer comes off an idle Mutex; one being deleted then
    /// goes, and is created again if runs were kept out (hand_over).
    Unprotect { rv: u16, kept_out: bool },
}

/// A sync of one key in flight: the writes still to do, first first.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Sync {
    pub key: u8,
    pub writes: Vec<Write>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Its caches have had their first list since it (re)started.
    pub listed: bool,
    pub cache: Cache,
    pub sync: Option<Sync>,
    /// Per key: the last sync ended in a conflict, so the next reads the API server.
    pub retry: Vec<bool>,
}

/// What the properties need from the past.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Ghost {
    /// Per key: the highest token a section of it started with (the promise's fencing rule).
    pub fences: Vec<Fence>,
    /// Per group: the newest run (index: higher is newer) granted so far (its supersede rule).
    pub newest_granted: Vec<Newest<u8>>,
    /// The first property broken by a grant, as a message (fencing, supersede).
    pub broken: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub api: Api,
    pub replicas: Vec<Replica>,
    pub ghost: Ghost,
    /// User actions that disturb the lock left (cancel, deletes, wipe, timeout).
    pub disrupt_left: u8,
    pub crashes_left: u8,
    /// Syncs on a lagging cache left (bounded, as watch events do arrive).
    pub lags_left: u8,
    /// Bit r: replica r holds (or believes it holds) the lease, so it starts syncs.
    pub leaders: u8,
    /// Lease lapses left: each makes both replicas act at once.
    pub lapses_left: u8,
}
