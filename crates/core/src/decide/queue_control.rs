//! Queue control by people, as steps of the decision: requests are checked
//! against the lock state and done or refused (each acknowledged in
//! `status.observedRequests`); runs let go stay let go while anything of them
//! can still run; promoted waiters go first; a frozen key's waiters say so.
//! Freezing itself is one line in `grant`: a frozen key grants nothing.

use super::decider::{Decider, label, still_holds};
use crate::model::{ControlCancel, Decision, Outcome, ParentState, Phase, RunView};
use crate::requests::{
    Action, Dismissal, Dismissed, MAX_OBSERVED_REQUESTS, ObservedRequest, Request, Unreadable,
    Verdict,
};
use tekton_mutex_api::mutex::LockSpec;

/// What a dismissal covers (a trait: `Dismissed` is an API type of another crate).
trait Covers {
    fn covers_entry(&self, pipeline_run_uid: &Option<String>, run_uid: &str) -> bool;
    fn covers(&self, r: &RunView) -> bool;
}

impl Covers for Dismissed {
    /// Is this status entry (by its PipelineRun uid, else its run uid) the one let go?
    fn covers_entry(&self, pipeline_run_uid: &Option<String>, run_uid: &str) -> bool {
        pipeline_run_uid.as_deref().unwrap_or(run_uid) == self.uid
    }

    fn covers(&self, r: &RunView) -> bool {
        r.parent
            .as_ref()
            .map_or(r.run.uid.as_str(), |p| p.uid.as_str())
            == self.uid
    }
}

impl Decider<'_> {
    /// Act on each request not yet acknowledged, and acknowledge it.
    pub(super) fn take_requests(&mut self, requests: &[Result<Request, Unreadable>]) {
        self.st.frozen = self.spec.frozen;
        self.st.closed_by_window = self.closed_by_window.map(String::from);
        for req in requests {
            let id = match req {
                Ok(r) => &r.id,
                Err(u) => &u.id,
            };
            if self.st.observed_requests.iter().any(|o| o.id == *id) {
                continue;
            }
            let (action, by, result) = match req {
                Ok(r) => (Some(r.action), r.by.clone(), self.act(r)),
                Err(u) => (u.action, u.by.clone(), Err(u.error.clone())),
            };
            let (verdict, message) = match result {
                Ok(m) => (Verdict::Done, m),
                Err(m) => (Verdict::Refused, m),
            };
            self.st.observed_requests.push(ObservedRequest {
                id: id.clone(),
                action,
                by,
                verdict,
                message,
                at: self.now,
            });
        }
        let excess = self
            .st
            .observed_requests
            .len()
            .saturating_sub(MAX_OBSERVED_REQUESTS);
        self.st.observed_requests.drain(..excess);
    }

    /// Do one request; Err says why nothing changed.
    fn act(&mut self, r: &Request) -> Result<String, String> {
        let by = if r.by.is_empty() { "someone" } else { &r.by };
        let why = r
            .reason
            .as_deref()
            .map_or(String::new(), |w| format!(": {w}"));
        let name = || {
            r.pipeline_run
                .clone()
                .ok_or_else(|| format!("a {} request must name a PipelineRun", r.action.as_str()))
        };
        match r.action {
            Action::Release if !r.force => {
                Err("release takes the slot from a running holder: it needs force".into())
            }
            Action::Release => self.release(&name()?, &format!("released by {by}{why}")),
            Action::Clear => Ok(self.clear(&format!("the queue was cleared by {by}{why}"), r)),
            Action::Promote => self.promote(&name()?),
            Action::Forget => match r.group.as_deref() {
                Some(group) => self.forget(group),
                None => Err("a forget request must name a group".into()),
            },
        }
    }

    /// Drop a group's mark; the runs that raised it never raise it again (see
    /// `rebuild_from_runs`), so the group falls back to its other grants.
    fn forget(&mut self, group: &str) -> Result<String, String> {
        let Some(i) = self.st.groups.iter().position(|m| m.group == group) else {
            let marks: Vec<String> = self.st.groups.iter().map(|m| m.group.clone()).collect();
            return Err(format!(
                "group {group} has no supersede mark on the key (marks: {})",
                names_or_nobody(marks)
            ));
        };
        let mark = self.st.groups.remove(i);
        let newest = mark
            .pipeline_run
            .clone()
            .unwrap_or(mark.newest.name.clone());
        let sequence = mark
            .newest
            .sequence
            .map_or(String::new(), |s| format!(", sequence {s}"));
        self.st.forgotten_marks.retain(|f| f.group != group);
        self.st.forgotten_marks.push(mark);
        Ok(format!(
            "forgot the supersede mark of group {group} (newest granted: {newest}{sequence}); \
             its runs are now judged stale only against other grants"
        ))
    }

    fn release(&mut self, name: &str, message: &str) -> Result<String, String> {
        let Some(i) = self
            .st
            .holders
            .iter()
            .position(|h| label(&h.pipeline_run, &h.run) == name)
        else {
            return Err(format!(
                "PipelineRun {name} does not hold the key (holders: {})",
                names_or_nobody(self.holder_names())
            ));
        };
        let h = self.st.holders.remove(i);
        self.st.dismissed.push(Dismissed {
            pipeline_run: h.pipeline_run.clone(),
            uid: self.party_uid(&h.pipeline_run_uid, &h.run.uid),
            dismissal: Dismissal::Released,
            message: format!("the hold of {name} was {message}"),
            keep_pipeline_run: false,
        });
        Ok(format!(
            "released {name} (token {}); the next waiter gets a higher token",
            h.token
        ))
    }

    fn clear(&mut self, message: &str, r: &Request) -> String {
        let waiters = std::mem::take(&mut self.st.queue);
        let n = waiters.len();
        for w in waiters {
            let uid = self.party_uid(&w.pipeline_run_uid, &w.run.uid);
            self.st.dismissed.push(Dismissed {
                pipeline_run: w.pipeline_run.clone(),
                uid,
                dismissal: Dismissal::Cleared,
                message: message.into(),
                keep_pipeline_run: r.keep_pipeline_runs,
            });
        }
        let kept = match r.keep_pipeline_runs {
            true => "; their PipelineRuns are left running",
            false => "; their PipelineRuns are cancelled",
        };
        format!("cleared {n} waiter{}{kept}", if n == 1 { "" } else { "s" })
    }

    fn promote(&mut self, name: &str) -> Result<String, String> {
        let Some(w) = self
            .st
            .queue
            .iter()
            .find(|w| label(&w.pipeline_run, &w.run) == name)
        else {
            return Err(format!("PipelineRun {name} is not waiting for the key"));
        };
        let uid = w.run.uid.clone();
        self.st.promoted.retain(|u| *u != uid);
        self.st.promoted.insert(0, uid);
        Ok(format!("moved {name} to the front of the queue"))
    }

    /// Runs let go are out of the holders and the queue; their live lock runs
    /// are told `Cleared`; their PipelineRuns are cancelled (unless kept). An
    /// entry is forgotten once nothing of its PipelineRun can run.
    pub(super) fn carry_out_dismissals(&mut self) {
        let dismissed = std::mem::take(&mut self.st.dismissed);
        for d in &dismissed {
            self.st
                .holders
                .retain(|h| !d.covers_entry(&h.pipeline_run_uid, &h.run.uid));
            self.st
                .queue
                .retain(|w| !d.covers_entry(&w.pipeline_run_uid, &w.run.uid));
            for r in self.all.iter().filter(|r| d.covers(r)) {
                if matches!(r.phase, Phase::Live { .. }) {
                    let message = d.message.clone();
                    self.outcomes
                        .push((r.run.clone(), Outcome::Cleared { message }));
                }
                self.control_cancels.extend(control_cancel(r, d));
            }
        }
        let mut seen = std::collections::HashSet::new();
        self.control_cancels
            .retain(|c| seen.insert(c.pipeline_run_uid.clone()));
        let all = self.all;
        self.st.dismissed = dismissed
            .into_iter()
            .filter(|d| {
                all.iter().any(|r| {
                    d.covers(r) && (matches!(r.phase, Phase::Live { .. }) || still_holds(r))
                })
            })
            .collect();
    }

    /// The uid a dismissal goes by: the run's PipelineRun as observed now (an
    /// entry from before uids were kept has none), else the entry's, else the run's own.
    fn party_uid(&self, pipeline_run_uid: &Option<String>, run_uid: &str) -> String {
        let observed = self.runs.get(run_uid).and_then(|r| r.parent.as_ref());
        observed
            .map(|p| p.uid.clone())
            .or_else(|| pipeline_run_uid.clone())
            .unwrap_or_else(|| run_uid.to_string())
    }

    /// Is this run part of a PipelineRun a person let go?
    pub(super) fn dismissed(&self, r: &RunView) -> bool {
        self.st.dismissed.iter().any(|d| d.covers(r))
    }

    /// Promoted waiters first, the latest promotion first; a promotion is
    /// forgotten once its waiter leaves the queue (granted or gone).
    pub(super) fn promoted_first(&mut self) {
        let queue = &mut self.st.queue;
        self.st
            .promoted
            .retain(|uid| queue.iter().any(|w| w.run.uid == *uid));
        let mut front = Vec::new();
        for uid in &self.st.promoted {
            if let Some(i) = queue.iter().position(|w| w.run.uid == *uid) {
                front.push(queue.remove(i));
            }
        }
        front.append(queue);
        *queue = front;
    }
}

/// Cancel the PipelineRun of a run let go, unless kept, not ours to cancel, or already stopping.
fn control_cancel(r: &RunView, d: &Dismissed) -> Option<ControlCancel> {
    if d.keep_pipeline_run || r.phase == Phase::Unlisted {
        return None;
    }
    let p = r
        .parent
        .as_ref()
        .filter(|p| p.state == ParentState::Running)?;
    Some(ControlCancel {
        pipeline_run: p.name.clone(),
        pipeline_run_uid: p.uid.clone(),
        mode: r.cancel_mode,
        dismissal: d.dismissal,
        message: d.message.clone(),
    })
}

fn names_or_nobody(names: Vec<String>) -> String {
    if names.is_empty() {
        "nobody".into()
    } else {
        names.join(", ")
    }
}

impl Decision {
    /// A promotion is forgotten once its waiter left the queue; on a frozen key, or one a
    /// scheduled window closes, a waiter's status says so, with the reason.
    pub(super) fn finish_controls(mut self, spec: &LockSpec, window: Option<&str>) -> Decision {
        let queue = &self.status.queue;
        self.status
            .promoted
            .retain(|uid| queue.iter().any(|w| w.run.uid == *uid));
        if !spec.frozen && window.is_none() {
            return self;
        }
        // A freeze is said first: it is a person's, and outlasts any window.
        let window = (!spec.frozen).then(|| window.map(String::from)).flatten();
        for (_, o) in &mut self.outcomes {
            if let Outcome::Waiting {
                next,
                holders,
                retry,
            } = o
            {
                *o = Outcome::Frozen {
                    next: *next,
                    holders: std::mem::take(holders),
                    retry: *retry,
                    reason: spec.frozen_reason.clone(),
                    window: window.clone(),
                };
            }
        }
        self
    }
}

#[cfg(test)]
mod tests;
