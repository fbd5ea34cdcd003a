//! The decision core: given what the Mutex status says and what the runs of its
//! key look like now, decide the next status and what to tell each run.
//!
//! Pure and deterministic: no I/O, time comes in as `now`. The reconciler reads
//! the world, calls [`decide`], writes the status with a compare-and-swap, then
//! applies the outcomes and cancels. Every output is derived from state, not
//! from what triggered the call, so re-running it after a crash redoes whatever
//! was not yet applied.

use crate::model::{Decision, Input};
use decider::{Decider, siblings_share_age};

mod cancel;
mod decider;
mod fair_share;
mod multi_key;
mod queue_control;
mod queued_record;
mod supersede;

pub use queued_record::vouch as vouch_queued_record;

pub use multi_key::{commit as commit_multikey, rank, settle, slot_for};

#[cfg(feature = "guard-switches")]
pub mod guard_switches;

/// The largest status a lock writes, in bytes of JSON: etcd refuses a request above 1.5 MiB by
/// default, and the object carries its spec and metadata too. An arrival that would grow the
/// status past it is refused `QueueFull` (issue 49 item 1): a long queue never wedges the key.
pub const STATUS_BYTES: usize = 1024 * 1024;

/// The decision, as a script of named steps over one working state; `requests`
/// are the queue-control requests on the Mutex, `multi` what runs of several keys say.
pub fn decide(input: &Input) -> Decision {
    let Input {
        spec,
        status,
        now,
        facts,
        requests,
        multi,
        deadlocked,
        undelivered,
        closed_by_window,
        ..
    } = *input;
    let runs = queued_record::as_the_status_says(siblings_share_age(input.runs), status);
    let mut d = Decider::new(spec, status, &runs, now, facts, multi, deadlocked);
    d.undelivered = undelivered;
    d.closed_by_window = closed_by_window;
    d.convert_granted_reservations();
    d.rebuild_from_runs();
    d.take_requests(requests);
    d.carry_out_dismissals();
    d.release_ended_holders();
    d.revoke_undelivered();
    d.drop_leavers();
    d.settle_reservations();
    d.reenter_queued_siblings();
    d.admit_arrivals();
    d.supersede_reserved();
    d.supersede_running();
    d.recancel_superseded();
    d.forget_idle_marks();
    d.report().finish_controls(spec, closed_by_window)
}

#[cfg(test)]
mod tests;

/// The shapes of input the tests use most, each a [`decide`] with the rest empty.
#[cfg(test)]
pub(crate) mod test_entry {
    use super::decide as decide_input;
    use crate::model::{Decision, Input, MultiKeys, MutexFacts, RunView};
    use crate::requests::{Request, Unreadable};
    use jiff::Timestamp;
    use tekton_mutex_api::mutex::{LockSpec, MutexStatus};

    pub fn decide(
        spec: &LockSpec,
        prev: &MutexStatus,
        runs: &[RunView],
        now: Timestamp,
    ) -> Decision {
        decide_with(spec, prev, runs, now, MutexFacts::default())
    }

    pub fn decide_with(
        spec: &LockSpec,
        prev: &MutexStatus,
        runs: &[RunView],
        now: Timestamp,
        facts: MutexFacts,
    ) -> Decision {
        decide_full(spec, prev, runs, now, facts, &[], &MultiKeys::default())
    }

    pub fn decide_requested(
        spec: &LockSpec,
        prev: &MutexStatus,
        runs: &[RunView],
        now: Timestamp,
        facts: MutexFacts,
        requests: &[Result<Request, Unreadable>],
    ) -> Decision {
        decide_full(
            spec,
            prev,
            runs,
            now,
            facts,
            requests,
            &MultiKeys::default(),
        )
    }

    pub fn decide_multikey(
        spec: &LockSpec,
        prev: &MutexStatus,
        runs: &[RunView],
        now: Timestamp,
        facts: MutexFacts,
        multi: &MultiKeys,
    ) -> Decision {
        decide_full(spec, prev, runs, now, facts, &[], multi)
    }

    pub fn decide_full(
        spec: &LockSpec,
        status: &MutexStatus,
        runs: &[RunView],
        now: Timestamp,
        facts: MutexFacts,
        requests: &[Result<Request, Unreadable>],
        multi: &MultiKeys,
    ) -> Decision {
        decide_input(&Input {
            spec,
            status,
            runs,
            now,
            facts,
            requests,
            multi,
            deadlocked: &Default::default(),
            undelivered: &Default::default(),
            closed_by_window: None,
        })
    }
}
