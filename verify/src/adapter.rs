//! The one place the model calls the product's decision core: `decide(&Input)`
//! and the multi-key commit check, exactly as the controller calls them.

use jiff::Timestamp;
use std::collections::BTreeMap;
use tekton_mutex_api::mutex::{LockSpec, MutexStatus};
use tekton_mutex_core::decide::{commit_multikey, decide};
pub use tekton_mutex_core::model::{
    Decision, Input, MultiKeyRun, MultiKeys, MutexFacts, Outcome, Parent, ParentState, Phase,
    RunView, Timeout,
};

/// The real `decide`, with no queue-control requests (not modelled).
pub fn decide_step(
    spec: &LockSpec,
    prev: &MutexStatus,
    runs: &[RunView],
    now: Timestamp,
    facts: MutexFacts,
    multi: &MultiKeys,
) -> Decision {
    decide(&Input {
        spec,
        status: prev,
        runs,
        now,
        facts,
        requests: &[],
        multi,
        deadlocked: &Default::default(),
        closed_by_window: None, // windows are the core's tests' (core::window)
        undelivered: &Default::default(),
    })
}

/// The real multi-key commit check: the tokens to tell the run `Acquired` with,
/// if every one of its keys keeps a slot for it in its epoch.
pub fn commit_step(
    uid: &str,
    run: &MultiKeyRun,
    pipeline_run_uid: &str,
    ledgers: &BTreeMap<String, MutexStatus>,
) -> Option<BTreeMap<String, i64>> {
    commit_multikey(uid, run, Some(pipeline_run_uid), ledgers)
}
