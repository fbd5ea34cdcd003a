//! From what the reconciler fetched to what the decision core reads. Pure: a run,
//! its parsed config and its PipelineRun (as fetched, or gone) become a [`RunView`]
//! and the deadline of its current attempt.

use crate::model::{Parent, ParentState, Phase, RunView, Timeout};
use crate::observe::ObservedRun;
use crate::params::{CancelMode, RunConfig, STANDALONE_DEFAULT_TIMEOUT, WaitLimit};
use crate::release_after;
use crate::run_status;
use jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use tekton_mutex_api::mutex::{Age, RunKind, Waiter};
use tekton_mutex_api::tekton::labels::PIPELINE_LABEL;
use tekton_mutex_api::tekton::pipelinerun::PipelineRun;

/// The owning PipelineRun as fetched: `object` is None when it is gone
/// (deleted, being deleted, or replaced by another object of the same name).
/// `pods_alive`: some pod of it has not ended (looked up only where it matters:
/// for a holder whose PipelineRun has ended).
#[derive(Clone, Copy, Debug)]
pub struct FetchedParent<'a> {
    pub name: &'a str,
    pub uid: &'a str,
    pub object: Option<&'a PipelineRun>,
    pub pods_alive: bool,
    /// The tasks the run named in `release-after` are done and their pods ended.
    pub section_done: bool,
}

/// A run as the decision core sees it, with the deadline of its current attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct MemberView {
    pub view: RunView,
    /// When the current attempt times out; None waits forever.
    pub deadline: Option<Timestamp>,
}

pub fn member_view(
    o: &ObservedRun<'_>,
    cfg: &RunConfig,
    parent: Option<FetchedParent<'_>>,
    now: Timestamp,
) -> MemberView {
    let age = age(o, cfg, parent);
    let deadline = deadline(o, cfg);
    MemberView {
        view: RunView {
            run: o.run_ref(),
            parent: parent.map(|p| Parent {
                name: p.name.to_string(),
                uid: p.uid.to_string(),
                state: release_after::state(parent_state(p.object, p.pods_alive), p.section_done),
            }),
            group: group(o, cfg, parent, &age),
            age,
            priority: cfg.priority,
            supersede: cfg.supersede,
            cancel_mode: cancel_mode(o, cfg),
            wait: cfg.wait,
            waiting_since: o.waiting_since(),
            cancel_message: o.status_message.map(str::to_string),
            phase: match parent {
                Some(p) if !listed(o, p) => Phase::Unlisted,
                _ => phase(o, cfg, deadline, now),
            },
            acquired_token: run_status::acquired_token(&o.status),
            started: o.started,
        },
        deadline,
    }
}

/// How the run's PipelineRun is cancelled. A PipelineRun queued as a whole that
/// was not granted has started nothing, and nothing of it may run unguarded:
/// not even its finally tasks, so it is cancelled outright. Once granted, its
/// `cancel-mode` is the annotation's.
fn cancel_mode(o: &ObservedRun<'_>, cfg: &RunConfig) -> CancelMode {
    match o.kind {
        RunKind::PipelineRun if run_status::acquired_token(&o.status).is_none() => {
            CancelMode::Cancelled
        }
        _ => cfg.cancel_mode,
    }
}

/// A holder, or a run a slot is reserved for, whose lock run was deleted, as the
/// core sees it: its PipelineRun keeps the slot until released. Its params went
/// with the run object, so the cancel mode (should a newer run supersede it) is
/// the default one.
pub fn deleted_member_view(w: &Waiter, since: Timestamp, parent: FetchedParent<'_>) -> MemberView {
    MemberView {
        view: RunView {
            run: w.run.clone(),
            parent: Some(Parent {
                name: parent.name.to_string(),
                uid: parent.uid.to_string(),
                state: parent_state(parent.object, parent.pods_alive),
            }),
            group: w.group.clone(),
            age: w.age.clone(),
            priority: w.priority,
            supersede: w.supersede,
            cancel_mode: CancelMode::default(),
            wait: true,
            phase: Phase::Deleted,
            waiting_since: since,
            cancel_message: None,
            // The hold is the status's own entry: nothing to rebuild it from.
            acquired_token: None,
            started: false,
        },
        deadline: None,
    }
}

/// A run's age is its PipelineRun's: sibling lock runs compare equal, and a late
/// lock task of an old PipelineRun is still old. A standalone run is its own.
pub fn age(o: &ObservedRun<'_>, cfg: &RunConfig, parent: Option<FetchedParent<'_>>) -> Age {
    let (name, created) = match parent {
        Some(p) => (
            p.name.to_string(),
            p.object
                .and_then(|pr| pr.creation_timestamp())
                .map(|t| t.0)
                .unwrap_or(o.created),
        ),
        None => (o.name.clone(), o.created),
    };
    Age {
        sequence: cfg.sequence,
        created,
        name,
    }
}

/// The `group` param, else the Pipeline's name (from the run's label or its
/// PipelineRun's), else the run stands alone in a group of its own name.
pub fn group(
    o: &ObservedRun<'_>,
    cfg: &RunConfig,
    parent: Option<FetchedParent<'_>>,
    age: &Age,
) -> String {
    cfg.group
        .clone()
        .or_else(|| o.pipeline_label.clone())
        .or_else(|| {
            parent
                .and_then(|p| p.object)
                .and_then(|pr| pr.label(PIPELINE_LABEL).map(str::to_string))
        })
        .unwrap_or_else(|| age.name.clone())
}

/// When the current attempt stops waiting: the run's `spec.timeout` if set. Unset,
/// a PipelineRun's run waits as long as its PipelineRun may run (Tekton cancels
/// it when the PipelineRun times out), and a standalone run gets Tekton's default
/// of 1h. A timeout too large for a date is no timeout at all.
pub fn deadline(o: &ObservedRun<'_>, cfg: &RunConfig) -> Option<Timestamp> {
    let limit = match cfg.timeout {
        WaitLimit::After(t) => t,
        WaitLimit::Unset if o.parent.is_none() => STANDALONE_DEFAULT_TIMEOUT,
        WaitLimit::Unset | WaitLimit::Never => return None,
    };
    SignedDuration::try_from(limit)
        .ok()
        .and_then(|t| o.attempt_start().checked_add(t).ok())
}

/// Does the run's PipelineRun list it as its child? A PipelineRun that is gone
/// cannot say; such a run only ever leaves (its parent has ended).
pub fn listed(o: &ObservedRun<'_>, parent: FetchedParent<'_>) -> bool {
    let kind = match o.kind {
        RunKind::CustomRun => "CustomRun",
        RunKind::Run => "Run",
        // A PipelineRun queued as a whole is its own parent.
        RunKind::PipelineRun => return parent.uid == o.uid,
    };
    parent.object.is_none_or(|pr| pr.lists(kind, &o.name))
}

pub fn phase(
    o: &ObservedRun<'_>,
    cfg: &RunConfig,
    deadline: Option<Timestamp>,
    now: Timestamp,
) -> Phase {
    if o.is_done() {
        return Phase::Done {
            superseded: run_status::superseded(&o.status),
        };
    }
    Phase::Live {
        cancel_requested: o.cancel_requested,
        timeout: timeout(deadline, o.status.retries_status.len(), cfg.retries, now),
    }
}

/// Has the current attempt timed out, and does a retry remain?
pub fn timeout(
    deadline: Option<Timestamp>,
    attempts_failed: usize,
    retries: u32,
    now: Timestamp,
) -> Timeout {
    match deadline {
        Some(d) if d <= now && attempts_failed < retries as usize => Timeout::Retry,
        Some(d) if d <= now => Timeout::Final,
        _ => Timeout::NotYet,
    }
}

/// Where the PipelineRun is in its life. Done or deleted is not the end while
/// a pod of it still runs: a cancelled step gets SIGTERM and a grace period.
pub fn parent_state(pr: Option<&PipelineRun>, pods_alive: bool) -> ParentState {
    match pr {
        Some(p) if !p.is_done() && p.stopping() => ParentState::StopRequested,
        Some(p) if !p.is_done() => ParentState::Running,
        _ if pods_alive => ParentState::Draining,
        None => ParentState::Gone,
        Some(_) => ParentState::Done,
    }
}

#[cfg(test)]
mod tests;
