//! The decision core: given what the Mutex status says and what the runs of its
//! key look like now, decide the next status and what to tell each run.
//!
//! Pure and deterministic: no I/O, time comes in as `now`. The reconciler reads
//! the world, calls [`decide`], writes the status with a compare-and-swap, then
//! applies the outcomes and cancels. Every output is derived from state, not
//! from what triggered the call, so re-running it after a crash redoes whatever
//! was not yet applied.

use crate::mutex::{
    Age, GroupMark, Holder, MutexSpec, MutexStatus, Order, RunRef, Supersede, Waiter,
};
use crate::params::CancelMode;
use chrono::{DateTime, Utc};
use std::cmp::Reverse;
use std::collections::{HashMap, HashSet};

/// One Mutex run of this key, as observed now.
#[derive(Clone, Debug, PartialEq)]
pub struct RunView {
    pub run: RunRef,
    /// The owning PipelineRun; None for a standalone run.
    pub parent: Option<Parent>,
    pub group: String,
    pub age: Age,
    pub priority: i64,
    pub supersede: Supersede,
    pub cancel_mode: CancelMode,
    pub wait: bool,
    pub phase: Phase,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Parent {
    pub name: String,
    pub state: ParentState,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParentState {
    Running,
    /// Someone asked it to stop; it may still be running finally tasks.
    StopRequested,
    /// Its Succeeded condition is final: nothing of it runs any more.
    Done,
    /// Deleted (or replaced by another object of the same name).
    Gone,
}

impl ParentState {
    fn ended(self) -> bool {
        matches!(self, ParentState::Done | ParentState::Gone)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Not done yet.
    Live {
        cancel_requested: bool,
        timeout: Timeout,
    },
    /// The run's condition is final, with this reason.
    Done { reason: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timeout {
    NotYet,
    /// This attempt timed out and a retry remains.
    Retry,
    /// Timed out with no retry left.
    Final,
}

/// What a live run's status should say.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Waiting {
        position: usize,
        of: usize,
        holders: Vec<String>,
        retry: bool,
    },
    Acquired {
        token: i64,
        waited_seconds: i64,
    },
    /// `wait: "false"` and the slot was taken.
    NotAcquired {
        holders: Vec<String>,
    },
    Superseded {
        by: String,
    },
    Cancelled {
        why: String,
    },
    TimedOut,
}

/// A PipelineRun the controller must cancel.
#[derive(Clone, Debug, PartialEq)]
pub struct Cancel {
    pub pipeline_run: String,
    pub mode: CancelMode,
    /// The newer PipelineRun that superseded it.
    pub superseded_by: String,
    pub group: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub status: MutexStatus,
    pub outcomes: Vec<(RunRef, Outcome)>,
    pub cancels: Vec<Cancel>,
}

/// Reason a run's condition carries once superseded.
pub const SUPERSEDED: &str = "Superseded";

pub fn decide(
    spec: &MutexSpec,
    prev: &MutexStatus,
    runs: &[RunView],
    now: DateTime<Utc>,
) -> Decision {
    let by_uid: HashMap<&str, &RunView> = runs.iter().map(|r| (r.run.uid.as_str(), r)).collect();
    let mut d = Decider {
        spec,
        st: prev.clone(),
        outcomes: Vec::new(),
        cancels: Vec::new(),
        now,
        runs: &by_uid,
    };

    // A holder keeps the slot until its PipelineRun is done or gone, or (standalone) until the run is deleted.
    d.st.holders.retain(|h| {
        by_uid
            .get(h.run.uid.as_str())
            .is_some_and(|r| r.parent.as_ref().is_none_or(|p| !p.state.ended()))
    });

    // Waiters leave when deleted, done, cancelled, timed out, or when their PipelineRun ended.
    let queue = std::mem::take(&mut d.st.queue);
    for w in queue {
        let Some(r) = by_uid.get(w.run.uid.as_str()) else {
            continue;
        };
        match d.leaving(r) {
            Some(outcome) => d.depart(r, outcome),
            None => d.st.queue.push(w),
        }
    }

    // Newcomers, oldest first, so that one batch decides as if they came one by one.
    let known: HashSet<&str> =
        d.st.holders
            .iter()
            .map(|h| h.run.uid.as_str())
            .chain(d.st.queue.iter().map(|w| w.run.uid.as_str()))
            .collect();
    let mut arrivals: Vec<&RunView> = runs
        .iter()
        .filter(|r| matches!(r.phase, Phase::Live { .. }) && !known.contains(r.run.uid.as_str()))
        .collect();
    arrivals.sort_by(|a, b| a.age.cmp(&b.age).then_with(|| a.run.name.cmp(&b.run.name)));
    for r in arrivals {
        if d.reenter(r) {
            continue;
        }
        if let Some(outcome) = d.leaving(r) {
            d.depart(r, outcome);
            continue;
        }
        d.arrive(r);
        d.grant();
    }
    d.grant();

    // A holder older than a waiting `supersede: running` run of its group is asked to stop;
    // it keeps the slot until its PipelineRun, finally tasks included, is done.
    for h in &d.st.holders {
        if h.supersede == Supersede::None {
            continue;
        }
        let newer = d
            .st
            .queue
            .iter()
            .filter(|w| w.group == h.group && w.supersede == Supersede::Running && w.age > h.age)
            .max_by(|a, b| a.age.cmp(&b.age));
        if let (Some(w), Some(r)) = (newer, by_uid.get(h.run.uid.as_str())) {
            d.cancels
                .extend(cancel_of(r, &label(&w.pipeline_run, &w.run)));
        }
    }

    // A superseded run whose PipelineRun still runs (say the controller stopped between the
    // two writes) gets its cancel again.
    for r in runs {
        if matches!(&r.phase, Phase::Done { reason } if reason == SUPERSEDED) {
            let by = d
                .mark(&r.group)
                .and_then(|m| m.pipeline_run.clone())
                .unwrap_or_else(|| "a newer run".into());
            d.cancels.extend(cancel_of(r, &by));
        }
    }

    // Every live member is told where it stands.
    let holder_names = d.holder_names();
    let of = d.st.queue.len();
    for (i, w) in d.st.queue.iter().enumerate() {
        let retry = by_uid.get(w.run.uid.as_str()).is_some_and(|r| {
            matches!(
                r.phase,
                Phase::Live {
                    timeout: Timeout::Retry,
                    ..
                }
            )
        });
        d.outcomes.push((
            w.run.clone(),
            Outcome::Waiting {
                position: i + 1,
                of,
                holders: holder_names.clone(),
                retry,
            },
        ));
    }
    for h in &d.st.holders {
        if by_uid
            .get(h.run.uid.as_str())
            .is_some_and(|r| matches!(r.phase, Phase::Live { .. }))
        {
            d.outcomes.push((
                h.run.clone(),
                Outcome::Acquired {
                    token: h.token,
                    waited_seconds: h.waited_seconds,
                },
            ));
        }
    }

    d.st.holding = holder_names.join(",");
    d.st.waiting = d.st.queue.len() as i64;
    let mut seen = HashSet::new();
    d.cancels.retain(|c| seen.insert(c.pipeline_run.clone()));
    Decision {
        status: d.st,
        outcomes: d.outcomes,
        cancels: d.cancels,
    }
}

struct Decider<'a> {
    spec: &'a MutexSpec,
    st: MutexStatus,
    outcomes: Vec<(RunRef, Outcome)>,
    cancels: Vec<Cancel>,
    now: DateTime<Utc>,
    runs: &'a HashMap<&'a str, &'a RunView>,
}

impl Decider<'_> {
    /// Should this run be out of the queue? `Some(outcome)` if so, with the
    /// outcome to report when the run is still live.
    fn leaving(&self, r: &RunView) -> Option<Option<Outcome>> {
        if let Phase::Done { .. } = r.phase {
            return Some(None);
        }
        // Superseded wins over the cancel that superseding itself causes: the
        // PipelineRun is cancelled first, and Tekton then cancels the run too.
        if let Some(by) = self.stale(r) {
            return Some(Some(Outcome::Superseded { by }));
        }
        match &r.phase {
            Phase::Done { .. } => Some(None),
            Phase::Live {
                cancel_requested: true,
                ..
            } => Some(Some(Outcome::Cancelled {
                why: "the run was cancelled while waiting".into(),
            })),
            Phase::Live {
                timeout: Timeout::Final,
                ..
            } => Some(Some(Outcome::TimedOut)),
            Phase::Live { .. } => match &r.parent {
                Some(p) if p.state.ended() => Some(Some(Outcome::Cancelled {
                    why: format!("PipelineRun {} ended while waiting", p.name),
                })),
                // Never grant a slot to a PipelineRun that is being stopped.
                Some(p) if p.state == ParentState::StopRequested => {
                    Some(Some(Outcome::Cancelled {
                        why: format!("PipelineRun {} is being stopped", p.name),
                    }))
                }
                _ => None,
            },
        }
    }

    /// Record why a run left (or never joined) the queue; a superseded run's
    /// PipelineRun is cancelled.
    fn depart(&mut self, r: &RunView, outcome: Option<Outcome>) {
        if let Some(Outcome::Superseded { by }) = &outcome {
            self.cancels.extend(cancel_of(r, by));
        }
        self.outcomes.extend(outcome.map(|o| (r.run.clone(), o)));
    }

    fn mark(&self, group: &str) -> Option<&GroupMark> {
        self.st.groups.iter().find(|m| m.group == group)
    }

    /// Stale: a newer run of the group has already enrolled (and maybe deployed).
    /// Returns who superseded it. Runs with `supersede: none` are a pure queue:
    /// never superseded, never marking.
    fn stale(&self, r: &RunView) -> Option<String> {
        let m = self
            .mark(&r.group)
            .filter(|m| r.supersede != Supersede::None && m.newest > r.age)?;
        Some(
            m.pipeline_run
                .clone()
                .unwrap_or_else(|| m.newest.name.clone()),
        )
    }

    /// A second Mutex task of a PipelineRun that already holds this key (a
    /// matrix, or two lock tasks) passes at once with the same token: waiting
    /// for itself would only end at its timeout.
    fn reenter(&mut self, r: &RunView) -> bool {
        let Phase::Live {
            cancel_requested: false,
            timeout: Timeout::NotYet | Timeout::Retry,
        } = r.phase
        else {
            return false;
        };
        let Some(parent) = &r.parent else {
            return false;
        };
        let Some(h) = self
            .st
            .holders
            .iter()
            .find(|h| h.pipeline_run.as_ref() == Some(&parent.name))
        else {
            return false;
        };
        let outcome = Outcome::Acquired {
            token: h.token,
            waited_seconds: (self.now - r.age.created).num_seconds().max(0),
        };
        self.outcomes.push((r.run.clone(), outcome));
        true
    }

    fn arrive(&mut self, r: &RunView) {
        if !r.wait && self.st.holders.len() >= self.spec.capacity as usize {
            self.outcomes.push((
                r.run.clone(),
                Outcome::NotAcquired {
                    holders: self.holder_names(),
                },
            ));
            return;
        }

        let newcomer = Waiter {
            run: r.run.clone(),
            pipeline_run: r.parent.as_ref().map(|p| p.name.clone()),
            group: r.group.clone(),
            age: r.age.clone(),
            priority: r.priority,
            supersede: r.supersede,
        };
        let by = label(&newcomer.pipeline_run, &newcomer.run);
        if r.supersede != Supersede::None {
            let mark = GroupMark {
                group: r.group.clone(),
                newest: r.age.clone(),
                pipeline_run: newcomer.pipeline_run.clone(),
            };
            match self.st.groups.iter_mut().find(|m| m.group == r.group) {
                Some(m) if m.newest >= r.age => {}
                Some(m) => *m = mark,
                None => self.st.groups.push(mark),
            }
            let (older, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.st.queue)
                .into_iter()
                .partition(|w| {
                    w.group == r.group && w.age < r.age && w.supersede != Supersede::None
                });
            self.st.queue = keep;
            for w in older {
                if let Some(victim) = self.runs.get(w.run.uid.as_str()) {
                    self.cancels.extend(cancel_of(victim, &by));
                }
                self.outcomes
                    .push((w.run, Outcome::Superseded { by: by.clone() }));
            }
        }
        self.st.queue.push(newcomer);
    }

    /// Hand free slots to the head of the queue.
    fn grant(&mut self) {
        let order = self.spec.order;
        self.st.queue.sort_by(|a, b| {
            let by_age = match order {
                Order::OldestFirst => a.age.cmp(&b.age),
                Order::NewestFirst => b.age.cmp(&a.age),
            };
            Reverse(a.priority).cmp(&Reverse(b.priority)).then(by_age)
        });
        while self.st.holders.len() < self.spec.capacity as usize && !self.st.queue.is_empty() {
            let w = self.st.queue.remove(0);
            self.st.last_token += 1;
            let waited = (self.now - w.age.created).num_seconds().max(0);
            // Other lock runs of the same PipelineRun share the grant.
            if w.pipeline_run.is_some() {
                let (same, rest): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.st.queue)
                    .into_iter()
                    .partition(|o| o.pipeline_run == w.pipeline_run);
                self.st.queue = rest;
                for o in same {
                    let outcome = Outcome::Acquired {
                        token: self.st.last_token,
                        waited_seconds: waited,
                    };
                    self.outcomes.push((o.run, outcome));
                }
            }
            self.st.holders.push(Holder {
                run: w.run,
                pipeline_run: w.pipeline_run,
                token: self.st.last_token,
                since: self.now,
                waited_seconds: waited,
                group: w.group,
                age: w.age,
                supersede: w.supersede,
            });
        }
    }

    fn holder_names(&self) -> Vec<String> {
        self.st
            .holders
            .iter()
            .map(|h| label(&h.pipeline_run, &h.run))
            .collect()
    }
}

fn label(pipeline_run: &Option<String>, run: &RunRef) -> String {
    pipeline_run.clone().unwrap_or_else(|| run.name.clone())
}

/// Cancel this run's PipelineRun, unless it is already stopping or over.
fn cancel_of(r: &RunView, by: &str) -> Option<Cancel> {
    let p = r
        .parent
        .as_ref()
        .filter(|p| p.state == ParentState::Running)?;
    Some(Cancel {
        pipeline_run: p.name.clone(),
        mode: r.cancel_mode,
        superseded_by: by.to_string(),
        group: r.group.clone(),
    })
}

#[cfg(test)]
mod tests;
