//! What a PipelineRun queued as a whole was told lives in a record annotation on it, which its
//! author can write, and which a copy of it (a Rerun) carries over. So the lock's own status,
//! which only the controller writes, says what the record may mean (issue 37):
//! - listed as a holder (by uid): it holds, with the status's token, and until it has been
//!   told so (its record says `Acquired` with that token) it is told again, whatever its
//!   record says, so that a grant interrupted by an edit of the record still starts it;
//! - not listed: its record's claim of a grant only marks its group, as its author could with
//!   `sequence`; it holds nothing and raises no token (`Decider::believed`).

use crate::model::{Phase, RunView, Timeout};
use tekton_mutex_api::mutex::{MutexStatus, RunKind};

/// The runs, with each queued PipelineRun the status lists as a holder seen as that holder.
pub(super) fn as_the_status_says(mut runs: Vec<RunView>, status: &MutexStatus) -> Vec<RunView> {
    for r in &mut runs {
        vouch(r, status);
    }
    runs
}

/// A queued PipelineRun the status lists as a holder, seen as that holder (the apply step
/// reads the same view, so a grant it must tell again is told).
pub fn vouch(r: &mut RunView, status: &MutexStatus) {
    #[cfg(feature = "guard-switches")]
    if super::guard_switches::records_trusted() {
        return;
    }
    if r.run.kind != RunKind::PipelineRun {
        return;
    }
    let Some(h) = status.holders.iter().find(|h| h.run.uid == r.run.uid) else {
        return;
    };
    if r.acquired_token != Some(h.token) {
        r.acquired_token = Some(h.token);
        if matches!(r.phase, Phase::Done { .. }) {
            r.phase = Phase::Live {
                cancel_requested: false,
                timeout: Timeout::NotYet,
            };
        }
    }
}
