//! The working state of one decision ([`Decider`]) and its core steps: rebuild
//! the lock state from the runs, release, admit and grant. Each rule beyond the
//! queue adds its steps in its own module: `supersede`, `queue_control`, `multi_key`.

use super::cancel::cancel_beside_outcome;
use crate::model::{
    Cancel, ControlCancel, Decision, MultiKeys, MutexFacts, Outcome, Parent, ParentState, Phase,
    Revoke, RunView, Timeout,
};
use crate::observe::pending;
use jiff::Timestamp;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use tekton_mutex_api::mutex::{
    Age, Holder, LockSpec, MutexStatus, Order, RunRef, Supersede, Waiter,
};

/// Whether a run should be out of the queue, and what to tell it if so.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Leaving {
    Stay,
    /// Leaves with nothing to report: its condition is already final.
    Leave,
    LeaveWith(Outcome),
}

/// No holder's grant was refused (the default of a decision).
static NONE_UNDELIVERED: BTreeMap<String, String> = BTreeMap::new();

pub(super) struct Decider<'a> {
    pub(super) spec: &'a LockSpec,
    pub(super) facts: MutexFacts,
    pub(super) st: MutexStatus,
    pub(super) outcomes: Vec<(RunRef, Outcome)>,
    pub(super) cancels: Vec<Cancel>,
    pub(super) control_cancels: Vec<ControlCancel>,
    pub(super) now: Timestamp,
    pub(super) all: &'a [RunView],
    pub(super) runs: HashMap<&'a str, &'a RunView>,
    pub(super) multi: &'a MultiKeys,
    pub(super) revokes: Vec<Revoke>,
    /// Waiters to let go as the victims of a deadlock across keys, with the cycle.
    pub(super) deadlocked: &'a BTreeMap<String, String>,
    /// Holders whose grant could not be delivered, by uid, with why (`Input::undelivered`).
    pub(super) undelivered: &'a BTreeMap<String, String>,
    /// How large the status is as written: measured once a newcomer would wait, then grown by
    /// each newcomer (an upper bound: leavers are not taken off).
    pub(super) status_bytes: std::cell::Cell<Option<usize>>,
    /// A scheduled window's closing message (`Input::closed_by_window`).
    pub(super) closed_by_window: Option<&'a str>,
}

impl<'a> Decider<'a> {
    pub(super) fn new(
        spec: &'a LockSpec,
        prev: &MutexStatus,
        all: &'a [RunView],
        now: Timestamp,
        facts: MutexFacts,
        multi: &'a MultiKeys,
        deadlocked: &'a BTreeMap<String, String>,
    ) -> Self {
        Decider {
            multi,
            deadlocked,
            revokes: Vec::new(),
            status_bytes: Default::default(),
            undelivered: &NONE_UNDELIVERED,
            closed_by_window: None,
            spec,
            facts,
            st: prev.clone(),
            outcomes: Vec::new(),
            cancels: Vec::new(),
            control_cancels: Vec::new(),
            now,
            all,
            runs: all.iter().map(|r| (r.run.uid.as_str(), r)).collect(),
        }
    }

    /// State is rebuilt, never reset: whatever happened to the status (wiped,
    /// replaced, restored from an old copy), a run told `Acquired` whose hold is
    /// not released holds again, with its token; `lastToken` is never below a
    /// token any run of the key shows; and the groups those runs were granted in
    /// keep their marks.
    ///
    /// A PipelineRun queued as a whole shows its grant in an annotation its author can write
    /// or copy: that claim marks its group (no more than its author could do with `sequence`),
    /// but it holds and raises `lastToken` only as the lock's own status vouches for it.
    pub(super) fn rebuild_from_runs(&mut self) {
        let believed: Vec<Option<i64>> = self.all.iter().map(|r| self.believed(r)).collect();
        let highest = believed.iter().flatten().max();
        self.st.last_token = self.st.last_token.max(highest.copied().unwrap_or(0));
        self.st.last_token = self.st.last_token.max(self.facts.token_floor);
        self.keep_forgotten_marks_while_shown();
        for (r, believed) in self.all.iter().zip(believed) {
            if r.acquired_token.is_none() {
                continue;
            }
            let entry = waiter_of(r);
            if !self.forgotten(&entry) {
                self.mark_group(&entry, r.waiting_since);
            }
            let Some(token) = believed else {
                continue;
            };
            let known = self.st.holders.iter().any(|h| {
                h.run.uid == r.run.uid || r.parent.as_ref().is_some_and(|p| is_parent(h.party(), p))
            });
            if known || !still_holds(r) || self.dismissed(r) {
                continue;
            }
            self.st.queue.retain(|w| w.run.uid != r.run.uid);
            self.st
                .holders
                .push(holder_of(entry, token, r.waiting_since, 0));
        }
        self.st.holders.sort_by_key(|h| h.token);
    }

    /// The grant a run shows, if the lock believes it: a lock run's status is written by
    /// the controller alone; a queued PipelineRun's record only as the status lists it.
    fn believed(&self, r: &RunView) -> Option<i64> {
        let queued = r.run.kind == tekton_mutex_api::mutex::RunKind::PipelineRun;
        #[cfg(feature = "guard-switches")]
        let queued = queued && !super::guard_switches::records_trusted();
        match queued {
            true => pending::vouched_token(r.acquired_token, &r.run.uid, &self.st),
            false => r.acquired_token,
        }
    }

    /// A holder keeps the slot until nothing of its PipelineRun can still run
    /// (done or deleted, and every pod ended), even if its lock run was deleted.
    /// A standalone run holds until it is deleted. The hold is the PipelineRun's:
    /// a sibling lock run told `Acquired` with the same token (re-entry) keeps it
    /// too, each by its own rule (one may have a `release-after` section that is
    /// over while the other's is not), so the last of them releases it.
    pub(super) fn release_ended_holders(&mut self) {
        let all = self.all;
        #[cfg(feature = "guard-switches")]
        if super::guard_switches::one_hold_off() {
            let own = |h: &Holder, r: &RunView| r.run.uid == h.run.uid && still_holds(r);
            self.st.holders.retain(|h| all.iter().any(|r| own(h, r)));
            return;
        }
        self.st
            .holders
            .retain(|h| all.iter().any(|r| shares_hold(h, r) && still_holds(r)));
    }

    /// Holders whose grant the API server refused to deliver for good (issue 49 item 2): the
    /// slot is taken back for the next waiter, the token is not handed out again, and the run
    /// is told why (a queued PipelineRun is cancelled, never started). It does not come back
    /// as a newcomer while the refusal stands.
    pub(super) fn revoke_undelivered(&mut self) {
        if self.undelivered.is_empty() {
            return;
        }
        let undelivered = self.undelivered;
        let (revoked, kept): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut self.st.holders)
            .into_iter()
            .partition(|h| undelivered.contains_key(&h.run.uid));
        self.st.holders = kept;
        for h in revoked {
            let why = format!(
                "its grant (token {}) could not be delivered, so the slot went to the next run: {}",
                h.token, undelivered[&h.run.uid]
            );
            self.outcomes.push((h.run, Outcome::Cancelled { why }));
        }
        self.retell_revoked();
    }

    /// A run whose grant was taken back and that still runs was not told so (that write was
    /// refused too): it is told again at each decision, until the tell lands and it ends.
    fn retell_revoked(&mut self) {
        let told: HashSet<&str> = self.outcomes.iter().map(|(r, _)| r.uid.as_str()).collect();
        let untold: Vec<&RunView> = self
            .all
            .iter()
            .filter(|r| self.undelivered.contains_key(&r.run.uid))
            .filter(|r| matches!(r.phase, Phase::Live { .. }) && !told.contains(r.run.uid.as_str()))
            .collect();
        for r in untold {
            let why = format!(
                "its grant could not be delivered, so the slot went to the next run: {}",
                self.undelivered[&r.run.uid]
            );
            self.outcomes
                .push((r.run.clone(), Outcome::Cancelled { why }));
        }
    }

    /// Waiters leave when deleted, done, cancelled, timed out, superseded, or
    /// when their PipelineRun ended or is stopping.
    pub(super) fn drop_leavers(&mut self) {
        for w in std::mem::take(&mut self.st.queue) {
            let Some(&r) = self.runs.get(w.run.uid.as_str()) else {
                continue;
            };
            match self.leaving(r) {
                Leaving::Stay => self.st.queue.push(w),
                leaving => self.depart(r, leaving),
            }
        }
    }

    /// Newcomers, oldest first, so that one batch decides as if they came one by one.
    pub(super) fn admit_arrivals(&mut self) {
        let known: HashSet<&str> = self
            .st
            .holders
            .iter()
            .map(|h| h.run.uid.as_str())
            .chain(self.st.queue.iter().map(|w| w.run.uid.as_str()))
            .chain(self.reserved_uids())
            // A waiter that just left (drop_leavers) was told already: no second word.
            .chain(self.outcomes.iter().map(|(run, _)| run.uid.as_str()))
            .collect();
        let mut arrivals: Vec<&'a RunView> = self
            .all
            .iter()
            .filter(|r| {
                matches!(r.phase, Phase::Live { .. })
                    && !known.contains(r.run.uid.as_str())
                    && !self.dismissed(r)
                    && !self.undelivered.contains_key(&r.run.uid)
            })
            .collect();
        arrivals.sort_by(|a, b| a.age.cmp(&b.age).then_with(|| a.run.name.cmp(&b.run.name)));
        for r in arrivals {
            if self.reenter(r) {
                continue;
            }
            match self.leaving(r) {
                // A lock being deleted releases nothing and admits no one: it goes once
                // empty, and a new Mutex takes the newcomers; no new ClusterMutex does.
                Leaving::Stay if self.facts.deleting => {
                    let outcome = match self.facts.comes_back_when_deleted() {
                        true => Outcome::MutexDeleting,
                        false => Outcome::LockDeleted,
                    };
                    self.outcomes.push((r.run.clone(), outcome));
                }
                Leaving::Stay if r.wait => match self.queue_full(r) {
                    Some(full) => self.outcomes.push((r.run.clone(), full)),
                    None => {
                        self.arrive(r);
                        self.grant();
                    }
                },
                Leaving::Stay => self.try_without_waiting(r),
                leaving => self.depart(r, leaving),
            }
        }
        self.grant();
    }

    /// Every live member is told where it stands; the summary fields follow the lists.
    pub(super) fn report(mut self) -> Decision {
        let holder_names = self.holder_names();
        let told: HashSet<String> = self.outcomes.iter().map(|(r, _)| r.uid.clone()).collect();
        let reserved = self.st.reservations.len();
        let of = reserved + self.st.queue.len();
        let kept = self.st.reservations.iter().map(|r| &r.waiter);
        for (i, w) in kept.chain(&self.st.queue).enumerate() {
            if i < reserved && told.contains(&w.run.uid) {
                continue; // a reserved run leaving: its slot stays until it shows so
            }
            let retry = self.runs.get(w.run.uid.as_str()).is_some_and(|r| {
                matches!(
                    r.phase,
                    Phase::Live {
                        timeout: Timeout::Retry,
                        ..
                    }
                )
            });
            let next = i == 0;
            let waiting = Outcome::Waiting {
                next,
                holders: if next {
                    holder_names.clone()
                } else {
                    Vec::new()
                },
                retry,
            };
            self.outcomes.push((w.run.clone(), waiting));
        }
        for h in &self.st.holders {
            let live = self
                .runs
                .get(h.run.uid.as_str())
                .is_some_and(|r| matches!(r.phase, Phase::Live { .. }));
            if live {
                let acquired = Outcome::Acquired {
                    token: h.token,
                    waited_seconds: h.waited_seconds,
                };
                self.outcomes.push((h.run.clone(), acquired));
            }
        }
        self.st.holding = holder_names.join(",");
        self.st.waiting = of as i64;
        let mut seen = HashSet::new();
        self.cancels.retain(|c| seen.insert(c.pipeline_run.clone()));
        Decision {
            status: self.st,
            outcomes: self.outcomes,
            cancels: self.cancels,
            control_cancels: self.control_cancels,
            revokes: self.revokes,
        }
    }

    /// Should this run be out of the queue, and with what outcome?
    pub(super) fn leaving(&self, r: &RunView) -> Leaving {
        let Phase::Live {
            cancel_requested,
            timeout,
        } = r.phase
        else {
            return Leaving::Leave;
        };
        if self.started_without_grant(r) {
            return Leaving::LeaveWith(Outcome::StartedWithoutGrant);
        }
        // Superseded wins over the cancel that superseding itself causes: the
        // PipelineRun is cancelled first, and Tekton then cancels the run too.
        if let Some(by) = self.stale(r) {
            let group = r.group.clone();
            return Leaving::LeaveWith(Outcome::Superseded { by, group });
        }
        if let Some(cycle) = self.deadlocked.get(&r.run.uid) {
            let cycle = cycle.clone();
            return Leaving::LeaveWith(Outcome::Deadlock { cycle });
        }
        let cancelled = |why: String| Leaving::LeaveWith(Outcome::Cancelled { why });
        if cancel_requested {
            return cancelled(match &r.cancel_message {
                Some(m) => format!("the run was cancelled while waiting: {m}"),
                None => "the run was cancelled while waiting".into(),
            });
        }
        if timeout == Timeout::Final {
            return Leaving::LeaveWith(Outcome::TimedOut);
        }
        match &r.parent {
            Some(p) if p.state.ended() => {
                cancelled(format!("PipelineRun {} ended while waiting", p.name))
            }
            // Never grant a slot to a PipelineRun that is being stopped.
            Some(p) if p.state == ParentState::StopRequested => {
                cancelled(format!("PipelineRun {} is being stopped", p.name))
            }
            _ => Leaving::Stay,
        }
    }

    /// A queued PipelineRun that runs though the lock never granted it: someone cleared its
    /// `spec.status` (issue 46 item 1). One the status lists as a holder was granted (its
    /// start may just have come before the grant's own patch). A record claiming a grant
    /// the status does not list is left as it was (a status wiped by hand forgets a hold).
    fn started_without_grant(&self, r: &RunView) -> bool {
        r.started
            && r.acquired_token.is_none()
            && !self.st.holders.iter().any(|h| h.run.uid == r.run.uid)
    }

    /// Record why a run left (or never joined) the queue; a superseded run's
    /// PipelineRun is cancelled.
    pub(super) fn depart(&mut self, r: &RunView, leaving: Leaving) {
        let Leaving::LeaveWith(outcome) = leaving else {
            return;
        };
        if let Outcome::Superseded { by, .. } = &outcome {
            self.cancels.extend(cancel_beside_outcome(r, by));
        }
        self.outcomes.push((r.run.clone(), outcome));
    }

    /// The refusal for an arrival that would wait, if the queue is full
    /// (`spec.maxQueue`) or already holds its namespace's share of a ClusterMutex's
    /// waiters (names in its status are `namespace/name`).
    fn queue_full(&self, r: &RunView) -> Option<Outcome> {
        if self.st.queue.len() >= self.spec.max_queue as usize {
            return Some(Outcome::QueueFull {
                limit: self.spec.max_queue,
                namespace: None,
            });
        }
        if self.status_full_with(r) {
            return Some(Outcome::StatusFull {
                bytes: super::STATUS_BYTES,
            });
        }
        let share = self.facts.namespace_share?;
        let own = namespace_of(&r.run.name)?;
        let waiting = self
            .st
            .queue
            .iter()
            .chain(self.reserved_waiters())
            .filter(|w| namespace_of(&w.run.name) == Some(own))
            .count();
        (waiting >= share as usize).then(|| Outcome::QueueFull {
            limit: share,
            namespace: Some(own.to_string()),
        })
    }

    /// Would waiting make the status larger than the API server and etcd accept? Measured only
    /// for a newcomer that would wait (a free slot grants it, and the status stays as large).
    fn status_full_with(&self, r: &RunView) -> bool {
        let would_wait = self.holds_back()
            || !self.st.queue.is_empty()
            || self.st.holders.len() >= slots(self.spec.capacity);
        if !would_wait {
            return false;
        }
        let bytes = match self.status_bytes.get() {
            Some(bytes) => bytes,
            None => {
                let bytes = entry_bytes(&self.st);
                self.status_bytes.set(Some(bytes));
                bytes
            }
        };
        bytes + entry_bytes(&waiter_of(r)) > super::STATUS_BYTES
    }

    /// A second Mutex task of a PipelineRun that already holds this key (a
    /// matrix, or two lock tasks) passes at once with the same token: waiting
    /// for itself would only end at its timeout.
    pub(super) fn reenter(&mut self, r: &RunView) -> bool {
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
            .find(|h| is_parent(h.party(), parent))
        else {
            return false;
        };
        let outcome = Outcome::Acquired {
            token: h.token,
            waited_seconds: self.waited(r),
        };
        self.outcomes.push((r.run.clone(), outcome));
        true
    }

    /// A waiter whose PipelineRun holds the key by now passes at once with the hold's
    /// token, as an arrival would: a reserved sibling of several keys committed and
    /// its slot became the hold, or the hold was rebuilt from the runs. Waiting for
    /// its own PipelineRun would only end at its timeout.
    pub(super) fn reenter_queued_siblings(&mut self) {
        for w in std::mem::take(&mut self.st.queue) {
            match self.runs.get(w.run.uid.as_str()).copied() {
                Some(r) if self.reenter(r) => {}
                _ => self.st.queue.push(w),
            }
        }
    }

    /// Queue a live arrival. A run that supersedes marks its group and supersedes
    /// older waiters of it.
    pub(super) fn arrive(&mut self, r: &RunView) {
        let newcomer = waiter_of(r);
        if let Some(bytes) = self.status_bytes.get() {
            self.status_bytes.set(Some(bytes + entry_bytes(&newcomer)));
        }
        if r.supersede != Supersede::None {
            self.supersede_older_waiters(&newcomer);
        }
        self.st.queue.push(newcomer);
    }

    /// `wait: "false"`: join only if that gets the slot now, in the order the queue
    /// would grant it (a slot freed in this same sync goes to whoever is first);
    /// otherwise leave no trace and answer `NotAcquired`.
    pub(super) fn try_without_waiting(&mut self, r: &RunView) {
        let (st, outcomes, cancels) = (self.st.clone(), self.outcomes.len(), self.cancels.len());
        self.arrive(r);
        self.grant();
        if self.st.queue.iter().any(|w| w.run.uid == r.run.uid) {
            self.st = st;
            self.outcomes.truncate(outcomes);
            self.cancels.truncate(cancels);
            self.grant();
            let holders = self.holder_names();
            self.outcomes
                .push((r.run.clone(), Outcome::NotAcquired { holders }));
        }
    }

    /// Does the lock grant nothing new now: frozen, or a scheduled window closed?
    fn holds_back(&self) -> bool {
        self.spec.frozen || self.closed_by_window.is_some()
    }

    /// Hand free slots to the head of the queue.
    pub(super) fn grant(&mut self) {
        self.sort_queue();
        if self.holds_back() {
            return;
        }
        if self.has_multikey() {
            return self.grant_with_reservations();
        }
        self.grant_up_to(slots(self.spec.capacity));
    }

    /// Grant the head of the queue until `capacity` runs hold the key.
    pub(super) fn grant_up_to(&mut self, capacity: usize) {
        while self.st.holders.len() < capacity && !self.st.queue.is_empty() {
            // Tokens never wrap or repeat: at MAX_TOKEN the key grants no more.
            let Some(token) =
                tekton_mutex_api::mutex::next_token(self.st.last_token, self.facts.clock_floor)
            else {
                break;
            };
            let w = self.st.queue.remove(0);
            self.st.last_token = token;
            let waited = self
                .runs
                .get(w.run.uid.as_str())
                .map_or(0, |r| self.waited(r));
            // Other lock runs of the same PipelineRun share the grant.
            if w.pipeline_run.is_some() {
                let (same, rest): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.st.queue)
                    .into_iter()
                    .partition(|o| same_party(o.party(), w.party()));
                self.st.queue = rest;
                for o in same {
                    let outcome = Outcome::Acquired {
                        token: self.st.last_token,
                        waited_seconds: waited,
                    };
                    self.outcomes.push((o.run, outcome));
                }
            }
            self.mark_group(&w, self.now);
            let holder = holder_of(w, self.st.last_token, self.now, waited);
            self.st.holders.push(holder);
        }
    }

    /// Priority first, then age in the Mutex's order; a ClusterMutex's namespaces take turns.
    pub(super) fn sort_queue(&mut self) {
        let order = self.spec.order;
        self.st.queue.sort_by(|a, b| queue_order(order, a, b));
        if self.facts.namespace_share.is_some() {
            let queue = std::mem::take(&mut self.st.queue);
            let by_priority = self.facts.priority_across_namespaces;
            self.st.queue = super::fair_share::across_namespaces(order, by_priority, queue);
        }
        self.promoted_first();
    }

    /// Seconds since the run started waiting.
    pub(super) fn waited(&self, r: &RunView) -> i64 {
        self.now.duration_since(r.waiting_since).as_secs().max(0)
    }

    pub(super) fn holder_names(&self) -> Vec<String> {
        self.st
            .holders
            .iter()
            .map(|h| label(&h.pipeline_run, &h.run))
            .collect()
    }
}

/// Priority first, then age in the Mutex's order.
pub(super) fn queue_order(order: Order, a: &Waiter, b: &Waiter) -> std::cmp::Ordering {
    let by_age = match order {
        Order::OldestFirst => a.age.cmp(&b.age),
        Order::NewestFirst => b.age.cmp(&a.age),
    };
    Reverse(a.priority).cmp(&Reverse(b.priority)).then(by_age)
}

/// The slots of a key. A test build with the `chaos-broken-capacity` feature gives one too many
/// when TEKTON_MUTEX_BROKEN=capacity: the bug the chaos campaign's checker must catch
/// (`hack/chaos.sh --broken`). Release builds have no such switch.
pub(super) fn slots(capacity: u32) -> usize {
    #[cfg(feature = "chaos-broken-capacity")]
    if broken_capacity() {
        return capacity as usize + 1;
    }
    capacity as usize
}

#[cfg(feature = "chaos-broken-capacity")]
pub(super) fn broken_capacity() -> bool {
    static BROKEN: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
        std::env::var("TEKTON_MUTEX_BROKEN").is_ok_and(|v| v == "capacity")
    });
    *BROKEN
}

/// Does this run's hold (if it has one) still stand? Until nothing of its
/// PipelineRun can run; a standalone run's until the run is deleted.
pub(super) fn still_holds(r: &RunView) -> bool {
    match &r.parent {
        Some(p) => !p.state.released(),
        None => r.phase != Phase::Deleted,
    }
}

/// The namespace of a run as a ClusterMutex's status names it (`namespace/name`).
/// The bytes an entry takes in the status as written (JSON), with its separator.
fn entry_bytes(entry: &impl serde::Serialize) -> usize {
    serde_json::to_vec(entry).map_or(0, |v| v.len() + 1)
}

fn namespace_of(name: &str) -> Option<&str> {
    tekton_mutex_api::cluster_mutex::unqualify(name).map(|(ns, _)| ns)
}

/// Is `r` the holder's run, or a lock run of the same PipelineRun told
/// `Acquired` with the holder's token?
fn shares_hold(h: &Holder, r: &RunView) -> bool {
    if r.run.uid == h.run.uid {
        return true;
    }
    let sibling = r.parent.as_ref().is_some_and(|p| is_parent(h.party(), p));
    sibling && r.acquired_token == Some(h.token)
}

pub(super) fn waiter_of(r: &RunView) -> Waiter {
    Waiter {
        run: r.run.clone(),
        pipeline_run: r.parent.as_ref().map(|p| p.name.clone()),
        pipeline_run_uid: r.parent.as_ref().map(|p| p.uid.clone()),
        group: r.group.clone(),
        age: r.age.clone(),
        priority: r.priority,
        supersede: r.supersede,
        waiting_since: Some(r.waiting_since),
    }
}

pub(super) fn holder_of(w: Waiter, token: i64, since: Timestamp, waited_seconds: i64) -> Holder {
    Holder {
        run: w.run,
        pipeline_run: w.pipeline_run,
        pipeline_run_uid: w.pipeline_run_uid,
        token,
        since,
        waited_seconds,
        group: w.group,
        age: w.age,
        supersede: w.supersede,
    }
}

/// Lock runs of one PipelineRun are one party: they share its age, with the
/// highest `sequence` any of them gives, so the PipelineRun never supersedes itself.
pub(super) fn siblings_share_age(runs: &[RunView]) -> Vec<RunView> {
    let mut ages: HashMap<&str, &Age> = HashMap::new();
    // An unlisted run is no sibling: a forged run must not make its victim newer.
    for r in runs.iter().filter(|r| r.phase != Phase::Unlisted) {
        if let Some(p) = &r.parent {
            let age = ages.entry(p.uid.as_str()).or_insert(&r.age);
            if r.age > **age {
                *age = &r.age;
            }
        }
    }
    runs.iter()
        .map(|r| {
            let mut r = r.clone();
            if let Some(age) = r.parent.as_ref().and_then(|p| ages.get(p.uid.as_str())) {
                r.age = (*age).clone();
            }
            r
        })
        .collect()
}

pub(super) use tekton_mutex_api::mutex::Party;

/// Two entries of one PipelineRun: by uid, or by name where an entry has no uid.
pub(super) fn same_party((name_a, uid_a): Party, (name_b, uid_b): Party) -> bool {
    match (uid_a, uid_b) {
        (Some(a), Some(b)) => a == b,
        _ => name_a.is_some() && name_a == name_b,
    }
}

/// Does this entry stand for the run's own PipelineRun `p`?
pub(super) fn is_parent((name, uid): Party, p: &Parent) -> bool {
    match uid {
        Some(uid) => *uid == p.uid,
        None => name.as_deref() == Some(p.name.as_str()),
    }
}

pub(super) fn label(pipeline_run: &Option<String>, run: &RunRef) -> String {
    pipeline_run.clone().unwrap_or_else(|| run.name.clone())
}
