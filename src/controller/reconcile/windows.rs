//! A lock's scheduled windows at a given time (issue 48), for its sync: the core decides whether
//! they are open (`core::window::gate`, pure); this resolves their time zones in the time zone
//! database the binary carries (the image may have none) and says when to look again.

use crate::core::window::{self, Gate};
use crate::model::mutex::LockSpec;
use jiff::Timestamp;
use jiff::tz::TimeZone;
use std::time::Duration;

/// Whether the lock's windows let it grant anything new at `now`. An invalid window closes it,
/// saying which and why: a window written wrong must never mean "always open".
pub fn gate(spec: &LockSpec, now: Timestamp) -> Gate {
    if spec.windows.is_empty() {
        return Gate::Open;
    }
    match window::parse_all(&spec.windows, |name| TimeZone::get(name).ok()) {
        Ok(windows) => window::gate(&windows, now),
        Err(e) => Gate::Closed {
            message: window::invalid(&e),
            until: None,
        },
    }
}

/// The message a closed gate gives the waiters.
pub fn closed_by(gate: &Gate) -> Option<&str> {
    match gate {
        Gate::Open => None,
        Gate::Closed { message, .. } => Some(message),
    }
}

/// How long until the gate opens, when it says: the sync looks again then (just after).
pub fn opens_in(gate: &Gate, now: Timestamp) -> Option<Duration> {
    let Gate::Closed {
        until: Some(until), ..
    } = gate
    else {
        return None;
    };
    let wait = Duration::try_from(until.duration_since(now)).unwrap_or_default();
    Some(wait + Duration::from_millis(20))
}
