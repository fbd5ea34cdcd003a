//! Several keys: table tests, and a simulation of the whole protocol (each key's
//! sync, the commit on the run, revokes) under stale caches, checked for no
//! partial or double grant and for every waiter being granted.

use super::*;
use crate::decide::test_entry::*;
use crate::decide::tests::{any_superseded, expect, t};
use crate::model::*;
use proptest::prelude::*;
#[allow(unused_imports)]
use std::collections::{BTreeMap, HashMap, HashSet};
use tekton_mutex_api::mutex::*;

const KEYS: [&str; 3] = ["a", "b", "c"];

/// What a run's own status says, one version of it.
#[derive(Clone, Debug, PartialEq)]
struct RunState {
    epoch: i64,
    /// Told `Acquired`: its token on each of its keys.
    acquired: Option<BTreeMap<String, i64>>,
    /// Told superseded: its status is final.
    ended: bool,
    gone: bool,
}

#[derive(Clone, Debug)]
struct SimRun {
    keys: Vec<String>,
    priority: i64,
    /// In group `deploy` with `supersede: pending`; else a plain queue run.
    supersede: bool,
    created: i64,
    /// Every version of the run's status; the last is the API server's.
    versions: Vec<RunState>,
    /// The version the controller's cache shows; None: not in it yet.
    cached: Option<usize>,
    cancelled: bool,
}

impl SimRun {
    fn latest(&self) -> &RunState {
        self.versions.last().unwrap()
    }

    /// As the cache shows it (the first version if not in it yet: callers check).
    fn seen(&self) -> &RunState {
        &self.versions[self.cached.unwrap_or(0)]
    }

    /// A write conditional on the cached version being the latest.
    fn write(&mut self, f: impl FnOnce(&mut RunState)) -> bool {
        if self.cached != Some(self.versions.len() - 1) || self.latest().gone {
            return false;
        }
        let mut next = self.latest().clone();
        f(&mut next);
        self.versions.push(next);
        true
    }

    fn uid(i: usize) -> String {
        format!("uid-{i}")
    }
}

struct World {
    spec: BTreeMap<String, LockSpec>,
    ledgers: BTreeMap<String, MutexStatus>,
    /// The ledgers as a commit reads them (a cache that may lag).
    ledger_cache: BTreeMap<String, MutexStatus>,
    runs: Vec<SimRun>,
    clock: i64,
    /// Every run ever told `Acquired`.
    granted: Vec<bool>,
}

impl World {
    fn new(capacities: [u32; 3]) -> Self {
        let mut spec = BTreeMap::new();
        let mut ledgers = BTreeMap::new();
        for (k, c) in KEYS.iter().zip(capacities) {
            let s = LockSpec {
                capacity: c,
                ..LockSpec::default()
            };
            spec.insert(k.to_string(), s);
            ledgers.insert(k.to_string(), MutexStatus::default());
        }
        World {
            spec,
            ledger_cache: ledgers.clone(),
            ledgers,
            runs: Vec::new(),
            clock: 0,
            granted: Vec::new(),
        }
    }

    fn arrive(&mut self, mask: u8, priority: i64) {
        self.arrive_in(mask, priority, false)
    }

    fn arrive_in(&mut self, mask: u8, priority: i64, supersede: bool) {
        let keys: Vec<String> = KEYS
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, k)| k.to_string())
            .collect();
        self.clock += 1;
        self.runs.push(SimRun {
            keys,
            priority,
            supersede,
            created: self.clock,
            versions: vec![RunState {
                epoch: 0,
                acquired: None,
                ended: false,
                gone: false,
            }],
            cached: None,
            cancelled: false,
        });
        self.granted.push(false);
    }

    fn view(&self, i: usize, key: &str) -> RunView {
        let r = &self.runs[i];
        let name = format!("run{i}");
        RunView {
            run: RunRef {
                kind: RunKind::CustomRun,
                name: name.clone(),
                uid: SimRun::uid(i),
            },
            parent: None,
            group: if r.supersede {
                "deploy".into()
            } else {
                name.clone()
            },
            age: Age {
                sequence: None,
                created: t(r.created),
                name,
            },
            priority: r.priority,
            supersede: if r.supersede {
                Supersede::Pending
            } else {
                Supersede::None
            },
            cancel_mode: CancelMode::default(),
            wait: true,
            waiting_since: t(r.created),
            cancel_message: None,
            phase: match (&r.seen().acquired, r.seen().ended) {
                (Some(_), _) => Phase::Done { superseded: false },
                (None, true) => Phase::Done { superseded: true },
                (None, false) => Phase::Live {
                    cancel_requested: false,
                    timeout: Timeout::NotYet,
                },
            },
            acquired_token: r.seen().acquired.as_ref().and_then(|t| t.get(key).copied()),
            started: false,
        }
    }

    /// One key's sync: its runs as the cache shows them, its ledger fresh.
    fn sync(&mut self, key: &str) -> Decision {
        let mut views = Vec::new();
        let mut multi = MultiKeys {
            key: key.into(),
            runs: HashMap::new(),
        };
        for (i, r) in self.runs.iter().enumerate() {
            if !r.keys.iter().any(|k| k == key) || r.cached.is_none() || r.seen().gone {
                continue;
            }
            views.push(self.view(i, key));
            if r.keys.len() > 1 {
                let m = MultiKeyRun {
                    keys: r.keys.clone(),
                    epoch: r.seen().epoch,
                    acquired: r.seen().acquired.clone(),
                };
                multi.runs.insert(SimRun::uid(i), m);
            }
        }
        self.clock += 1;
        let now = t(self.clock);
        let prev = &self.ledgers[key];
        let facts = MutexFacts::default();
        let d = decide_multikey(&self.spec[key], prev, &views, now, facts, &multi);
        self.ledgers.insert(key.into(), d.status.clone());
        for (run, o) in &d.outcomes {
            let i = index(&run.uid);
            match o {
                Outcome::Acquired { token, .. } if self.runs[i].keys.len() == 1 => {
                    let tokens = BTreeMap::from([(key.to_string(), *token)]);
                    self.runs[i].write(|s| s.acquired = Some(tokens));
                }
                Outcome::Superseded { .. } => {
                    self.runs[i].write(|s| s.ended = true);
                }
                _ => {}
            }
        }
        for r in &d.revokes {
            let run = &mut self.runs[index(&r.run.uid)];
            let current = run.seen().epoch == r.epoch && run.seen().acquired.is_none();
            if current {
                run.write(|s| s.epoch += 1);
            }
        }
        d
    }

    /// The commit: the run as cached, the ledgers as cached, a conditional write.
    fn commit(&mut self, i: usize) {
        let r = &self.runs[i];
        if r.keys.len() < 2 || r.cached.is_none() || r.seen().gone {
            return;
        }
        let m = MultiKeyRun {
            keys: r.keys.clone(),
            epoch: r.seen().epoch,
            acquired: r.seen().acquired.clone(),
        };
        if let Some(tokens) = commit(&SimRun::uid(i), &m, None, &self.ledger_cache) {
            self.runs[i].write(|s| s.acquired = Some(tokens));
        }
    }

    fn refresh(&mut self, i: usize) {
        let r = &mut self.runs[i];
        r.cached = Some(r.versions.len() - 1);
    }

    fn refresh_ledger(&mut self, key: &str) {
        self.ledger_cache
            .insert(key.into(), self.ledgers[key].clone());
    }

    /// A holder finishes, or a waiter is cancelled: its run is deleted.
    fn delete(&mut self, i: usize) {
        let r = &mut self.runs[i];
        if r.latest().gone {
            return;
        }
        r.cancelled = r.latest().acquired.is_none();
        let mut next = r.latest().clone();
        next.gone = true;
        r.versions.push(next);
    }

    fn holds(&self, i: usize) -> bool {
        let s = self.runs[i].latest();
        !s.gone && s.acquired.is_some()
    }

    /// No partial grant, nothing granted twice.
    fn check(&mut self) -> Result<(), TestCaseError> {
        for (i, r) in self.runs.iter().enumerate() {
            let s = r.latest();
            if let Some(tokens) = &s.acquired {
                self.granted[i] = true;
                let keys: Vec<&String> = tokens.keys().collect();
                let mut want: Vec<&String> = r.keys.iter().collect();
                want.sort();
                prop_assert_eq!(keys, want, "run {} was told a partial grant", i);
            }
        }
        for key in KEYS {
            let ledger = &self.ledgers[key];
            let taken = ledger.holders.len() + ledger.reservations.len();
            prop_assert!(
                taken <= self.spec[key].capacity as usize,
                "key {key} over capacity"
            );
            for (i, r) in self.runs.iter().enumerate() {
                let s = r.latest();
                let Some(token) = s.acquired.as_ref().and_then(|t| t.get(key)) else {
                    continue;
                };
                if s.gone {
                    continue;
                }
                let uid = SimRun::uid(i);
                let accounted = ledger
                    .holders
                    .iter()
                    .any(|h| h.run.uid == uid && h.token == *token)
                    || ledger
                        .reservations
                        .iter()
                        .any(|res| res.waiter.run.uid == uid && res.epoch == s.epoch);
                prop_assert!(
                    accounted,
                    "run {i} holds {key} (token {token}) but the ledger gave its slot away: {ledger:?}"
                );
            }
        }
        Ok(())
    }

    fn live(&self) -> Vec<usize> {
        (0..self.runs.len())
            .filter(|i| !self.runs[*i].latest().gone && !self.runs[*i].latest().ended)
            .collect()
    }

    /// Everything fresh, every key synced, every commit tried, holders finish.
    fn round(&mut self) -> Result<(), TestCaseError> {
        for i in 0..self.runs.len() {
            self.refresh(i);
        }
        for key in KEYS {
            self.sync(key);
            self.refresh_ledger(key);
            self.check()?;
        }
        for i in 0..self.runs.len() {
            self.refresh(i);
            self.commit(i);
            self.check()?;
        }
        for i in 0..self.runs.len() {
            if self.holds(i) || self.runs[i].latest().ended {
                self.delete(i);
            }
        }
        Ok(())
    }
}

fn index(uid: &str) -> usize {
    uid.trim_start_matches("uid-").parse().unwrap()
}

#[derive(Clone, Debug)]
enum Op {
    Arrive {
        mask: u8,
        priority: i64,
        supersede: bool,
    },
    Sync(usize),
    Commit(u8),
    Refresh(u8),
    RefreshLedger(usize),
    Finish(u8),
    Cancel(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..8u8, 0..3i64, proptest::bool::weighted(0.3))
            .prop_map(|(mask, priority, supersede)| Op::Arrive { mask, priority, supersede }),
        4 => (0..3usize).prop_map(Op::Sync),
        3 => any::<u8>().prop_map(Op::Commit),
        3 => any::<u8>().prop_map(Op::Refresh),
        2 => (0..3usize).prop_map(Op::RefreshLedger),
        2 => any::<u8>().prop_map(Op::Finish),
        1 => any::<u8>().prop_map(Op::Cancel),
    ]
}

impl World {
    fn pick(&self, i: u8, f: impl Fn(usize) -> bool) -> Option<usize> {
        let c: Vec<usize> = self.live().into_iter().filter(|i| f(*i)).collect();
        (!c.is_empty()).then(|| c[i as usize % c.len()])
    }

    fn run_op(&mut self, op: &Op) {
        match *op {
            Op::Arrive {
                mask,
                priority,
                supersede,
            } => self.arrive_in(mask, priority, supersede),
            Op::Sync(k) => {
                self.sync(KEYS[k]);
            }
            Op::Commit(i) => {
                if let Some(i) = self.pick(i, |i| self.runs[i].keys.len() > 1) {
                    self.commit(i)
                }
            }
            Op::Refresh(i) => {
                if !self.runs.is_empty() {
                    self.refresh(i as usize % self.runs.len())
                }
            }
            Op::RefreshLedger(k) => self.refresh_ledger(KEYS[k]),
            Op::Finish(i) => {
                if let Some(i) = self.pick(i, |i| self.holds(i)) {
                    self.delete(i)
                }
            }
            Op::Cancel(i) => {
                if let Some(i) = self.pick(i, |i| !self.holds(i)) {
                    self.delete(i)
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random arrivals of one-, two- and three-key runs (some superseding older
    /// ones of their group), syncs and commits in any order over caches that lag,
    /// holders finishing and waiters cancelled at random: no run is ever
    /// told a partial grant, no key's slot is given away while a run holds it;
    /// and once arrivals stop and holders keep finishing, every waiter is granted.
    #[test]
    fn no_partial_grant_no_deadlock_no_starvation(
        ops in proptest::collection::vec(op(), 1..80),
        capacities in proptest::array::uniform3(1..3u32),
        newest_first in proptest::array::uniform3(proptest::bool::weighted(0.3)),
    ) {
        let mut w = World::new(capacities);
        // Keys may order their queues differently (issue 23 item 4).
        for (k, newest) in KEYS.iter().zip(newest_first) {
            if newest {
                w.spec.get_mut(*k).unwrap().order = Order::NewestFirst;
            }
        }
        for op in &ops {
            w.run_op(op);
            w.check()?;
        }
        // Holders keep finishing: each round lets the first waiter in the common
        // order through on all its keys, so rounds are bounded by the runs.
        let bound = 4 * w.runs.len() + 4;
        for _ in 0..bound {
            if w.runs.iter().all(|r| r.latest().gone) {
                break;
            }
            w.round()?;
        }
        prop_assert!(w.live().is_empty() && w.runs.iter().all(|r| r.latest().gone), "deadlock or starvation: still waiting {:?} after {} rounds; ledgers {:?}",
            w.live(), bound, w.ledgers);
        for (i, r) in w.runs.iter().enumerate() {
            prop_assert!(r.cancelled || w.granted[i], "run {} ended without a grant", i);
        }
    }
}

/// A world of runs taking `keys` (one string each, e.g. "ab"), arrived in order.
fn world(runs: &[&str]) -> World {
    let mut w = World::new([1, 1, 1]);
    for r in runs {
        let mask = r
            .chars()
            .map(|c| 1u8 << KEYS.iter().position(|k| k.starts_with(c)).unwrap())
            .sum();
        w.arrive(mask, 0);
    }
    w
}

#[test]
fn opposite_orders_do_not_deadlock() {
    // Run 0 takes a,b and run 1 takes b,a; key b is synced first, before the
    // cache even shows run 0 there: b reserves for run 1, a for run 0.
    let mut w = world(&["ab", "ab"]);
    w.refresh(1);
    w.sync("b");
    w.refresh(0);
    w.sync("a");
    assert_eq!(w.ledgers["b"].reservations[0].waiter.run.uid, "uid-1");
    assert_eq!(w.ledgers["a"].reservations[0].waiter.run.uid, "uid-0");
    // b now sees run 0, which goes first: it asks run 1 to give its slot back.
    let d = w.sync("b");
    assert_eq!(d.revokes.len(), 1);
    assert_eq!(w.runs[1].latest().epoch, 1);
    w.refresh(1);
    w.sync("b");
    assert_eq!(w.ledgers["b"].reservations[0].waiter.run.uid, "uid-0");
    for k in KEYS {
        w.refresh_ledger(k);
    }
    w.commit(1);
    assert!(!w.holds(1), "run 1 keeps no slot on b: it cannot commit");
    w.commit(0);
    assert!(w.holds(0));
    assert_eq!(
        w.runs[0].latest().acquired,
        Some(BTreeMap::from([("a".into(), 1), ("b".into(), 2)]))
    );
}

#[test]
fn a_slot_is_given_back_only_through_the_run() {
    // b keeps a slot for run 1 but the revoke write fails (the cache lags): the
    // slot stays, so a commit of run 1 from that same stale read is still safe.
    let mut w = world(&["ab", "ab"]);
    w.refresh(1);
    w.sync("a");
    w.sync("b");
    w.refresh(0);
    let same = w.runs[1].latest().clone();
    w.runs[1].versions.push(same); // someone else wrote run 1
    let d = w.sync("a");
    assert_eq!(d.revokes.len(), 1, "run 0 goes first");
    assert_eq!(w.runs[1].latest().epoch, 0, "the conditional write failed");
    assert_eq!(w.ledgers["a"].reservations.len(), 1, "the slot stays kept");
    assert_eq!(w.ledgers["a"].reservations[0].waiter.run.uid, "uid-1");
}

#[test]
fn a_single_key_waiter_behind_a_reserved_run_waits_and_one_before_it_goes_first() {
    let mut w = world(&["ab", "a"]);
    w.clock += 10;
    w.arrive(1 << 1, 0); // run 2 holds b
    for i in 0..3 {
        w.refresh(i);
    }
    w.sync("b");
    w.refresh(2);
    w.sync("a");
    assert_eq!(
        w.ledgers["a"].reservations.len(),
        1,
        "a keeps a slot for run 0"
    );
    assert!(
        w.ledgers["a"].holders.is_empty(),
        "run 1 does not overtake run 0"
    );
    // A higher-priority run on a goes first: run 0 gives its slot back.
    w.arrive(1, 5);
    w.refresh(3);
    w.sync("a");
    w.refresh(0);
    let d = w.sync("a");
    assert!(d.revokes.is_empty());
    assert_eq!(w.ledgers["a"].holders[0].run.uid, "uid-3");
    assert_eq!(
        w.ledgers["a"].queue.len(),
        2,
        "run 0 waits again, before run 1"
    );
    assert_eq!(w.ledgers["a"].queue[0].run.uid, "uid-0");
}

#[test]
fn a_granted_run_becomes_a_holder_with_its_reserved_token() {
    let mut w = world(&["abc"]);
    w.refresh(0);
    for k in KEYS {
        w.sync(k);
        w.refresh_ledger(k);
    }
    w.commit(0);
    w.refresh(0);
    for k in KEYS {
        w.sync(k);
    }
    for k in KEYS {
        let l = &w.ledgers[k];
        assert!(l.reservations.is_empty());
        assert_eq!(l.holders.len(), 1);
        assert_eq!(
            l.holders[0].token,
            w.runs[0].latest().acquired.as_ref().unwrap()[k]
        );
    }
    // It finishes: every key is free again.
    w.delete(0);
    w.refresh(0);
    for k in KEYS {
        assert!(w.sync(k).status.holders.is_empty());
    }
}

#[test]
fn settle_follows_the_run() {
    let m = |epoch, acquired: bool| MultiKeyRun {
        keys: vec!["a".into(), "b".into()],
        epoch,
        acquired: acquired.then(|| BTreeMap::from([("a".into(), 1), ("b".into(), 1)])),
    };
    assert_eq!(settle(0, None, true), Settle::Void);
    assert_eq!(settle(0, Some(&m(1, false)), true), Settle::Void);
    assert_eq!(settle(0, Some(&m(0, false)), false), Settle::Void);
    assert_eq!(settle(0, Some(&m(0, false)), true), Settle::Kept);
    assert_eq!(settle(0, Some(&m(0, true)), false), Settle::Convert);
    assert_eq!(settle(0, Some(&m(1, true)), false), Settle::Void);
}

/// Key `a`'s view of runs of several keys: pr<i> takes a and b, in `epoch`.
fn pr_of_keys_ab(i: usize, epoch: i64) -> MultiKeys {
    MultiKeys {
        key: "a".into(),
        runs: HashMap::from([(
            SimRun::uid(i),
            MultiKeyRun {
                keys: vec!["a".into(), "b".into()],
                epoch,
                acquired: None,
            },
        )]),
    }
}

/// A run of PipelineRun `pr<i>` in group `deploy` with `supersede: pending`.
fn pending(i: usize, acquired: Option<i64>) -> RunView {
    let name = format!("pr{i}");
    RunView {
        run: RunRef {
            kind: RunKind::CustomRun,
            name: format!("{name}-lock"),
            uid: SimRun::uid(i),
        },
        parent: Some(crate::model::Parent {
            name: name.clone(),
            uid: format!("{name}-uid"),
            state: crate::model::ParentState::Running,
        }),
        group: "deploy".into(),
        age: Age {
            sequence: None,
            created: t(i as i64),
            name,
        },
        priority: 0,
        supersede: Supersede::Pending,
        cancel_mode: CancelMode::default(),
        wait: true,
        waiting_since: t(i as i64),
        cancel_message: None,
        phase: match acquired {
            Some(_) => Phase::Done { superseded: false },
            None => Phase::Live {
                cancel_requested: false,
                timeout: Timeout::NotYet,
            },
        },
        acquired_token: acquired,
        started: false,
    }
}

#[test]
fn a_reserved_run_superseded_on_one_key_is_cancelled_and_gives_its_slot_back() {
    let spec = LockSpec::default();
    let facts = MutexFacts::default();
    let two_keys = |epoch| pr_of_keys_ab(1, epoch);
    // pr1 takes a,b: a keeps a slot for it.
    let d = decide_multikey(
        &spec,
        &MutexStatus::default(),
        &[pending(1, None)],
        t(10),
        facts,
        &two_keys(0),
    );
    assert_eq!(d.status.reservations.len(), 1);
    // pr2, newer in its group, arrives on a: pr1 is superseded and its PipelineRun
    // cancelled, but its slot stays kept until its status says so.
    let runs = [pending(1, None), pending(2, None)];
    let d = decide_multikey(&spec, &d.status, &runs, t(11), facts, &two_keys(0));
    expect(&d, &[(1, any_superseded())]);
    assert_eq!(d.cancels.len(), 1);
    assert_eq!(d.cancels[0].pipeline_run, "pr1");
    assert_eq!(
        d.status.reservations.len(),
        1,
        "kept until pr1's status is final"
    );
    assert!(d.status.holders.is_empty());
    // pr1's status now says superseded: the slot goes, and pr2 is granted.
    let mut ended = pending(1, None);
    ended.phase = Phase::Done { superseded: true };
    let runs = [ended, pending(2, None)];
    let d = decide_multikey(&spec, &d.status, &runs, t(12), facts, &two_keys(0));
    assert!(d.status.reservations.is_empty());
    assert_eq!(d.status.holders[0].run.uid, SimRun::uid(2));
}

#[test]
fn one_key_alone_decides_as_before() {
    // No run of several keys: the same decision with or without the hook.
    let spec = LockSpec::default();
    let runs = [pending(1, None), pending(2, None), pending(3, None)];
    let plain = crate::decide::test_entry::decide(&spec, &MutexStatus::default(), &runs, t(5));
    let hooked = decide_multikey(
        &spec,
        &MutexStatus::default(),
        &runs,
        t(5),
        MutexFacts::default(),
        &MultiKeys::default(),
    );
    assert_eq!(plain, hooked);
}

/// Issue 23 item 4: keys `a` (oldest first) and `b` (newest first) with two runs
/// of both. Were each key to rank by its own order, `a` would keep a slot for the
/// older run and `b` for the newer, and neither could ever commit. While a key
/// deals with runs of several keys it ranks by the one global order instead.
#[test]
fn a_key_ordered_newest_first_does_not_deadlock_runs_of_several_keys() {
    let mut w = world(&["ab", "ab"]);
    w.spec.get_mut("b").unwrap().order = Order::NewestFirst;
    w.refresh(0);
    w.refresh(1);
    w.sync("a");
    w.sync("b");
    assert_eq!(w.ledgers["a"].reservations[0].waiter.run.uid, "uid-0");
    assert_eq!(w.ledgers["b"].reservations[0].waiter.run.uid, "uid-0");
    for k in KEYS {
        w.refresh_ledger(k);
    }
    w.commit(0);
    assert!(w.holds(0), "the older run takes both keys");
}

/// Issue 23 item 5: `a` keeps a slot for pr1 (keys a,b) as a reservation when
/// pr1's lock run is deleted. pr1 may have been told `Acquired` by `b`'s commit
/// and be deploying: the slot becomes pr1's PipelineRun's hold, and pr2 waits
/// until nothing of pr1 can run.
#[test]
fn a_reserved_run_whose_lock_run_is_deleted_keeps_the_slot_for_its_pipelinerun() {
    let spec = LockSpec::default();
    let facts = MutexFacts::default();
    let keys = pr_of_keys_ab(1, 0);
    let d = decide_multikey(
        &spec,
        &MutexStatus::default(),
        &[pending(1, None)],
        t(10),
        facts,
        &keys,
    );
    assert_eq!(d.status.reservations.len(), 1);
    // The lock run is gone: the engine stands its PipelineRun in for it.
    let mut ghost = pending(1, None);
    ghost.phase = Phase::Deleted;
    let runs = [ghost.clone(), pending(2, None)];
    let no_multi = MultiKeys::default();
    let d = decide_multikey(&spec, &d.status, &runs, t(11), facts, &no_multi);
    assert!(d.status.reservations.is_empty());
    let held: Vec<_> = d
        .status
        .holders
        .iter()
        .map(|h| (h.pipeline_run.clone(), h.token))
        .collect();
    assert_eq!(
        held,
        [(Some("pr1".to_string()), 1)],
        "pr1's PipelineRun holds with its token"
    );
    assert_eq!(d.status.queue.len(), 1, "pr2 waits");
    // pr1's PipelineRun is over and no pod of it runs: pr2 is granted.
    ghost.parent.as_mut().unwrap().state = crate::model::ParentState::Done;
    let d = decide_multikey(
        &spec,
        &d.status,
        &[ghost, pending(2, None)],
        t(12),
        facts,
        &no_multi,
    );
    assert_eq!(d.status.holders[0].run.uid, SimRun::uid(2));
}

/// A lock run of several keys counts a hold of its own PipelineRun as its slot
/// on that key: a lock run Tekton re-created after a delete (or a second lock
/// task) commits with the hold's token, and does not wait for itself.
#[test]
fn the_commit_counts_a_hold_of_the_runs_pipelinerun_as_its_slot() {
    let run = MultiKeyRun {
        keys: vec!["a".into(), "b".into()],
        epoch: 0,
        acquired: None,
    };
    let entry = |uid: &str| Waiter {
        run: RunRef {
            kind: RunKind::CustomRun,
            name: "pr1-lock".into(),
            uid: uid.into(),
        },
        pipeline_run: Some("pr1".into()),
        pipeline_run_uid: Some("pr1-uid".into()),
        group: "deploy".into(),
        age: pending(1, None).age,
        priority: 0,
        supersede: Supersede::Pending,
        waiting_since: None,
    };
    let deleted = entry("deleted");
    let mut a = MutexStatus::default();
    a.holders.push(Holder {
        run: deleted.run.clone(),
        pipeline_run: deleted.pipeline_run.clone(),
        pipeline_run_uid: deleted.pipeline_run_uid.clone(),
        token: 3,
        since: t(1),
        waited_seconds: 0,
        group: deleted.group.clone(),
        age: deleted.age.clone(),
        supersede: deleted.supersede,
    });
    let mut b = MutexStatus::default();
    b.reservations.push(Reservation {
        waiter: entry("again"),
        epoch: 0,
        token: 7,
    });
    let ledgers = BTreeMap::from([("a".to_string(), a), ("b".to_string(), b)]);
    let tokens = commit("again", &run, Some("pr1-uid"), &ledgers);
    assert_eq!(
        tokens,
        Some(BTreeMap::from([("a".into(), 3), ("b".into(), 7)]))
    );
    assert_eq!(
        commit("again", &run, Some("other-uid"), &ledgers),
        None,
        "another PipelineRun's hold is no slot"
    );
}

/// A PipelineRun with a lock task of keys a,b and one of key a alone: the first is
/// reserved on a, the second queues behind it. Once the first commits and a turns
/// the slot into the PipelineRun's hold, the second passes at once with the hold's
/// token; before, it waited for its own PipelineRun, which waited for it.
#[test]
fn a_lock_run_queued_behind_its_own_pipelineruns_reserved_sibling_passes_once_that_commits() {
    let spec = LockSpec::default();
    let facts = MutexFacts::default();
    let reserved = pending(1, None);
    let single = RunView {
        run: RunRef {
            kind: RunKind::CustomRun,
            name: "pr1-lock-a".into(),
            uid: "uid-1-a".into(),
        },
        ..pending(1, None)
    };
    let keys = pr_of_keys_ab(1, 0);
    let runs = [reserved.clone(), single.clone()];
    let d = decide_multikey(&spec, &MutexStatus::default(), &runs, t(10), facts, &keys);
    assert_eq!(d.status.reservations[0].waiter.run.uid, SimRun::uid(1));
    assert_eq!(
        d.status.queue[0].run.uid, "uid-1-a",
        "queued behind its sibling"
    );
    // The commit told pr1's run of a,b Acquired with a's reserved token 1.
    let mut committed = keys.clone();
    let tokens = BTreeMap::from([("a".into(), 1), ("b".into(), 1)]);
    committed.runs.get_mut(&SimRun::uid(1)).unwrap().acquired = Some(tokens);
    let runs = [pending(1, Some(1)), single];
    let d = decide_multikey(&spec, &d.status, &runs, t(11), facts, &committed);
    assert_eq!(d.status.holders.len(), 1, "one hold, pr1's");
    assert!(
        d.status.queue.is_empty(),
        "no run waits for its own PipelineRun"
    );
    expect_uid_acquired(&d, "uid-1-a", 1);
}

fn expect_uid_acquired(d: &Decision, uid: &str, want: i64) {
    let told = d
        .outcomes
        .iter()
        .find(|(r, _)| r.uid == uid)
        .map(|(_, o)| o);
    assert!(
        matches!(told, Some(Outcome::Acquired { token, .. }) if *token == want),
        "{uid} told {told:?}"
    );
}
