//! Several keys at once (`keys: a,b`): all or nothing, without deadlock.
//!
//! Each key keeps its own ledger (its Mutex status). A run of several keys is
//! never granted key by key. Instead:
//!
//! 1. **Reserve.** When the run is within the key's free slots in the key's
//!    queue order, the key keeps a slot for it: a [`Reservation`] with a token
//!    and the run's current *epoch*. A reservation is an idle hold: it takes a
//!    slot, so the key grants nobody behind the run, but the run is not told
//!    anything.
//! 2. **Commit.** Once every key of the run keeps a slot in the run's current
//!    epoch, the run is told `Acquired` with one token per key ([`commit`]).
//!    That write is to the run itself, conditional on the run's
//!    resourceVersion: the run object is the single commit point.
//! 3. **Convert.** A key whose reservation matches the run's `Acquired` epoch
//!    turns it into an ordinary holder with the reserved token.
//! 4. **Revoke.** A reservation that falls out of the key's free slots (a run
//!    that goes first in the key's order arrived: higher priority, older) is
//!    given back, but only through the run: the controller first raises the
//!    run's epoch (conditional on its resourceVersion and on it not being
//!    `Acquired`), and only then may a key drop the now void slot. Likewise a
//!    reserved run that leaves (cancelled, timed out, superseded) keeps its slot
//!    until its final status is written.
//!
//! Why nothing is granted twice: a key drops a slot of epoch `e` only once the
//! run shows an epoch above `e` or a final status, and both are written to the
//! run before the drop. A commit in epoch `e` is a write conditional on the run
//! being unchanged since it was read at epoch `e`; so if it succeeds, no slot of
//! epoch `e` was dropped in between, and every key still keeps the run's slot.
//! A key's sync that finds the run `Acquired` converts the slot; one that finds
//! all slots kept commits; so a crash between two writes leaves nothing stuck.
//!
//! Why no deadlock and no starvation: every key orders its waiters by the same
//! rule (priority, then age oldest first, then uid; a key's `order: newest-first`
//! is set aside while it deals with runs of several keys), and a reservation is kept only while its
//! run is within the key's free slots in that order. Take the first waiting run
//! in that order among all keys: on each of its keys only holders can be ahead of
//! it, so once they finish every key reserves it (slots kept for runs behind it
//! are revoked), and it is granted. Then the next one is first. A holder never
//! waits for anything, so holders keep finishing, and every waiter is granted
//! unless runs that go first keep arriving (as with one key).

use super::decider::{Decider, Leaving, holder_of, queue_order, still_holds};
use crate::model::{MultiKeyRun, Phase, Revoke, Settle};
use std::cmp::Ordering;
use std::collections::{BTreeMap, HashSet};
use tekton_mutex_api::mutex::{Order, Reservation, Waiter};

/// The fate of a slot kept in `epoch` for a run that says `run` (None: gone) and is
/// `live` (its status is not final).
pub fn settle(epoch: i64, run: Option<&MultiKeyRun>, live: bool) -> Settle {
    match run {
        None => Settle::Void,
        Some(m) if m.epoch > epoch => Settle::Void,
        Some(m) if m.acquired.is_some() && m.epoch == epoch => Settle::Convert,
        Some(_) if !live => Settle::Void,
        Some(_) => Settle::Kept,
    }
}

/// The tokens to tell the run `Acquired` with, if every one of its keys keeps a
/// slot for it: a reservation in its current epoch, or a hold of its PipelineRun
/// (`pipeline_run_uid`), which it re-enters as a second lock task would; a lock
/// run that Tekton re-created after a delete does so. `ledgers` are the statuses
/// of its keys, read after the run itself; the write must be conditional on the
/// run being unchanged.
pub fn commit(
    uid: &str,
    run: &MultiKeyRun,
    pipeline_run_uid: Option<&str>,
    ledgers: &BTreeMap<String, tekton_mutex_api::mutex::MutexStatus>,
) -> Option<BTreeMap<String, i64>> {
    if run.acquired.is_some() {
        return None;
    }
    run.keys
        .iter()
        .map(|k| {
            Some((
                k.clone(),
                slot_for(ledgers.get(k)?, uid, run.epoch, pipeline_run_uid)?,
            ))
        })
        .collect()
}

/// The token of the slot a key's ledger keeps for run `uid` in `epoch`, or of its
/// PipelineRun's hold.
pub fn slot_for(
    ledger: &tekton_mutex_api::mutex::MutexStatus,
    uid: &str,
    epoch: i64,
    pipeline_run_uid: Option<&str>,
) -> Option<i64> {
    let reserved = ledger
        .reservations
        .iter()
        .find(|r| r.waiter.run.uid == uid && r.epoch == epoch);
    let held = || {
        let pr = pipeline_run_uid?;
        let h = ledger
            .holders
            .iter()
            .find(|h| h.pipeline_run_uid.as_deref() == Some(pr))?;
        Some(h.token)
    };
    reserved.map(|r| r.token).or_else(held)
}

/// The order every key ranks waiters in: the key's queue order, then uid, so that
/// two runs never tie.
pub fn rank(order: Order, a: &Waiter, b: &Waiter) -> Ordering {
    queue_order(order, a, b).then_with(|| a.run.uid.cmp(&b.run.uid))
}

impl Decider<'_> {
    fn multi_of(&self, uid: &str) -> Option<&MultiKeyRun> {
        self.multi.of(uid)
    }

    /// Is this run's status not final?
    fn live(&self, uid: &str) -> bool {
        self.runs
            .get(uid)
            .is_some_and(|r| matches!(r.phase, Phase::Live { .. } | Phase::Unlisted))
    }

    /// What to do with a kept slot. A run the key's runs do not show is gone (the
    /// reconciler reads a run the status names from the API when its cache lacks
    /// it); one they show but whose keys are unknown is kept: never dropped on a guess.
    /// A run whose lock run was deleted says nothing any more: it may have been
    /// told `Acquired` by another key's commit and be deploying. Its slot becomes
    /// a hold of its PipelineRun, released as any holder whose lock run was
    /// deleted: once nothing of the PipelineRun can still run.
    fn fate(&self, res: &Reservation) -> Settle {
        let uid = res.waiter.run.uid.as_str();
        let Some(&r) = self.runs.get(uid) else {
            return Settle::Void;
        };
        if r.phase == Phase::Deleted {
            return if still_holds(r) {
                Settle::Convert
            } else {
                Settle::Void
            };
        }
        match self.multi_of(uid) {
            Some(m) => settle(res.epoch, Some(m), self.live(uid)),
            None => Settle::Kept,
        }
    }

    /// Slots of runs told `Acquired` in their epoch become holds (before the state
    /// is rebuilt from the runs, which would otherwise adopt them a second time).
    pub(super) fn convert_granted_reservations(&mut self) {
        for res in std::mem::take(&mut self.st.reservations) {
            let uid = res.waiter.run.uid.clone();
            if self.fate(&res) != Settle::Convert {
                self.st.reservations.push(res);
                continue;
            }
            let waited = self.runs.get(uid.as_str()).map_or(0, |r| self.waited(r));
            self.mark_group(&res.waiter, self.now);
            let holder = holder_of(res.waiter, res.token, self.now, waited);
            self.st.holders.push(holder);
        }
        self.st.holders.sort_by_key(|h| h.token);
    }

    /// Void slots go (the run waits again if it still may); a kept slot of a run
    /// that must leave stays until the run's final status is written.
    pub(super) fn settle_reservations(&mut self) {
        for res in std::mem::take(&mut self.st.reservations) {
            let uid = res.waiter.run.uid.clone();
            let fate = self.fate(&res);
            let Some(&r) = self.runs.get(uid.as_str()) else {
                continue; // gone: nothing can commit it any more
            };
            let leaving = self.leaving(r);
            match (fate, leaving) {
                (Settle::Void, Leaving::Stay) => self.st.queue.push(res.waiter),
                (Settle::Void, leaving) => self.depart(r, leaving),
                (_, Leaving::Stay) => self.st.reservations.push(res),
                (_, leaving) => {
                    self.depart(r, leaving);
                    self.st.reservations.push(res);
                }
            }
        }
    }

    /// A run that arrived in this pass may make a run with a kept slot stale: it
    /// is superseded now (its slot stays until its status says so), as a waiter is.
    pub(super) fn supersede_reserved(&mut self) {
        let told: HashSet<&str> = self.outcomes.iter().map(|(r, _)| r.uid.as_str()).collect();
        let stale: Vec<_> = self
            .st
            .reservations
            .iter()
            .filter(|res| !told.contains(res.waiter.run.uid.as_str()))
            .filter_map(|res| self.runs.get(res.waiter.run.uid.as_str()).copied())
            .filter_map(|r| match self.leaving(r) {
                l @ Leaving::LeaveWith(crate::model::Outcome::Superseded { .. }) => Some((r, l)),
                _ => None,
            })
            .collect();
        for (r, leaving) in stale {
            self.depart(r, leaving);
        }
    }

    /// Grant or reserve the free slots, in rank order over the waiting and the
    /// reserved runs; a kept slot beyond the free slots is revoked.
    pub(super) fn grant_with_reservations(&mut self) {
        let room = (self.spec.capacity as usize).saturating_sub(self.st.holders.len());
        // One global order on every key that deals with runs of several keys, whatever
        // the key's own `order`: were two keys to rank two runs differently, each could
        // keep a slot for a different one and neither run could commit.
        let order = Order::OldestFirst;
        let mut ranked: Vec<(&Waiter, bool)> = self
            .st
            .reservations
            .iter()
            .map(|r| (&r.waiter, true))
            .chain(self.st.queue.iter().map(|w| (w, false)))
            .collect();
        ranked.sort_by(|a, b| rank(order, a.0, b.0));
        let revokes: Vec<Revoke> = ranked
            .iter()
            .skip(room)
            .filter(|(_, reserved)| *reserved)
            .filter_map(|(w, _)| self.st.reservations.iter().find(|r| r.waiter == **w))
            .map(|r| Revoke {
                run: r.waiter.run.clone(),
                epoch: r.epoch,
            })
            .collect();
        let mut free = room.saturating_sub(self.st.reservations.len());
        let mut chosen = Vec::new();
        for (w, reserved) in ranked.into_iter().take(room) {
            if reserved {
                continue;
            }
            if free == 0 {
                break;
            }
            chosen.push(w.run.uid.clone());
            free -= 1;
        }
        for r in revokes {
            if !self.revokes.contains(&r) {
                self.revokes.push(r);
            }
        }
        for uid in chosen {
            if !self.take_slot(&uid) {
                break;
            }
        }
    }

    /// Give a free slot to the waiting run `uid`: its hold, or a reservation if it
    /// takes several keys. False once tokens are exhausted.
    fn take_slot(&mut self, uid: &str) -> bool {
        let Some(i) = self.st.queue.iter().position(|w| w.run.uid == uid) else {
            return true; // granted with a sibling already
        };
        let Some(token) =
            tekton_mutex_api::mutex::next_token(self.st.last_token, self.facts.clock_floor)
        else {
            return false;
        };
        let w = self.st.queue.remove(i);
        match self.multi_of(uid).map(|m| m.epoch) {
            Some(epoch) => {
                self.st.last_token = token;
                self.st.reservations.push(Reservation {
                    waiter: w,
                    epoch,
                    token,
                });
            }
            None => {
                self.st.queue.insert(i, w);
                self.grant_head_at(i);
            }
        }
        true
    }

    /// Grant the queue entry at `i`, as [`Decider::grant`] grants the head.
    fn grant_head_at(&mut self, i: usize) {
        let w = self.st.queue.remove(i);
        self.st.queue.insert(0, w);
        let capacity = self.st.holders.len() + 1;
        self.grant_up_to(capacity);
        self.sort_queue();
    }

    /// Runs with a kept slot, ahead of the queue, for the report.
    pub(super) fn reserved_waiters(&self) -> impl Iterator<Item = &Waiter> {
        self.st.reservations.iter().map(|r| &r.waiter)
    }

    /// Does this key deal with runs of several keys now?
    pub(super) fn has_multikey(&self) -> bool {
        !self.st.reservations.is_empty()
            || self
                .st
                .queue
                .iter()
                .any(|w| self.multi_of(&w.run.uid).is_some())
    }

    /// Uids with a kept slot.
    pub(super) fn reserved_uids(&self) -> HashSet<&str> {
        self.st
            .reservations
            .iter()
            .map(|r| r.waiter.run.uid.as_str())
            .collect()
    }
}

#[cfg(test)]
mod tests;
