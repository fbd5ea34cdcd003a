//! Events on the CustomRun (or Run) for every transition, so that
//! `kubectl describe customrun` tells the whole story: Waiting (once),
//! Acquired (token, waited time), Superseded, TimedOut, InvalidParams, Released.
//! Recording an Event is best effort and in the background: a failure is
//! logged, never retried, and never delays a grant.

use crate::controller::context::Context;
use crate::core::model::Outcome;
use crate::core::observe::ObservedRun;
use crate::core::run_status::{self, Reason};
use crate::core::scope::Scope;
use crate::model::mutex::{MutexStatus, RunKind, RunRef};
use crate::model::tekton::RunStatus;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};
use tracing::warn;

/// A run's transition, as an Event reason and message.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    pub reason: &'static str,
    pub note: String,
    pub type_: EventType,
}

/// The Event an outcome calls for, given the run's status before it.
/// None when nothing new happened (e.g. a waiter that only moved up the
/// queue), and for Superseded, which `writes::superseded_event` records.
pub fn for_outcome(
    kind: RunKind,
    key: &str,
    outcome: &Outcome,
    before: &RunStatus,
) -> Option<Transition> {
    let was = before
        .succeeded()
        .map(|c| c.reason.clone().unwrap_or_default());
    let (_, note) = run_status::condition(kind, key, outcome);
    let (reason, type_) = match outcome {
        Outcome::Waiting { .. } if was.as_deref() == Some(Reason::Waiting.as_str()) => return None,
        Outcome::Waiting { .. } => (Reason::Waiting.as_str(), EventType::Normal),
        Outcome::Acquired { .. } => (Reason::Acquired.as_str(), EventType::Normal),
        Outcome::NotAcquired { .. } => (Reason::NotAcquired.as_str(), EventType::Normal),
        // Recorded with who superseded it, by the cancel path (writes::superseded_event).
        Outcome::Superseded { .. } => return None,
        // A PipelineRun queued as a whole timed out in the queue (`queue-timeout`).
        Outcome::TimedOut if kind == RunKind::PipelineRun => {
            (Reason::TimedOut(kind).as_str(), EventType::Warning)
        }
        Outcome::TimedOut => ("TimedOut", EventType::Warning),
        Outcome::Cancelled { .. } => ("Cancelled", EventType::Normal),
        Outcome::QueueFull { .. } | Outcome::StatusFull { .. } => {
            (Reason::QueueFull.as_str(), EventType::Warning)
        }
        Outcome::LockDeleted | Outcome::Uninstalling => {
            (Reason::LockDeleted.as_str(), EventType::Warning)
        }
        Outcome::StartedWithoutGrant => (Reason::StartedWithoutGrant.as_str(), EventType::Warning),
        Outcome::MutexDeleting if was.as_deref() == Some(Reason::Waiting.as_str()) => return None,
        Outcome::MutexDeleting => (Reason::Waiting.as_str(), EventType::Normal),
        Outcome::Frozen {
            window: Some(_), ..
        } if was.as_deref() == Some(Reason::WindowClosed.as_str()) => return None,
        Outcome::Frozen {
            window: Some(_), ..
        } => (Reason::WindowClosed.as_str(), EventType::Normal),
        Outcome::Frozen { .. } if was.as_deref() == Some(Reason::Frozen.as_str()) => return None,
        Outcome::Frozen { .. } => (Reason::Frozen.as_str(), EventType::Normal),
        Outcome::Cleared { .. } => (Reason::Cleared.as_str(), EventType::Warning),
        Outcome::Deadlock { .. } => (Reason::Deadlock.as_str(), EventType::Warning),
    };
    Some(Transition {
        reason,
        note,
        type_,
    })
}

/// Released events for the holders a status write let go.
pub fn releases(key: &str, before: &MutexStatus, after: &MutexStatus) -> Vec<(RunRef, Transition)> {
    let now = Timestamp::now();
    before
        .holders
        .iter()
        .filter(|h| !after.holders.iter().any(|a| a.run.uid == h.run.uid))
        .map(|h| {
            (
                h.run.clone(),
                Transition {
                    reason: "Released",
                    note: format!(
                        "released {key} (token {}) after holding it {}",
                        h.token,
                        held_for(h.since, now)
                    ),
                    type_: EventType::Normal,
                },
            )
        })
        .collect()
}

fn held_for(since: Timestamp, now: Timestamp) -> String {
    format!("{}s", now.duration_since(since).as_secs().max(0))
}

pub fn invalid_params(message: &str) -> Transition {
    Transition {
        reason: Reason::InvalidParams.as_str(),
        note: message.to_string(),
        type_: EventType::Warning,
    }
}

/// The reason of the Event on an object the controller failed to write.
pub const WRITE_FAILED: &str = "WriteFailed";

/// A run as an Event's subject.
pub fn run_reference(namespace: &str, run: &RunRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(run.kind.api_version().into()),
        kind: Some(run.kind.as_str().into()),
        name: Some(run.name.clone()),
        namespace: Some(namespace.into()),
        uid: Some(run.uid.clone()),
        ..Default::default()
    }
}

/// Records the Event on the run (best effort, in the background).
pub fn record(ctx: &Context, namespace: &str, run: &RunRef, t: Transition) {
    record_on(ctx, run_reference(namespace, run), t);
}

/// A write the API server refused (denied, throttled, too large): logged, and
/// said on the object, since the object's own status could not say it.
pub fn write_failed(
    ctx: &Context,
    reference: ObjectReference,
    what: &str,
    error: &crate::controller::context::Error,
) {
    warn!(object = ?reference.name, namespace = ?reference.namespace, what, %error, "write failed; retrying with backoff");
    // The API server's own message, not the whole Status (the recorder cuts a long note).
    let cause = match error {
        crate::controller::context::Error::Kube(kube::Error::Api(s)) => s.message.clone(),
        other => other.to_string(),
    };
    let note = format!("tekton-mutex could not {what} (retrying with backoff): {cause}");
    let t = Transition {
        reason: WRITE_FAILED,
        note,
        type_: EventType::Warning,
    };
    record_on(ctx, reference, t);
}

/// The reason of the Event on a lock object whose token ledger cannot be read or written.
pub const LEDGER_FAILED: &str = "TokenLedgerFailed";

/// The token ledger (token_floor.rs) refused to `what` (read the floor, record the last token) of
/// lock object `lock`: logged by the error policy, and said on the lock object too, since its
/// status cannot say it. `stuck` says what waits for the ledger; the error names the ConfigMap
/// and the fix. Errors other than the ledger's are left to the caller.
/// The reason of the Warning on a lock object whose status write the API server refused.
pub const STATUS_WRITE_FAILED: &str = "StatusWriteFailed";

/// The API server refused the lock object's status write (not a conflict): said on the lock
/// object, since its status cannot say it.
pub fn status_write_failed<L>(ctx: &Context, lock: &L, error: &crate::controller::context::Error)
where
    L: kube::Resource<DynamicType = ()>,
{
    let kind = L::kind(&());
    let note = format!(
        "tekton-mutex could not write the status of this {kind}, so nothing changes on it \
         (retrying with backoff): {error}"
    );
    let t = Transition {
        reason: STATUS_WRITE_FAILED,
        note,
        type_: EventType::Warning,
    };
    record_on(ctx, lock.object_ref(&()), t);
}

pub fn ledger_failed<L>(
    ctx: &Context,
    lock: &L,
    what: &str,
    stuck: &str,
    error: &crate::controller::context::Error,
) where
    L: kube::Resource<DynamicType = ()>,
{
    if !matches!(error, crate::controller::context::Error::Ledger(_)) {
        return;
    }
    let kind = L::kind(&());
    let note = format!(
        "tekton-mutex could not {what} of this {kind}; {stuck} (retrying with backoff): {error}"
    );
    let t = Transition {
        reason: LEDGER_FAILED,
        note,
        type_: EventType::Warning,
    };
    record_on(ctx, lock.object_ref(&()), t);
}

fn record_on(ctx: &Context, reference: ObjectReference, t: Transition) {
    let event = Event {
        type_: t.type_,
        reason: t.reason.into(),
        note: Some(t.note),
        action: "Lock".into(),
        secondary: None,
    };
    // Off the hand-over path: the next grant's writes do not wait for Events.
    let (recorder, metrics, name) = (
        ctx.recorder.clone(),
        ctx.metrics.clone(),
        reference.name.clone().unwrap_or_default(),
    );
    tokio::spawn(async move {
        // Counted where it is sent, so a write is announced right before it goes.
        metrics.api_write("create", "events");
        if let Err(e) = recorder.publish(&event, &reference).await {
            warn!(error = %e, run = %name, reason = %event.reason, "could not record an Event");
        }
    });
}

/// After a run's status patch: count it and record its Event.
pub fn run_transition(
    ctx: &Context,
    namespace: &str,
    key: &str,
    run: &RunRef,
    outcome: &Outcome,
    before: &RunStatus,
) {
    let ns = crate::metrics::Ns {
        namespace: namespace.into(),
    };
    match outcome {
        Outcome::Superseded { .. } => ctx.metrics.supersedes.get_or_create(&ns).inc(),
        Outcome::TimedOut => ctx.metrics.timeouts.get_or_create(&ns).inc(),
        Outcome::StartedWithoutGrant => ctx.metrics.started_without_grant.get_or_create(&ns).inc(),
        _ => 0,
    };
    if let Some(t) = for_outcome(run.kind, key, outcome, before) {
        record(ctx, namespace, run, t);
    }
}

/// After a Mutex status write: count grants and handovers, record Released.
pub fn status_written(
    ctx: &Context,
    scope: &Scope,
    key: &str,
    before: &MutexStatus,
    after: &MutexStatus,
    seen: Timestamp,
) {
    ctx.metrics
        .status_written(scope.label(), key, before, after, seen);
    for (run, t) in releases(key, before, after) {
        if let Some((ns, local)) = scope.local_run(&run) {
            record(ctx, &ns, &local, t);
        }
    }
}

/// The lock's own Event when its `Ready` condition turns to a window's reason: a window closed
/// it, an operator's override opened it, or its windows cannot be read (a Warning). Said once
/// per change, after the status that says it was written.
pub fn window_changed<L>(ctx: &Context, lock: &L, before: &MutexStatus, after: &MutexStatus)
where
    L: kube::Resource<DynamicType = ()>,
{
    if let Some(t) = window_transition(before, after) {
        record_on(ctx, lock.object_ref(&()), t);
    }
}

fn window_transition(before: &MutexStatus, after: &MutexStatus) -> Option<Transition> {
    use crate::core::ready::{INVALID_WINDOW, WINDOW_CLOSED, WINDOW_OVERRIDDEN};
    let ready = |s: &MutexStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    let (reason, note) = ready(after)?;
    let reason = [WINDOW_CLOSED, WINDOW_OVERRIDDEN, INVALID_WINDOW]
        .into_iter()
        .find(|r| *r == reason)?;
    if ready(before).is_some_and(|(was, said)| was == reason && said == note) {
        return None;
    }
    let type_ = if reason == INVALID_WINDOW {
        EventType::Warning
    } else {
        EventType::Normal
    };
    Some(Transition {
        reason,
        note,
        type_,
    })
}

/// After an InvalidParams status patch.
pub fn invalid(ctx: &Context, o: &ObservedRun<'_>, message: &str) {
    ctx.metrics.invalid(&o.namespace, message);
    record(ctx, &o.namespace, &o.run_ref(), invalid_params(message));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tekton::Condition;

    fn ready(reason: &str, message: &str) -> MutexStatus {
        MutexStatus {
            conditions: vec![crate::model::mutex::Condition {
                type_: "Ready".into(),
                status: "True".into(),
                reason: reason.into(),
                message: message.into(),
                last_transition_time: Timestamp::UNIX_EPOCH,
                observed_generation: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_window_change_is_said_once_on_the_lock_and_an_invalid_window_is_a_warning() {
        let serving = ready("Serving", "the controller serves this lock");
        let closed = ready("WindowClosed", "deny window w until Mon 08:00 UTC");
        let t = window_transition(&serving, &closed).unwrap();
        assert_eq!((t.reason, t.type_), ("WindowClosed", EventType::Normal));
        assert_eq!(window_transition(&closed, &closed), None);
        let over = ready(
            "WindowOverridden",
            "deny window w ..., overridden until ...: hotfix",
        );
        assert_eq!(
            window_transition(&closed, &over).unwrap().reason,
            "WindowOverridden"
        );
        let invalid = ready("InvalidWindow", "invalid window w: ...");
        assert_eq!(
            window_transition(&serving, &invalid).unwrap().type_,
            EventType::Warning
        );
        assert_eq!(window_transition(&closed, &serving), None);
    }

    fn status(reason: &str) -> RunStatus {
        RunStatus {
            conditions: vec![Condition {
                type_: "Succeeded".into(),
                status: "Unknown".into(),
                reason: Some(reason.into()),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn waiting(next: bool) -> Outcome {
        Outcome::Waiting {
            next,
            holders: if next { vec!["a".into()] } else { vec![] },
            retry: false,
        }
    }

    #[test]
    fn waiting_is_recorded_once_not_on_every_move() {
        let first = for_outcome(
            RunKind::CustomRun,
            "k",
            &waiting(false),
            &RunStatus::default(),
        );
        assert_eq!(first.map(|t| t.reason), Some("Waiting"));
        let moved = for_outcome(RunKind::CustomRun, "k", &waiting(true), &status("Waiting"));
        assert_eq!(moved, None);
    }

    #[test]
    fn acquired_tells_token_and_wait() {
        let t = for_outcome(
            RunKind::CustomRun,
            "env",
            &Outcome::Acquired {
                token: 7,
                waited_seconds: 12,
            },
            &status("Waiting"),
        )
        .unwrap();
        assert_eq!(t.reason, "Acquired");
        assert!(
            t.note.contains("token 7") && t.note.contains("12s"),
            "{}",
            t.note
        );
    }
}
