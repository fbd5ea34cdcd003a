//! Supersede, the rule of a run's group: a newer run of the group makes the older ones stale.
//! A stale arrival or waiter is told `Superseded` and its PipelineRun cancelled; a holder older
//! than a waiting `supersede: running` run is asked to stop (it keeps the slot until its
//! PipelineRun is done). Each group's newest grant is remembered as a mark in the status, so a
//! late arrival older than it is stale too; idle marks are forgotten, and a person may forget
//! one (`tkn mutex forget`).

use super::cancel::{cancel_beside_outcome, cancel_of};
use super::decider::{Decider, Party, is_parent, label, same_party, waiter_of};
use crate::model::{Outcome, Phase, RunView};
use jiff::{SignedDuration, Timestamp};
use tekton_mutex_api::mutex::{GroupMark, MAX_GROUP_MARKS, Supersede, Waiter};

impl Decider<'_> {
    /// Was this run's mark forgotten by a person? Then rebuilding does not raise it again.
    pub(super) fn forgotten(&self, w: &Waiter) -> bool {
        let forgotten = &self.st.forgotten_marks;
        forgotten
            .iter()
            .any(|f| f.group == w.group && f.newest == w.age)
    }

    /// A forgotten mark is kept only while a run that raised it still shows its grant.
    pub(super) fn keep_forgotten_marks_while_shown(&mut self) {
        let all = self.all;
        self.st.forgotten_marks.retain(|f| {
            all.iter().any(|r| {
                let w = waiter_of(r);
                r.acquired_token.is_some() && f.group == w.group && f.newest == w.age
            })
        });
        self.st.forgotten_marks.truncate(MAX_GROUP_MARKS);
    }

    /// A holder older than a waiting `supersede: running` run of its group is asked
    /// to stop; it keeps the slot until its PipelineRun, finally tasks included, is done.
    pub(super) fn supersede_running(&mut self) {
        for h in &self.st.holders {
            if h.supersede == Supersede::None {
                continue;
            }
            let newer = self
                .st
                .queue
                .iter()
                .chain(self.reserved_waiters())
                .filter(|w| {
                    w.group == h.group
                        && w.supersede == Supersede::Running
                        && w.age > h.age
                        && !same_party(w.party(), h.party())
                })
                .max_by(|a, b| a.age.cmp(&b.age));
            if let (Some(w), Some(r)) = (newer, self.runs.get(h.run.uid.as_str())) {
                self.cancels
                    .extend(cancel_of(r, &label(&w.pipeline_run, &w.run)));
            }
        }
    }

    /// A superseded run whose PipelineRun still runs (say the controller stopped
    /// between the two writes) gets its cancel again.
    pub(super) fn recancel_superseded(&mut self) {
        for r in self.all {
            if r.phase == (Phase::Done { superseded: true }) {
                let by = self
                    .mark(&r.group)
                    .and_then(|m| m.pipeline_run.clone())
                    .unwrap_or_else(|| "a newer run".into());
                self.cancels.extend(cancel_of(r, &by));
            }
        }
    }

    /// The status stays small: a group's mark is forgotten once the group has been
    /// idle (no grant, no holder) for `markIdleDays`, and only the most recently
    /// granted groups are kept.
    /// A mark from before grant times were kept counts as granted now.
    pub(super) fn forget_idle_marks(&mut self) {
        let now = self.now;
        let idle = SignedDuration::from_hours(24 * i64::from(self.spec.mark_idle_days));
        for m in &mut self.st.groups {
            m.granted.get_or_insert(now);
        }
        let holders = &self.st.holders;
        // A group that still holds the key is not idle.
        self.st.groups.retain(|m| {
            m.granted.is_some_and(|g| now.duration_since(g) < idle)
                || holders.iter().any(|h| h.group == m.group)
        });
        self.st.groups.sort_by(|a, b| {
            b.granted
                .cmp(&a.granted)
                .then_with(|| a.group.cmp(&b.group))
        });
        self.st.groups.truncate(MAX_GROUP_MARKS);
    }

    pub(super) fn mark(&self, group: &str) -> Option<&GroupMark> {
        self.st.groups.iter().find(|m| m.group == group)
    }

    /// Stale: a newer run of the group was granted (and maybe deployed), or waits
    /// now. Returns who superseded it. Runs with `supersede: none` are a pure
    /// queue: never superseded, never marking.
    pub(super) fn stale(&self, r: &RunView) -> Option<String> {
        if r.supersede == Supersede::None {
            return None;
        }
        let own = |party: Party| r.parent.as_ref().is_some_and(|p| is_parent(party, p));
        let waiting = self
            .st
            .queue
            .iter()
            .chain(self.reserved_waiters())
            .filter(|w| {
                w.group == r.group
                    && w.supersede != Supersede::None
                    && w.age > r.age
                    && !own(w.party())
            })
            .max_by(|a, b| a.age.cmp(&b.age));
        if let Some(w) = waiting {
            return Some(label(&w.pipeline_run, &w.run));
        }
        let m = self
            .mark(&r.group)
            .filter(|m| m.newest > r.age && !own((&m.pipeline_run, &m.pipeline_run_uid)))?;
        Some(
            m.pipeline_run
                .clone()
                .unwrap_or_else(|| m.newest.name.clone()),
        )
    }

    /// Remember the newest run the group was granted: later arrivals older than it
    /// are stale. Recorded at grant, so a run cancelled, timed out or superseded
    /// while waiting leaves no mark; and a run alone in its group (a standalone
    /// run, a PipelineRun without a pipeline label) leaves none, as nothing can
    /// ever be older in it.
    pub(super) fn mark_group(&mut self, w: &Waiter, granted: Timestamp) {
        if w.supersede == Supersede::None || w.group == w.age.name {
            return;
        }
        let mark = GroupMark {
            group: w.group.clone(),
            newest: w.age.clone(),
            pipeline_run: w.pipeline_run.clone(),
            pipeline_run_uid: w.pipeline_run_uid.clone(),
            granted: Some(granted),
        };
        match self.st.groups.iter_mut().find(|m| m.group == w.group) {
            Some(m) if m.newest > w.age => {}
            // The same run (rebuilt): keep the later grant time.
            Some(m) if m.newest == w.age => m.granted = m.granted.max(Some(granted)),
            Some(m) => *m = mark,
            None => self.st.groups.push(mark),
        }
    }

    pub(super) fn supersede_older_waiters(&mut self, newer: &Waiter) {
        let by = label(&newer.pipeline_run, &newer.run);
        let (older, keep): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.st.queue)
            .into_iter()
            .partition(|w| {
                w.group == newer.group
                    && w.age < newer.age
                    && w.supersede != Supersede::None
                    && !same_party(w.party(), newer.party())
            });
        self.st.queue = keep;
        for w in older {
            if let Some(victim) = self.runs.get(w.run.uid.as_str()) {
                self.cancels.extend(cancel_beside_outcome(victim, &by));
            }
            self.outcomes.push((
                w.run,
                Outcome::Superseded {
                    by: by.clone(),
                    group: w.group,
                },
            ));
        }
    }
}
