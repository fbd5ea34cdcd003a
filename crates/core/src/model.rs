//! The decision core's vocabulary: what a run looks like to it ([`RunView`]),
//! what it decides ([`Decision`], [`Outcome`], [`Cancel`]), and everything it is
//! given ([`Input`]). Types only; the steps are in [`crate::decide`].

use crate::requests::{Dismissal, Request, Unreadable};
use jiff::Timestamp;
use std::collections::{BTreeMap, HashMap};
use tekton_mutex_api::mutex::{Age, LockSpec, MutexStatus, RunRef, Supersede};

/// Everything one decision is made from: the lock's spec and status, its runs
/// as seen now, the lock object's own facts, the queue-control requests on it,
/// and what runs of several keys say.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub spec: &'a LockSpec,
    pub status: &'a MutexStatus,
    pub runs: &'a [RunView],
    pub now: Timestamp,
    pub facts: MutexFacts,
    pub requests: &'a [Result<Request, Unreadable>],
    pub multi: &'a MultiKeys,
    /// Waiting runs that are the victims of a deadlock across keys (`core::deadlock`), by
    /// uid, with the cycle in words.
    pub deadlocked: &'a BTreeMap<String, String>,
    /// Holders whose grant the API server refused to deliver for good (an admission policy,
    /// a size limit), by uid, with the API's word: their slot is taken back.
    pub undelivered: &'a BTreeMap<String, String>,
    /// Why a scheduled window keeps the lock from granting anything new now
    /// (`window::gate`), if one does: "deny window weekend-freeze until Mon 08:00 ...".
    pub closed_by_window: Option<&'a str>,
}

/// One Mutex run of this key, as observed now.
#[derive(Clone, Debug, PartialEq)]
pub struct RunView {
    pub run: RunRef,
    /// The owning PipelineRun; None for a standalone run.
    pub parent: Option<Parent>,
    pub group: String,
    pub age: Age,
    pub priority: i64,
    pub supersede: Supersede,
    pub cancel_mode: CancelMode,
    pub wait: bool,
    /// When this run started waiting (its first attempt's start): waited-seconds counts from here.
    pub waiting_since: Timestamp,
    /// Why it was asked to stop (`spec.statusMessage`), when Tekton or a person said.
    pub cancel_message: Option<String>,
    pub phase: Phase,
    /// The token this run was told `Acquired` with (its `token` result), if any:
    /// the lock state is rebuilt from it when the status was lost.
    pub acquired_token: Option<i64>,
    /// A PipelineRun queued as a whole that Tekton runs: its `spec.status` is no longer
    /// Pending. Only its grant may do that; false for a lock run.
    pub started: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Parent {
    pub name: String,
    pub uid: String,
    pub state: ParentState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentState {
    Running,
    /// Someone asked it to stop, or a task failed and it waits for the others
    /// (`PipelineRunStopping`); it may still be running tasks.
    StopRequested,
    /// Done or deleted, but a pod of it has not ended yet: a cancelled step may
    /// still be in its termination grace period.
    Draining,
    /// Its Succeeded condition is final and no pod of it still runs.
    Done,
    /// Deleted (or replaced by another object of the same name), no pod left.
    Gone,
    /// Still running, but the tasks its lock run named in `release-after` are
    /// done and their pods ended: it holds nothing more (see src/release_after.rs).
    SectionDone,
}

impl ParentState {
    /// Over as far as Tekton is concerned: it starts nothing new.
    pub fn ended(self) -> bool {
        matches!(
            self,
            ParentState::Draining | ParentState::Done | ParentState::Gone
        )
    }

    /// Nothing of it can still run: only now does a held slot go free.
    pub fn released(self) -> bool {
        matches!(
            self,
            ParentState::Done | ParentState::Gone | ParentState::SectionDone
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Not done yet.
    Live {
        cancel_requested: bool,
        timeout: Timeout,
    },
    /// The run's condition is final; `superseded` if it ended superseded.
    Done { superseded: bool },
    /// The run object was deleted while its PipelineRun held the slot: the hold
    /// belongs to the PipelineRun, so it lasts until that is released.
    Deleted,
    /// The run names a PipelineRun as its owner, but that PipelineRun's
    /// `status.childReferences` does not list it (yet, or ever: a forged run).
    /// It is not enrolled: it neither waits in the queue nor supersedes, is
    /// superseded, re-enters or cancels anything until it is listed. Tekton
    /// lists a real run right after creating it, and that status update
    /// triggers the key again.
    Unlisted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    NotYet,
    /// This attempt timed out and a retry remains.
    Retry,
    /// Timed out with no retry left.
    Final,
}

/// What a live run's status should say.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// In the queue. Only the run next in line is told who holds the key; the
    /// others are told just that they wait (the order is on the Mutex status), so
    /// a grant or an arrival changes at most one waiter's status, whatever the
    /// queue's length.
    Waiting {
        /// At the head of the queue: the next grant is its.
        next: bool,
        /// Who holds the key, for the run next in line; empty for the others.
        holders: Vec<String>,
        retry: bool,
    },
    Acquired {
        token: i64,
        waited_seconds: i64,
    },
    /// `wait: "false"` and the slot was taken.
    NotAcquired {
        holders: Vec<String>,
    },
    /// A newer run of its group holds or waits for the key.
    Superseded {
        by: String,
        group: String,
    },
    Cancelled {
        why: String,
    },
    TimedOut,
    /// Not admitted: the key already has `limit` runs waiting (`spec.maxQueue`),
    /// or, with `namespace`, that namespace has its share of a ClusterMutex's
    /// queue waiting (`spec.maxQueuePerNamespace`).
    QueueFull {
        limit: u32,
        namespace: Option<String>,
    },
    /// Not admitted: one more waiter would make the lock's status larger than the
    /// API server and etcd accept (`bytes`, [`crate::decide::STATUS_BYTES`]).
    StatusFull {
        bytes: usize,
    },
    /// Not admitted yet: the Mutex is being deleted. It is created again once
    /// its holders and waiters are gone, and the run joins that one.
    MutexDeleting,
    /// A PipelineRun queued as a whole that someone else started (cleared its
    /// `spec.status`) while it waited: it holds nothing, waits no more, and is cancelled.
    StartedWithoutGrant,
    /// Not admitted, for good: the ClusterMutex is being deleted, and nothing but its
    /// administrator creates a ClusterMutex again (issue 46 item 6).
    LockDeleted,
    /// Not admitted, for good: the lock kind itself is being uninstalled (its
    /// CustomResourceDefinition is being deleted or gone), so no lock of the key can be created
    /// again; a waiter of a Mutex being deleted learns it once the Mutex is gone.
    Uninstalling,
    /// Queued, but the key is frozen (`spec.frozen`), or a scheduled window is closed
    /// (`window`): nothing new is granted.
    Frozen {
        /// At the head of the queue: the first grant after the thaw is its.
        next: bool,
        /// Who holds the key, for the run next in line; empty for the others.
        holders: Vec<String>,
        retry: bool,
        reason: Option<String>,
        /// A window's closing message, when a window (not a freeze) holds the queue.
        window: Option<String>,
    },
    /// A person let it go: its queue was cleared, or its PipelineRun's hold released.
    Cleared {
        message: String,
    },
    /// The youngest party of a cycle of PipelineRuns waiting on each other's keys.
    Deadlock {
        cycle: String,
    },
}

/// A PipelineRun the controller must cancel.
#[derive(Clone, Debug, PartialEq)]
pub struct Cancel {
    pub pipeline_run: String,
    /// The cancel applies to this PipelineRun only, not to one re-created under its name.
    pub pipeline_run_uid: String,
    pub mode: CancelMode,
    /// The newer PipelineRun that superseded it.
    pub superseded_by: String,
    pub group: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub status: MutexStatus,
    pub outcomes: Vec<(RunRef, Outcome)>,
    pub cancels: Vec<Cancel>,
    /// PipelineRuns a person let go (released or cleared) to cancel.
    pub control_cancels: Vec<ControlCancel>,
    /// Slots of runs of several keys to give back: written to those runs first.
    pub revokes: Vec<Revoke>,
}

/// The Mutex object, besides its spec and status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MutexFacts {
    /// `kubectl delete` marked it: it admits no one new and releases nothing.
    pub deleting: bool,
    /// The `lastToken` of an earlier Mutex of this key, since deleted: tokens continue above it.
    pub token_floor: i64,
    /// `token_floor` was read from the ledger for this lock object: the next status names
    /// the object's uid (`ledgerReadFor`), so a status restored onto another object (a
    /// backup of an earlier one) reads the ledger again before it grants (issue 37 item 10).
    pub ledger_read: bool,
    /// The lowest token a grant may hand out now: the controller's clock in milliseconds
    /// since 1970 (`mutex::clock_floor`), so that an etcd restore, which rolls `lastToken`
    /// and the token ledger back together, never hands a token out again. 0 where time
    /// plays no part (the core's tests count tokens from 1).
    pub clock_floor: i64,
    /// A ClusterMutex's share of its queue for one namespace: one tenant cannot
    /// fill the queue and deny the lock to the others. None for a Mutex.
    pub namespace_share: Option<u32>,
    /// A ClusterMutex whose `spec.crossNamespacePriority` lets `priority` order runs across
    /// namespaces too; otherwise namespaces take turns and priority stays within one.
    pub priority_across_namespaces: bool,
}

impl MutexFacts {
    /// Does the lock come back once it is deleted? A Mutex does: the runs that name its key
    /// create it again. A ClusterMutex (the one kind with a namespace share) only by its
    /// administrator, so a run that arrives while it is deleted waits for nothing.
    pub fn comes_back_when_deleted(&self) -> bool {
        self.namespace_share.is_none()
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CancelMode {
    Cancelled,
    #[default]
    CancelledRunFinally,
    StoppedRunFinally,
}

impl CancelMode {
    pub fn as_str(self) -> &'static str {
        match self {
            CancelMode::Cancelled => "Cancelled",
            CancelMode::CancelledRunFinally => "CancelledRunFinally",
            CancelMode::StoppedRunFinally => "StoppedRunFinally",
        }
    }
}

/// What a run of several keys says about itself, as read from its status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MultiKeyRun {
    /// All its keys, in the order the run gives them.
    pub keys: Vec<String>,
    /// Raised each time a key gives its slot back: slots of older epochs are void.
    pub epoch: i64,
    /// Once told `Acquired`: its token on each key (tokens of its current epoch).
    pub acquired: Option<BTreeMap<String, i64>>,
}

/// Ask run `run` to give back the slots its keys keep in `epoch`: the controller
/// writes epoch + 1 on the run, only if the run is unchanged since it was read and
/// not `Acquired`. Only then may a key drop the slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revoke {
    pub run: RunRef,
    pub epoch: i64,
}

/// The runs of several keys among this key's runs (by run uid), and this key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MultiKeys {
    pub key: String,
    pub runs: HashMap<String, MultiKeyRun>,
}

impl MultiKeys {
    pub fn of(&self, uid: &str) -> Option<&MultiKeyRun> {
        self.runs.get(uid).filter(|m| m.keys.len() > 1)
    }
}

/// What a key does with a slot it keeps, given what the run says now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    /// The run was granted in the slot's epoch: the slot becomes its hold.
    Convert,
    /// The run gave the slot back (a later epoch), ended, or is gone.
    Void,
    /// Still kept for the run.
    Kept,
}

/// A PipelineRun to cancel because a person let it go.
#[derive(Clone, Debug, PartialEq)]
pub struct ControlCancel {
    pub pipeline_run: String,
    pub pipeline_run_uid: String,
    pub mode: CancelMode,
    pub dismissal: Dismissal,
    /// Who let it go and why.
    pub message: String,
}
