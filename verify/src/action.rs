//! The model's actions: what a replica, the lease, or the world (users, Tekton, the kubelet, the
//! clock) may do next, and how a counterexample's trace says each.

use crate::controller::Obj;
use crate::env::Env;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Env(Env),
    /// Replica r starts a sync of key k: fetch, view, decide. First the watch
    /// events of the kinds in `fresh` (bit 0 Mutexes, 1 lock runs, 2
    /// PipelineRuns) arrive; the other kinds' caches stay as they were.
    Sync {
        rep: u8,
        key: u8,
        fresh: u8,
    },
    /// Replica r does the next write of its sync (and, for its last write,
    /// `then_crash`: crashes right after it).
    Write {
        rep: u8,
        then_crash: bool,
    },
    /// Replica r crashes in the middle of a sync: after its read, or between
    /// two writes. (A crash while idle is this one with the steps after it
    /// moved before: it changes nothing the API server holds.)
    Crash {
        rep: u8,
    },
    /// The lease lapses: the other replica takes it, while the old leader, not
    /// knowing yet, starts a sync of key `key` (unless one is in flight) and
    /// goes on writing: for that sync, both act at once.
    Lapse {
        key: u8,
    },
    /// A restarted replica's first list.
    Relist {
        rep: u8,
    },
    /// Replica r's intake creates a missing Mutex for a run it sees.
    Ensure {
        rep: u8,
        key: u8,
    },
}

impl Action {
    /// The step, as a line of a counterexample's trace.
    pub fn describe(&self) -> String {
        match self {
            Action::Env(e) => env(*e),
            Action::Sync { rep, key, fresh } => format!(
                "replica {rep}: sync k{key}, with fresh caches of [{}]",
                fresh_names(*fresh)
            ),
            Action::Write { rep, .. } => format!("replica {rep}: next write of its sync"),
            Action::Crash { rep } => {
                format!("replica {rep}: crashes (cache and sync lost)")
            }
            Action::Lapse { key } => format!(
                "lease lapses: the other replica leads; the old leader, unaware, syncs k{key} (fetch, view, decide)"
            ),
            Action::Relist { rep } => format!("replica {rep}: restarts and lists everything"),
            Action::Ensure { rep, key } => {
                format!("replica {rep}: intake creates Mutex k{key} if missing")
            }
        }
    }
}

fn fresh_names(mask: u8) -> String {
    let names: Vec<String> = crate::controller::KINDS
        .into_iter()
        .enumerate()
        .filter(|(b, _)| mask & (1 << b) != 0)
        .map(|(_, o)| obj_name(o))
        .collect();
    names.join(", ")
}

fn env(e: Env) -> String {
    match e {
        Env::Create(i) => format!("user: starts pr-{i} (Tekton creates run-{i})"),
        Env::Finish(i) => format!("tekton: pr-{i}'s guarded task ends, pr-{i} done"),
        Env::Stopped(i) => format!("tekton: stopping pr-{i} is marked done"),
        Env::PodEnds(i) => format!("kubelet: pr-{i}'s pod ends (grace period over)"),
        Env::Cancel(i) => format!("user: cancels pr-{i}"),
        Env::DeletePr(i) => format!("user: deletes pr-{i} (and run-{i})"),
        Env::DeleteRun(i) => format!("user: deletes run-{i}"),
        Env::Timeout(i) => format!("clock: run-{i} times out"),
        Env::SectionEnds(i) => format!("tekton: the task pr-{i}'s release-after names ends"),
        Env::DeleteMutex(k) => format!("user: deletes Mutex k{k}"),
        Env::Wipe(k) => format!("user: wipes the status of Mutex k{k}"),
        Env::Forge(i) => {
            format!("tenant: writes a record on pr-{i} claiming Acquired, largest token")
        }
        Env::StartOwn(i) => format!("tenant: clears spec.status of its queued pr-{i} (it starts)"),
        Env::RaiseLedger(k) => format!("tenant: raises k{k}'s entry in the token ledger by one"),
        Env::LowerLedger(k) => format!("tenant: removes k{k}'s entry from the token ledger"),
    }
}

fn obj_name(o: Obj) -> String {
    match o {
        Obj::Mutexes => "Mutexes".into(),
        Obj::Runs => "lock runs".into(),
        Obj::Prs => "PipelineRuns".into(),
    }
}
