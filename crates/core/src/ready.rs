//! The lock object's `Ready` condition, decided from the lock state alone: a lock the
//! controller serves is Ready (`Serving`, or `Frozen` while a person holds its queue back);
//! one that can never grant again is not (`TokensExhausted`). A token ledger that cannot be
//! read is reported by the controller with [`not_ready`], since no decision is made then.

use jiff::Timestamp;
use tekton_mutex_api::mutex::{Condition, MAX_TOKEN, MutexStatus};

pub const READY: &str = "Ready";
/// Ready: the controller serves the lock as its spec says.
pub const SERVING: &str = "Serving";
/// Ready: `spec.frozen` holds the queue back on purpose.
pub const FROZEN: &str = "Frozen";
/// Ready: a scheduled window (`spec.windows`) grants nothing new now.
pub const WINDOW_CLOSED: &str = "WindowClosed";
/// Not ready: a window of `spec.windows` cannot be read, so nothing new is granted.
pub const INVALID_WINDOW: &str = "InvalidWindow";
/// Ready: a window would grant nothing new, but an operator's `spec.windowOverride` lets it.
pub const WINDOW_OVERRIDDEN: &str = "WindowOverridden";
/// Not ready: `lastToken` is the largest token, so nothing more can be granted.
pub const TOKENS_EXHAUSTED: &str = "TokensExhausted";

/// What the `Ready` condition says, before it is stamped with a time and a generation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The readiness of a lock whose state was just decided.
pub fn of(status: &MutexStatus) -> Readiness {
    if status.last_token >= MAX_TOKEN {
        return Readiness {
            ready: false,
            reason: TOKENS_EXHAUSTED,
            message: format!(
                "lastToken is {MAX_TOKEN}, the largest fencing token: nothing more is granted. \
                 Delete the lock object and its token ledger entry to start again"
            ),
        };
    }
    if status.frozen {
        return Readiness {
            ready: true,
            reason: FROZEN,
            message: "frozen: holders keep their slots and nothing new is granted until \
                      `tkn mutex unfreeze`"
                .into(),
        };
    }
    if let Some(window) = &status.closed_by_window {
        let invalid = window.starts_with(crate::window::INVALID);
        return Readiness {
            ready: !invalid,
            reason: if invalid {
                INVALID_WINDOW
            } else {
                WINDOW_CLOSED
            },
            message: window.clone(),
        };
    }
    if let Some(overridden) = &status.window_override {
        return Readiness {
            ready: true,
            reason: WINDOW_OVERRIDDEN,
            message: overridden.clone(),
        };
    }
    Readiness {
        ready: true,
        reason: SERVING,
        message: "the controller serves this lock".into(),
    }
}

/// A lock the controller cannot serve for a reason outside its state (`reason` in CamelCase).
pub fn not_ready(reason: &'static str, message: String) -> Readiness {
    Readiness {
        ready: false,
        reason,
        message,
    }
}

/// Set the `Ready` condition to `readiness`, for `generation`. Its transition time moves
/// only when True/False changes, so a steady lock writes nothing new.
pub fn stamp(
    status: &mut MutexStatus,
    readiness: Readiness,
    generation: Option<i64>,
    now: Timestamp,
) {
    let value = if readiness.ready { "True" } else { "False" };
    let since = status
        .conditions
        .iter()
        .find(|c| c.type_ == READY && c.status == value)
        .map_or(now, |c| c.last_transition_time);
    status.conditions.retain(|c| c.type_ != READY);
    status.conditions.push(Condition {
        type_: READY.into(),
        status: value.into(),
        reason: readiness.reason.into(),
        message: readiness.message,
        last_transition_time: since,
        observed_generation: generation,
    });
}

/// The `Ready` condition of a status, if it has one.
pub fn condition(status: &MutexStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == READY)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restamp(st: &mut MutexStatus, generation: Option<i64>, now: Timestamp) {
        let readiness = of(st);
        stamp(st, readiness, generation, now);
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn a_served_lock_is_ready_and_stays_so_without_a_new_transition() {
        let mut st = MutexStatus::default();
        restamp(&mut st, Some(1), at(10));
        let first = condition(&st).unwrap().clone();
        assert_eq!(
            (first.status.as_str(), first.reason.as_str()),
            ("True", SERVING)
        );
        restamp(&mut st, Some(1), at(20));
        assert_eq!(
            condition(&st),
            Some(&first),
            "nothing changed, nothing to write"
        );
        assert_eq!(st.conditions.len(), 1);
    }

    #[test]
    fn frozen_is_ready_with_its_reason_and_keeps_the_transition_time() {
        let mut st = MutexStatus::default();
        restamp(&mut st, Some(1), at(10));
        st.frozen = true;
        restamp(&mut st, Some(2), at(20));
        let c = condition(&st).unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", FROZEN));
        assert_eq!(c.last_transition_time, at(10));
        assert_eq!(c.observed_generation, Some(2));
    }

    #[test]
    fn exhausted_tokens_are_not_ready_and_the_transition_is_dated() {
        let mut st = MutexStatus::default();
        restamp(&mut st, Some(1), at(10));
        st.last_token = MAX_TOKEN;
        restamp(&mut st, Some(1), at(30));
        let c = condition(&st).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", TOKENS_EXHAUSTED)
        );
        assert_eq!(c.last_transition_time, at(30));
    }

    #[test]
    fn a_failure_outside_the_state_then_recovery() {
        let mut st = MutexStatus::default();
        restamp(&mut st, Some(1), at(10));
        let failed = not_ready("TokenLedgerFailed", "cannot read".into());
        stamp(&mut st, failed, Some(1), at(20));
        assert_eq!(condition(&st).unwrap().status, "False");
        restamp(&mut st, Some(1), at(40));
        let c = condition(&st).unwrap();
        assert_eq!(
            (c.status.as_str(), c.last_transition_time),
            ("True", at(40))
        );
    }

    #[test]
    fn a_closed_window_is_ready_and_an_invalid_one_is_not() {
        let mut st = MutexStatus {
            closed_by_window: Some("deny window w until Mon 08:00 UTC".into()),
            ..MutexStatus::default()
        };
        let r = of(&st);
        assert_eq!((r.ready, r.reason), (true, WINDOW_CLOSED));
        st.closed_by_window = Some(crate::window::invalid("window w: duration \"0s\": ..."));
        let r = of(&st);
        assert_eq!((r.ready, r.reason), (false, INVALID_WINDOW));
        assert!(r.message.contains("window w: duration"), "{}", r.message);
        let st = MutexStatus {
            window_override: Some("deny window w until Mon 08:00 UTC, overridden ...".into()),
            ..MutexStatus::default()
        };
        let r = of(&st);
        assert_eq!((r.ready, r.reason), (true, WINDOW_OVERRIDDEN));
        assert!(r.message.contains("overridden"), "{}", r.message);
    }
}
