//! The one place the model calls the product's decision core. When the refactor
//! moves `crate::decide` to `crate::core::decide`, only the `use` below changes.

use chrono::{DateTime, Utc};
use std::collections::BTreeMap;
pub use tekton_mutex::decide::{
    Decision, MultiKeyRun, MultiKeys, MutexFacts, Outcome, Parent, ParentState, Phase, RunView,
    Timeout,
};
use tekton_mutex::decide::{commit_multikey, decide_full};
use tekton_mutex::mutex::{MutexSpec, MutexStatus};

/// The real `decide_full`, with no queue-control requests (not modelled).
pub fn decide_step(
    spec: &MutexSpec,
    prev: &MutexStatus,
    runs: &[RunView],
    now: DateTime<Utc>,
    facts: MutexFacts,
    multi: &MultiKeys,
) -> Decision {
    decide_full(spec, prev, runs, now, facts, &[], multi)
}

/// The real multi-key commit check: the tokens to tell the run `Acquired` with,
/// if every one of its keys keeps a slot for it in its epoch.
pub fn commit_step(
    uid: &str,
    run: &MultiKeyRun,
    ledgers: &BTreeMap<String, MutexStatus>,
) -> Option<BTreeMap<String, i64>> {
    commit_multikey(uid, run, ledgers)
}
