//! The plans: which faults to inject, chosen from a scenario's fault-free run.
//! Runs are cheap (tens of milliseconds), so the watch plans are exhaustive.
//!
//! - **Crash** after the 1st, 2nd, ... n-th write of the fault-free run: every
//!   write of every scenario is crashed once (and a run under a crash plan must
//!   repeat the fault-free run's writes up to the crash: the harness is
//!   deterministic). Each such run's recovery is crashed again after one of its
//!   own writes, chosen by the seed: a recovery makes writes of its own.
//! - **Stale**: every watch event of the fault-free run, served stale once,
//!   without and with a restart.
//! - **Unobserved**: every watch event of the fault-free run that a later event
//!   of the same object follows, never shown. Among them the states the issue
//!   names: a run created then deleted, a PipelineRun running then done.

use super::run::{Plan, Record};
use super::store::{Kind, ObjKey};
use super::watch::{Delivery, WatchPlan};

/// A small deterministic generator (splitmix64): the seed picks which write of
/// each recovery is crashed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Crash after each write of the fault-free run.
pub fn crashes(base: &Record) -> Vec<Plan> {
    (1..=base.writes.len())
        .map(|n| Plan {
            crashes: vec![n],
            ..Plan::NONE
        })
        .collect()
}

/// After a crash plan ran: crash its recovery too, after one of the writes it
/// made (which one is the seed's), so that the writes only a recovery makes
/// are crashed as well. None if the recovery wrote nothing.
pub fn recrash(plan: &Plan, r: &Record, rng: &mut Rng) -> Option<Plan> {
    let recovery = plan.crashes.len();
    let sent = r
        .writes
        .iter()
        .filter(|w| w.incarnation == recovery && w.sent())
        .count();
    if sent == 0 {
        return None;
    }
    let k = 1 + (rng.next() % sent as u64) as usize;
    let mut crashes = plan.crashes.clone();
    crashes.push(k);
    Some(Plan {
        crashes,
        ..Plan::NONE
    })
}

/// Where in `r.writes` the plan's last crash came: the write after which its
/// process died.
pub fn crash_point(plan: &Plan, r: &Record) -> Option<usize> {
    let (last, k) = (plan.crashes.len().checked_sub(1)?, *plan.crashes.last()?);
    r.writes
        .iter()
        .enumerate()
        .filter(|(_, w)| w.incarnation == last && w.sent())
        .nth(k - 1)
        .map(|(i, _)| i)
}

/// Every watch event of the fault-free run served stale once, without and with a restart.
pub fn stale(base: &Record) -> Vec<Plan> {
    let mut plans = Vec::new();
    for d in &base.deliveries {
        for restart in [false, true] {
            plans.push(watch(WatchPlan::Stale {
                kind: d.kind,
                nth: d.nth,
                restart,
            }));
        }
    }
    plans
}

/// Every watch event of the fault-free run that a later event of its object follows, never shown.
pub fn unobserved(base: &Record) -> Vec<Plan> {
    let later = |d: &Delivery| base.log[d.at + 1..].iter().any(|c| c.key == d.key);
    base.deliveries
        .iter()
        .filter(|d| later(d))
        .map(|d| {
            watch(WatchPlan::Unobserved {
                kind: d.kind,
                nth: d.nth,
            })
        })
        .collect()
}

fn watch(plan: WatchPlan) -> Plan {
    Plan {
        watch: plan,
        ..Plan::NONE
    }
}

/// The unobserved states the issue names.
pub const NAMED: [&str; 2] = [
    "a run created then deleted",
    "a PipelineRun running then done",
];

/// The unobserved plans of the named states, where the scenario has them.
pub fn named(base: &Record) -> Vec<(&'static str, Plan)> {
    let plan = |d: &Delivery| {
        watch(WatchPlan::Unobserved {
            kind: d.kind,
            nth: d.nth,
        })
    };
    let mut out: Vec<(&'static str, Plan)> = Vec::new();
    for d in &base.deliveries {
        if created_then_deleted(base, d) {
            out.push((NAMED[0], plan(d)));
        }
        if running_then_done(base, d) {
            out.push((NAMED[1], plan(d)));
        }
    }
    out
}

/// A lock run's creation, where the run is deleted later.
fn created_then_deleted(base: &Record, d: &Delivery) -> bool {
    let first = !base.log[..d.at].iter().any(|c| c.key == d.key);
    let deleted = base.log[d.at..].iter().any(|c| c.key == d.key && c.deleted);
    d.kind == Kind::CustomRun && first && deleted
}

/// A running version of a PipelineRun, where its next change makes it done.
fn running_then_done(base: &Record, d: &Delivery) -> bool {
    let next = next_of(base, &d.key, d.at);
    d.kind == Kind::PipelineRun
        && !super::world::done(&base.log[d.at].object)
        && next.is_some_and(|n| !n.deleted && super::world::done(&n.object))
}

fn next_of<'a>(base: &'a Record, key: &ObjKey, at: usize) -> Option<&'a super::store::Change> {
    base.log[at + 1..].iter().find(|c| &c.key == key)
}
