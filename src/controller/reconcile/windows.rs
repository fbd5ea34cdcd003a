//! A lock's scheduled windows at a given time (issue 48), for its sync: whether they are open
//! (`crate::windows::gate`, which `tkn mutex list` shares), what the lock and its waiters say of
//! them, and when to look again.

use crate::core::window::Gate;
use jiff::Timestamp;
use std::time::Duration;

pub use crate::windows::gate;

/// The message a closed gate gives the waiters.
pub fn closed_by(gate: &Gate) -> Option<&str> {
    match gate {
        Gate::Closed { message, .. } => Some(message),
        Gate::Open | Gate::Overridden { .. } => None,
    }
}

/// What the lock's status says of an override that opens it.
pub fn overridden_by(gate: &Gate) -> Option<&str> {
    match gate {
        Gate::Overridden { message, .. } => Some(message),
        Gate::Open | Gate::Closed { .. } => None,
    }
}

/// How long until the gate changes, when it says (a closed window opens, an override ends): the
/// sync looks again then (just after).
pub fn changes_in(gate: &Gate, now: Timestamp) -> Option<Duration> {
    let until = match gate {
        Gate::Closed {
            until: Some(until), ..
        }
        | Gate::Overridden { until, .. } => until,
        _ => return None,
    };
    let wait = Duration::try_from(until.duration_since(now)).unwrap_or_default();
    Some(wait + Duration::from_millis(20))
}
