//! Table tests and property tests of the decision core.
//!
//! A table test is a [`Case`]: the runs, the spec and the status going in, and what
//! the decision must show (holders, queue, cancels, last token, and what each run
//! is told, as [`Told`] cells). Scenarios of more steps use the same cells through
//! [`expect`].

use crate::decide::test_entry::*;
use crate::model::*;
use jiff::Timestamp;
use proptest::prelude::*;
#[allow(unused_imports)]
use std::collections::{BTreeMap, HashMap, HashSet};
use std::mem::discriminant;
use tekton_mutex_api::mutex::*;

pub(super) fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

/// A live run of PipelineRun `pr<i>`, created at second `i`.
pub(super) fn run(i: usize) -> RunView {
    RunView {
        run: RunRef {
            kind: RunKind::CustomRun,
            name: format!("pr{i}-lock"),
            uid: format!("uid-{i}"),
        },
        parent: Some(Parent {
            name: format!("pr{i}"),
            uid: format!("pr{i}-uid"),
            state: ParentState::Running,
        }),
        group: "deploy".into(),
        age: Age {
            sequence: None,
            created: t(i as i64),
            name: format!("pr{i}"),
        },
        priority: 0,
        supersede: Supersede::None,
        cancel_mode: CancelMode::CancelledRunFinally,
        wait: true,
        waiting_since: t(i as i64),
        cancel_message: None,
        phase: Phase::Live {
            cancel_requested: false,
            timeout: Timeout::NotYet,
        },
        acquired_token: None,
        started: false,
    }
}

fn with(mut r: RunView, f: impl FnOnce(&mut RunView)) -> RunView {
    f(&mut r);
    r
}

/// `run(i)` with `supersede: pending`.
fn pending(i: usize) -> RunView {
    with(run(i), |r| r.supersede = Supersede::Pending)
}

/// `run(i)` with `wait: "false"`.
fn nowait(i: usize) -> RunView {
    with(run(i), |r| r.wait = false)
}

/// A live run's phase.
fn live(cancel_requested: bool, timeout: Timeout) -> Phase {
    Phase::Live {
        cancel_requested,
        timeout,
    }
}

/// The PipelineRun of `runs[i]` moves to `state`.
fn set_parent(runs: &mut [RunView], i: usize, state: ParentState) {
    runs[i].parent.as_mut().unwrap().state = state;
}

fn holders(d: &Decision) -> Vec<String> {
    d.status
        .holders
        .iter()
        .map(|h| h.pipeline_run.clone().unwrap())
        .collect()
}

fn queue(d: &Decision) -> Vec<String> {
    d.status
        .queue
        .iter()
        .map(|w| w.pipeline_run.clone().unwrap())
        .collect()
}

fn cancels(d: &Decision) -> Vec<&str> {
    d.cancels.iter().map(|c| c.pipeline_run.as_str()).collect()
}

/// Mark the runs the decision acquired as done, as the applier would.
fn apply(runs: &mut [RunView], d: &Decision) {
    for r in runs.iter_mut() {
        if let Some((_, o)) = d.outcomes.iter().find(|(x, _)| x.uid == r.run.uid) {
            let superseded = match o {
                Outcome::Waiting { .. } | Outcome::MutexDeleting => continue,
                Outcome::Superseded { .. } => true,
                Outcome::Acquired { token, .. } => {
                    r.acquired_token = Some(*token);
                    false
                }
                _ => false,
            };
            r.phase = Phase::Done { superseded };
        }
        if let Some(p) = r
            .parent
            .as_mut()
            .filter(|p| p.state == ParentState::Running)
            && d.cancels.iter().any(|c| c.pipeline_run_uid == p.uid)
        {
            p.state = ParentState::StopRequested;
        }
    }
}

fn finish(runs: &mut [RunView], i: usize) {
    set_parent(runs, i, ParentState::Done);
}

// ---- table cells: what a run is told ----

/// What a case expects one run to be told.
#[derive(Debug)]
pub(super) enum Told {
    /// Exactly this outcome.
    Is(Outcome),
    /// An outcome of this kind, whatever its fields.
    Like(Outcome),
    /// `Acquired` with this token, however long it waited.
    Token(i64),
    /// Nothing: the decision has no outcome for the run.
    Nothing,
}

fn names(holders: &[&str]) -> Vec<String> {
    holders.iter().map(|h| h.to_string()).collect()
}

fn acquired(token: i64, waited_seconds: i64) -> Told {
    Told::Is(Outcome::Acquired {
        token,
        waited_seconds,
    })
}

fn any_acquired() -> Told {
    Told::Like(Outcome::Acquired {
        token: 0,
        waited_seconds: 0,
    })
}

/// Waiting at the head of the queue, told who holds.
fn next_behind(holders: &[&str]) -> Told {
    Told::Is(Outcome::Waiting {
        next: true,
        holders: names(holders),
        retry: false,
    })
}

/// As [`next_behind`], after its timeout asked for a retry.
fn retrying_behind(holders: &[&str]) -> Told {
    Told::Is(Outcome::Waiting {
        next: true,
        holders: names(holders),
        retry: true,
    })
}

/// Waiting further back: told only that it waits.
fn queued() -> Told {
    Told::Is(Outcome::Waiting {
        next: false,
        holders: vec![],
        retry: false,
    })
}

fn any_waiting() -> Told {
    Told::Like(Outcome::Waiting {
        next: false,
        holders: vec![],
        retry: false,
    })
}

fn not_acquired(holders: &[&str]) -> Told {
    Told::Is(Outcome::NotAcquired {
        holders: names(holders),
    })
}

fn any_not_acquired() -> Told {
    Told::Like(Outcome::NotAcquired { holders: vec![] })
}

/// Superseded in group `deploy` by PipelineRun `by`.
fn superseded_by(by: &str) -> Told {
    Told::Is(Outcome::Superseded {
        by: by.into(),
        group: "deploy".into(),
    })
}

pub(super) fn any_superseded() -> Told {
    Told::Like(Outcome::Superseded {
        by: String::new(),
        group: String::new(),
    })
}

fn cancelled(why: &str) -> Told {
    Told::Is(Outcome::Cancelled { why: why.into() })
}

fn any_cancelled() -> Told {
    Told::Like(Outcome::Cancelled { why: String::new() })
}

/// Check that the run of `uid` is told `want` by `d`; `case` names the row in a failure.
#[track_caller]
fn told_is(case: &str, d: &Decision, uid: &str, want: &Told) {
    let got = d
        .outcomes
        .iter()
        .find(|(r, _)| r.uid == uid)
        .map(|(_, o)| o);
    let ok = match want {
        Told::Is(o) => got == Some(o),
        Told::Like(o) => got.is_some_and(|g| discriminant(g) == discriminant(o)),
        Told::Token(t) => matches!(got, Some(Outcome::Acquired { token, .. }) if token == t),
        Told::Nothing => got.is_none(),
    };
    assert!(
        ok,
        "{case}: {uid} told {got:?}, want {want:?}; all told: {:?}",
        d.outcomes
    );
}

/// Check what each `run(i)` of `rows` is told by `d`.
#[track_caller]
pub(super) fn expect(d: &Decision, rows: &[(usize, Told)]) {
    for (i, want) in rows {
        told_is("", d, &format!("uid-{i}"), want);
    }
}

/// Check what the run of `uid` (a sibling, say) is told by `d`.
#[track_caller]
fn expect_uid(d: &Decision, uid: &str, want: Told) {
    told_is("", d, uid, &want);
}

// ---- table rows ----

/// What happens between a case's two decisions: the second's time, and the change.
type Then = Option<(i64, Box<dyn Fn(&mut Vec<RunView>)>)>;

/// After the first decision (applied), `change` happens; the runs are decided again at `later`.
fn then(later: i64, change: impl Fn(&mut Vec<RunView>) + 'static) -> Then {
    Some((later, Box::new(change)))
}

/// A table row. `runs` are decided under `spec` from `status` at `at`. With a
/// `then`, that decision is applied as the applier would, the change happens, and
/// the runs are decided again from the new status. The expectations (each checked
/// when given) are on the last decision.
#[derive(Default)]
struct Case {
    name: String,
    spec: LockSpec,
    status: MutexStatus,
    runs: Vec<RunView>,
    at: i64,
    then: Then,
    holders: Option<&'static [&'static str]>,
    queue: Option<&'static [&'static str]>,
    /// The PipelineRuns to cancel, in order.
    cancels: Option<&'static [&'static str]>,
    last_token: Option<i64>,
    told: Vec<(usize, Told)>,
}

/// A case's decisions, and its runs as the last decision saw them (not applied).
struct Decided {
    first: Decision,
    last: Decision,
    runs: Vec<RunView>,
}

impl Case {
    #[track_caller]
    fn check(self) -> Decided {
        let name = self.name.as_str();
        let mut runs = self.runs;
        let first = decide(&self.spec, &self.status, &runs, t(self.at));
        let last = match &self.then {
            None => first.clone(),
            Some((later, change)) => {
                apply(&mut runs, &first);
                change(&mut runs);
                decide(&self.spec, &first.status, &runs, t(*later))
            }
        };
        if let Some(want) = self.holders {
            assert_eq!(holders(&last), want, "{name}: holders");
        }
        if let Some(want) = self.queue {
            assert_eq!(queue(&last), want, "{name}: queue");
        }
        if let Some(want) = self.cancels {
            assert_eq!(cancels(&last), want, "{name}: cancels");
        }
        if let Some(want) = self.last_token {
            assert_eq!(last.status.last_token, want, "{name}: last token");
        }
        for (i, want) in &self.told {
            told_is(name, &last, &format!("uid-{i}"), want);
        }
        Decided { first, last, runs }
    }
}

#[test]
fn first_run_acquires_token_one_and_others_wait_fifo() {
    let d = Case {
        runs: vec![run(2), run(0), run(1)],
        at: 10,
        holders: Some(&["pr0"]),
        queue: Some(&["pr1", "pr2"]),
        told: vec![
            (0, acquired(1, 10)),
            (1, next_behind(&["pr0"])),
            (2, queued()),
        ],
        ..Case::default()
    }
    .check();
    assert_eq!(d.last.status.holding, "pr0");
    assert_eq!(d.last.status.waiting, 2);
}

#[test]
fn holder_released_when_parent_done_gone_or_run_deleted() {
    type Release = fn(&mut Vec<RunView>);
    let rows: [(&str, Release); 3] = [
        ("done", |runs| finish(runs, 0)),
        ("gone", |runs| set_parent(runs, 0, ParentState::Gone)),
        ("deleted", |runs| {
            runs.remove(0);
        }),
    ];
    for (how, change) in rows {
        Case {
            name: how.into(),
            runs: vec![run(0), run(1)],
            at: 5,
            then: then(6, change),
            holders: Some(&["pr1"]),
            last_token: Some(2),
            ..Case::default()
        }
        .check();
    }
}

#[test]
fn holder_stays_while_parent_runs_finally_even_if_run_cancelled() {
    let d = Case {
        runs: vec![run(0), run(1)],
        at: 5,
        then: then(6, |runs| set_parent(runs, 0, ParentState::StopRequested)),
        holders: Some(&["pr0"]),
        ..Case::default()
    }
    .check();
    assert_eq!(
        d.last.status, d.first.status,
        "nothing changes while the holder winds down"
    );
}

#[test]
fn standalone_run_holds_until_deleted() {
    let spec = LockSpec::default();
    let lone = with(run(0), |r| r.parent = None);
    let mut runs = vec![lone, run(1)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(5));
    apply(&mut runs, &d);
    assert_eq!(d.status.holding, "pr0-lock");
    let d2 = decide(&spec, &d.status, &runs, t(6));
    assert_eq!(d2.status.holders.len(), 1);
    runs.remove(0);
    let d3 = decide(&spec, &d2.status, &runs, t(7));
    assert_eq!(holders(&d3), ["pr1"]);
}

#[test]
fn cancelled_and_timed_out_waiters_leave_the_queue() {
    Case {
        runs: (0..4).map(run).collect(),
        at: 5,
        then: then(6, |runs| {
            runs[1].phase = live(true, Timeout::NotYet);
            runs[2].phase = live(false, Timeout::Final);
            runs[3].phase = live(false, Timeout::Retry);
        }),
        queue: Some(&["pr3"]),
        told: vec![
            (1, any_cancelled()),
            (2, Told::Is(Outcome::TimedOut)),
            (3, retrying_behind(&["pr0"])),
        ],
        ..Case::default()
    }
    .check();
}

#[test]
fn supersede_pending_keeps_holder_and_newest_waiter() {
    // One batch decides as if they arrived one by one: each is superseded by the next.
    let d = Case {
        runs: (0..5).map(pending).collect(),
        at: 5,
        holders: Some(&["pr0"]),
        queue: Some(&["pr4"]),
        cancels: Some(&["pr1", "pr2", "pr3"]),
        told: vec![
            (1, superseded_by("pr2")),
            (2, superseded_by("pr3")),
            (3, superseded_by("pr4")),
        ],
        ..Case::default()
    }
    .check();
    assert!(
        d.last
            .cancels
            .iter()
            .all(|c| c.mode == CancelMode::CancelledRunFinally)
    );
}

#[test]
fn supersede_running_cancels_older_holder_but_waits_for_it() {
    let spec = LockSpec::default();
    let mut runs: Vec<RunView> = (0..2)
        .map(|i| with(run(i), |r| r.supersede = Supersede::Running))
        .collect();
    let d = decide(&spec, &MutexStatus::default(), &runs[..1], t(1));
    apply(&mut runs, &d);
    let d2 = decide(&spec, &d.status, &runs, t(2));
    assert_eq!(holders(&d2), ["pr0"]);
    assert_eq!(cancels(&d2), ["pr0"]);
    apply(&mut runs, &d2);
    let d3 = decide(&spec, &d2.status, &runs, t(3));
    assert!(d3.cancels.is_empty(), "no second cancel while it stops");
    assert_eq!(
        holders(&d3),
        ["pr0"],
        "the slot stays with the stopping holder"
    );
    finish(&mut runs, 0);
    let d4 = decide(&spec, &d3.status, &runs, t(4));
    assert_eq!(holders(&d4), ["pr1"]);
}

/// `pending(i)` with sequence `s`.
fn sequenced(i: usize, s: i64) -> RunView {
    with(pending(i), |r| r.age.sequence = Some(s))
}

#[test]
fn stale_arrival_is_superseded_and_cancelled() {
    // pr0 (seq 80) is granted first; pr1 (seq 79) arrives later but is older.
    let mut d = Case {
        runs: vec![sequenced(0, 80)],
        at: 1,
        then: then(2, |runs| runs.push(sequenced(1, 79))),
        told: vec![(1, superseded_by("pr0"))],
        ..Case::default()
    }
    .check();
    assert_eq!(d.last.cancels[0].pipeline_run, "pr1");
    // Even after pr0 finished: the group remembers it.
    apply(&mut d.runs, &d.last);
    finish(&mut d.runs, 0);
    d.runs.push(sequenced(2, 78));
    let d3 = decide(&LockSpec::default(), &d.last.status, &d.runs, t(3));
    expect(&d3, &[(2, superseded_by("pr0"))]);
}

#[test]
fn restart_between_supersede_writes_redoes_the_cancel() {
    let spec = LockSpec::default();
    let mut runs = vec![with(pending(0), |r| {
        r.phase = Phase::Done { superseded: true }
    })];
    let status = MutexStatus {
        groups: vec![GroupMark {
            group: "deploy".into(),
            newest: Age {
                sequence: None,
                created: t(9),
                name: "pr9".into(),
            },
            pipeline_run: Some("pr9".into()),
            pipeline_run_uid: None,
            granted: None,
        }],
        ..Default::default()
    };
    let d = decide(&spec, &status, &runs, t(10));
    assert_eq!(d.cancels.len(), 1);
    assert_eq!(d.cancels[0].superseded_by, "pr9");
    set_parent(&mut runs, 0, ParentState::StopRequested);
    assert!(decide(&spec, &status, &runs, t(10)).cancels.is_empty());
}

#[test]
fn groups_do_not_supersede_each_other() {
    Case {
        runs: vec![
            pending(0),
            pending(1),
            with(pending(2), |r| r.group = "other".into()),
        ],
        at: 5,
        holders: Some(&["pr0"]),
        queue: Some(&["pr1", "pr2"]),
        cancels: Some(&[]),
        ..Case::default()
    }
    .check();
}

#[test]
fn priority_then_order() {
    let runs = vec![run(0), run(1), run(2), with(run(3), |r| r.priority = 5)];
    Case {
        name: "oldest first".into(),
        runs: runs.clone(),
        at: 5,
        queue: Some(&["pr3", "pr1", "pr2"]),
        ..Case::default()
    }
    .check();
    Case {
        name: "newest first".into(),
        spec: LockSpec {
            order: Order::NewestFirst,
            ..Default::default()
        },
        runs,
        at: 5,
        // The first arrival took the free slot.
        holders: Some(&["pr0"]),
        queue: Some(&["pr3", "pr2", "pr1"]),
        ..Case::default()
    }
    .check();
}

#[test]
fn wait_false_takes_a_free_slot_or_gives_up() {
    Case {
        runs: vec![nowait(0), nowait(1)],
        at: 5,
        queue: Some(&[]),
        told: vec![(0, acquired(1, 5)), (1, not_acquired(&["pr0"]))],
        ..Case::default()
    }
    .check();
}

#[test]
fn capacity_two_grants_two() {
    let d = Case {
        spec: LockSpec {
            capacity: 2,
            ..Default::default()
        },
        runs: vec![run(0), run(1), run(2)],
        at: 5,
        holders: Some(&["pr0", "pr1"]),
        ..Case::default()
    }
    .check();
    assert_eq!(d.last.status.holding, "pr0,pr1");
}

#[test]
fn decision_is_a_fixed_point() {
    let d = Case {
        runs: (0..4).map(run).collect(),
        at: 5,
        then: then(50, |_| {}),
        ..Case::default()
    }
    .check();
    assert_eq!(
        d.last.status, d.first.status,
        "re-deciding later writes nothing new"
    );
}

// ---- property tests: a simulated world driven by random events ----

#[derive(Clone, Debug)]
enum Op {
    Arrive {
        group: u8,
        sequence: Option<i8>,
        priority: i8,
        policy: u8,
        wait: bool,
        /// A PipelineRun queued as a whole (created Pending): its own member.
        queued: bool,
    },
    FinishParent(u8),
    CancelRun(u8),
    DeleteRun(u8),
    TimeOut(u8),
    /// The status is wiped (0), or replaced by an older copy of itself (1+).
    LoseStatus(u8),
    /// A PipelineRun is deleted and another is created under its name (new uids).
    Recreate(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2u8, proptest::option::of(0..20i8), 0..2i8, 0..3u8, proptest::bool::weighted(0.85), proptest::bool::weighted(0.3))
            .prop_map(|(group, sequence, priority, policy, wait, queued)| Op::Arrive { group, sequence, priority, policy, wait, queued }),
        3 => any::<u8>().prop_map(Op::FinishParent),
        1 => any::<u8>().prop_map(Op::CancelRun),
        1 => any::<u8>().prop_map(Op::DeleteRun),
        1 => any::<u8>().prop_map(Op::TimeOut),
        1 => any::<u8>().prop_map(Op::LoseStatus),
        1 => any::<u8>().prop_map(Op::Recreate),
    ]
}

struct World {
    spec: LockSpec,
    status: MutexStatus,
    /// Every run ever made; a deleted one stays with `Phase::Deleted` (its
    /// PipelineRun may still hold the key).
    runs: Vec<RunView>,
    clock: i64,
    /// Grants seen so far: (uid, group, age, supersede policy, token, status losses before).
    grants: Vec<(String, String, Age, Supersede, i64, usize)>,
    superseded: HashSet<String>,
    next_id: usize,
    /// Every status written, for restoring an old copy.
    history: Vec<MutexStatus>,
    /// Every new token must be above this: the highest token granted, lowered
    /// by a lost status only to what the runs that still exist show.
    floor: i64,
    losses: usize,
    /// PipelineRuns whose lock run was deleted while they held, and whose
    /// status entry was then lost: nothing shows their hold any more, so
    /// no invariant can speak for them.
    forgotten: HashSet<String>,
}

impl World {
    fn new(capacity: u32) -> Self {
        World {
            spec: LockSpec {
                capacity,
                ..Default::default()
            },
            status: MutexStatus::default(),
            runs: Vec::new(),
            clock: 0,
            grants: Vec::new(),
            superseded: HashSet::new(),
            next_id: 0,
            history: Vec::new(),
            floor: 0,
            losses: 0,
            forgotten: HashSet::new(),
        }
    }

    /// What the reconciler would show the core: the runs that exist, and a
    /// deleted lock run only while the status names it a holder (its ghost).
    fn views(&self) -> Vec<RunView> {
        self.runs
            .iter()
            .filter(|r| {
                r.phase != Phase::Deleted
                    || self.status.holders.iter().any(|h| h.run.uid == r.run.uid)
            })
            .map(|r| {
                let mut v = r.clone();
                if v.phase == Phase::Deleted {
                    v.acquired_token = None;
                }
                v
            })
            .collect()
    }

    /// Read from the runs, not the status: PipelineRuns that were told
    /// `Acquired` on the key and whose hold is not released. A deleted lock
    /// run counts while the status still knows it (nothing else can).
    fn holding_pipeline_runs(&self) -> HashSet<String> {
        self.runs
            .iter()
            .filter(|r| r.acquired_token.is_some() && still_holds_in_world(r))
            .filter(|r| {
                r.phase != Phase::Deleted
                    || self.status.holders.iter().any(|h| h.run.uid == r.run.uid)
            })
            .map(|r| r.parent.as_ref().unwrap().uid.clone())
            .filter(|uid| !self.forgotten.contains(uid))
            .collect()
    }

    fn step(&mut self) {
        self.clock += 1;
        let d = decide(&self.spec, &self.status, &self.views(), t(self.clock));
        let known = d.status.holders.iter().filter(|h| {
            h.pipeline_run_uid
                .as_ref()
                .is_none_or(|u| !self.forgotten.contains(u))
        });
        assert!(
            known.count() <= self.spec.capacity as usize,
            "over capacity: {:?}",
            d.status.holders
        );
        // One word per run per decision: a waiter that leaves is not told again as a newcomer.
        let mut told = std::collections::HashSet::new();
        for (r, _) in &d.outcomes {
            assert!(
                told.insert(&r.uid),
                "{} told twice: {:?}",
                r.uid,
                d.outcomes
            );
        }
        for (r, o) in &d.outcomes {
            match o {
                Outcome::Acquired { token, .. } if !self.grants.iter().any(|g| g.0 == r.uid) => {
                    assert!(
                        !self.superseded.contains(&r.uid),
                        "granted a superseded run {r:?}"
                    );
                    let v = self.runs.iter().find(|v| v.run.uid == r.uid).unwrap();
                    let sibling = self.grants.iter().any(|g| {
                        g.4 == *token
                            && self.runs.iter().any(|x| {
                                x.run.uid == g.0
                                    && x.parent.as_ref().map(|p| &p.uid)
                                        == v.parent.as_ref().map(|p| &p.uid)
                            })
                    });
                    if !sibling {
                        assert!(
                            *token > self.floor,
                            "token {token} not above {}",
                            self.floor
                        );
                        self.floor = *token;
                    }
                    self.grants.push((
                        r.uid.clone(),
                        v.group.clone(),
                        v.age.clone(),
                        v.supersede,
                        *token,
                        self.losses,
                    ));
                }
                Outcome::Superseded { .. } => {
                    self.superseded.insert(r.uid.clone());
                }
                _ => {}
            }
        }
        apply(&mut self.runs, &d);
        self.status = d.status;
        self.history.push(self.status.clone());
        let holding = self.holding_pipeline_runs();
        assert!(
            holding.len() <= self.spec.capacity as usize,
            "PipelineRuns told Acquired and still running exceed capacity: {holding:?}"
        );
        let holders: HashSet<&str> = self
            .status
            .holders
            .iter()
            .map(|h| h.run.uid.as_str())
            .collect();
        assert_eq!(
            holders.len(),
            self.status.holders.len(),
            "a run holds twice"
        );
    }

    /// Wiped, or an old copy put back (lastToken with it: as if the object were
    /// force-removed and recreated from a backup). Tokens are then guaranteed
    /// only above what the lock runs that still exist show: a queued PipelineRun's
    /// record is an annotation its author can write, believed only as the status
    /// lists it (issue 37), so its hold is forgotten with the status.
    fn lose_status(&mut self, i: u8) {
        self.status = match i as usize % (self.history.len() + 1) {
            0 => MutexStatus::default(),
            k => self.history[k - 1].clone(),
        };
        let queued = |r: &RunView| r.run.kind == RunKind::PipelineRun;
        let shown = self
            .runs
            .iter()
            .filter(|r| r.phase != Phase::Deleted && !queued(r))
            .filter_map(|r| r.acquired_token);
        self.floor = shown.chain([self.status.last_token]).max().unwrap_or(0);
        self.losses += 1;
        let unseen = self.runs.iter().filter(|r| {
            (r.phase == Phase::Deleted || queued(r))
                && r.acquired_token.is_some()
                && still_holds_in_world(r)
        });
        let unseen: Vec<String> = unseen
            .map(|r| r.parent.as_ref().unwrap().uid.clone())
            .collect();
        self.forgotten.extend(unseen);
    }

    /// The PipelineRun and its lock run are deleted; a new one of the same
    /// names (new uids) arrives.
    fn recreate(&mut self, i: u8) {
        let Some(k) = self.pick(i, |r| r.phase != Phase::Deleted) else {
            return;
        };
        let old = self.runs[k].parent.as_ref().unwrap().uid.clone();
        for r in &mut self.runs {
            if let Some(p) = r.parent.as_mut().filter(|p| p.uid == old) {
                p.state = ParentState::Gone;
                r.phase = Phase::Deleted;
            }
        }
        let n = self.next_id;
        self.next_id += 1;
        let mut again = self.runs[k].clone();
        again.parent.as_mut().unwrap().uid = format!("pr{n}-uid");
        again.run.uid = match again.run.kind {
            RunKind::PipelineRun => format!("pr{n}-uid"), // its own PipelineRun
            _ => format!("uid-{n}"),
        };
        again.parent.as_mut().unwrap().state = ParentState::Running;
        again.age.created = t(self.clock);
        again.waiting_since = t(self.clock);
        again.acquired_token = None;
        again.phase = Phase::Live {
            cancel_requested: false,
            timeout: Timeout::NotYet,
        };
        self.runs.push(again);
    }

    fn pick(&self, i: u8, f: impl Fn(&RunView) -> bool) -> Option<usize> {
        let idx: Vec<usize> = (0..self.runs.len()).filter(|&k| f(&self.runs[k])).collect();
        (!idx.is_empty()).then(|| idx[i as usize % idx.len()])
    }

    fn run_op(&mut self, op: &Op) {
        match *op {
            Op::Arrive {
                group,
                sequence,
                priority,
                policy,
                wait,
                queued,
            } => {
                let i = self.next_id;
                self.next_id += 1;
                let policy =
                    [Supersede::None, Supersede::Pending, Supersede::Running][policy as usize];
                let member = if queued {
                    queued_pipeline_run(i)
                } else {
                    run(i)
                };
                self.runs.push(with(member, |r| {
                    r.group = format!("g{group}");
                    r.age.sequence = sequence.map(i64::from);
                    r.priority = i64::from(priority);
                    r.supersede = policy;
                    r.wait = wait;
                    r.age.created = t(self.clock);
                }));
            }
            Op::FinishParent(i) => {
                if let Some(k) = self.pick(i, |r| !r.parent.as_ref().unwrap().state.ended()) {
                    // Parents finish in any order; holders' parents most often.
                    finish(&mut self.runs, k);
                }
            }
            Op::CancelRun(i) => {
                if let Some(k) = self.pick(i, |r| matches!(r.phase, Phase::Live { .. })) {
                    self.runs[k].phase = Phase::Live {
                        cancel_requested: true,
                        timeout: Timeout::NotYet,
                    };
                }
            }
            Op::DeleteRun(i) => {
                if let Some(k) = self.pick(i, |r| r.phase != Phase::Deleted) {
                    self.runs[k].phase = Phase::Deleted;
                }
            }
            Op::LoseStatus(i) => self.lose_status(i),
            Op::Recreate(i) => self.recreate(i),
            Op::TimeOut(i) => {
                if let Some(k) = self.pick(i, |r| matches!(r.phase, Phase::Live { .. })) {
                    self.runs[k].phase = Phase::Live {
                        cancel_requested: false,
                        timeout: Timeout::Final,
                    };
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn invariants_hold_under_any_event_order(ops in proptest::collection::vec(op(), 1..40), capacity in 1..4u32) {
        let mut w = World::new(capacity);
        for op in &ops {
            w.run_op(op);
            w.step();
        }
        // Liveness: finish every holder's parent until nothing waits.
        for _ in 0..200 {
            if w.status.queue.is_empty() { break; }
            let holders: Vec<String> = w.status.holders.iter().map(|h| h.run.uid.clone()).collect();
            for r in w.runs.iter_mut().filter(|r| holders.contains(&r.run.uid)) {
                if r.parent.as_ref().unwrap().state != ParentState::Gone {
                    r.parent.as_mut().unwrap().state = ParentState::Done;
                }
            }
            w.step();
        }
        prop_assert!(w.status.queue.is_empty(), "waiters left behind: {:?}", w.status.queue);
        for r in w.runs.iter().filter(|r| r.phase != Phase::Deleted) {
            let holds = w.status.holders.iter().any(|h| h.run.uid == r.run.uid);
            prop_assert!(holds || matches!(r.phase, Phase::Done { .. }) || r.parent.as_ref().unwrap().state.ended(),
                "run neither holds nor ended with a reason: {r:?}");
        }
        // Within a group where newer runs supersede, grants never go backwards in
        // age, unless a lost status took the mark and the run that could rebuild it.
        let deleted = |uid: &str| w.runs.iter().any(|r| r.run.uid == uid && r.phase == Phase::Deleted);
        for (i, a) in w.grants.iter().enumerate() {
            for b in &w.grants[i + 1..] {
                let forgotten = b.5 > a.5 && deleted(&a.0);
                if a.1 == b.1 && b.3 != Supersede::None && a.3 != Supersede::None && !forgotten {
                    prop_assert!(b.2 > a.2, "group {} granted {:?} after newer {:?}", a.1, b.2, a.2);
                }
            }
        }
    }
}

/// PipelineRun `pr<i>` queued as a whole: a member of kind PipelineRun that is
/// its own parent, cancelled outright if it ends its wait (observe/pending.rs).
fn queued_pipeline_run(i: usize) -> RunView {
    with(run(i), |r| {
        r.run = RunRef {
            kind: RunKind::PipelineRun,
            name: format!("pr{i}"),
            uid: format!("pr{i}-uid"),
        };
        r.cancel_mode = CancelMode::Cancelled;
    })
}

/// The world's own reading of a hold (the core's rule, from the runs alone).
fn still_holds_in_world(r: &RunView) -> bool {
    match &r.parent {
        Some(p) => !matches!(p.state, ParentState::Done | ParentState::Gone),
        None => r.phase != Phase::Deleted,
    }
}

#[test]
fn superseded_wins_over_the_cancel_it_causes() {
    // The controller cancels a superseded run's PipelineRun before marking the run;
    // Tekton then cancels the run itself. It must still end Superseded.
    let mut d = Case {
        runs: vec![pending(0), pending(1)],
        at: 1,
        then: then(2, |runs| runs.push(pending(2))),
        told: vec![(1, superseded_by("pr2"))],
        ..Case::default()
    }
    .check();
    // The mark was lost (status write conflicted); Tekton's cancel arrives first.
    d.runs[1].phase = live(true, Timeout::NotYet);
    d.runs[2].phase = live(false, Timeout::NotYet);
    let d3 = decide(&LockSpec::default(), &d.last.status, &d.runs, t(3));
    expect(&d3, &[(1, superseded_by("pr2"))]);
}

#[test]
fn a_stopping_pipelinerun_is_never_granted() {
    Case {
        runs: vec![run(0), run(1), run(2)],
        at: 1,
        then: then(2, |runs| {
            set_parent(runs, 1, ParentState::StopRequested);
            finish(runs, 0);
        }),
        holders: Some(&["pr2"]),
        told: vec![(1, any_cancelled())],
        ..Case::default()
    }
    .check();
}

/// A second lock run of the same PipelineRun (a matrix, or two lock tasks).
fn sibling(i: usize, n: usize) -> RunView {
    with(run(i), |r| {
        r.run.name = format!("pr{i}-lock-{n}");
        r.run.uid = format!("uid-{i}-{n}");
    })
}

#[test]
fn a_pipelinerun_that_holds_the_key_reenters_at_once() {
    let d = Case {
        runs: vec![run(0), run(1)],
        at: 1,
        then: then(2, |runs| {
            runs.push(with(sibling(0, 2), |r| r.supersede = Supersede::Pending))
        }),
        // One holder entry, capacity unchanged.
        holders: Some(&["pr0"]),
        queue: Some(&["pr1"]),
        ..Case::default()
    }
    .check();
    expect_uid(&d.last, "uid-0-2", Told::Token(1));
}

#[test]
fn lock_runs_of_one_waiting_pipelinerun_are_granted_together() {
    let d = Case {
        runs: vec![run(0), run(1), sibling(1, 2)],
        at: 1,
        then: then(2, |runs| finish(runs, 0)),
        holders: Some(&["pr1"]),
        queue: Some(&[]),
        ..Case::default()
    }
    .check();
    assert_eq!(d.first.status.queue.len(), 2, "both of pr1's runs wait");
    let tokens: Vec<_> = d
        .last
        .outcomes
        .iter()
        .filter_map(|(_, o)| match o {
            Outcome::Acquired { token, .. } => Some(*token),
            _ => None,
        })
        .collect();
    assert_eq!(tokens, [2, 2], "one grant, one token, both runs told");
}

#[test]
fn waited_seconds_count_from_when_the_run_started_waiting() {
    // pr1's PipelineRun was created at 1, but its lock run only started waiting at 40.
    Case {
        runs: vec![run(0), with(run(1), |r| r.waiting_since = t(40))],
        at: 41,
        then: then(100, |runs| finish(runs, 0)),
        told: vec![(1, acquired(2, 60))],
        ..Case::default()
    }
    .check();
}

#[test]
fn a_cancel_carries_tektons_reason_into_the_message() {
    Case {
        runs: vec![run(0), run(1)],
        at: 1,
        then: then(2, |runs| {
            runs[1].phase = live(true, Timeout::NotYet);
            runs[1].cancel_message =
                Some("CustomRun cancelled as the PipelineRun it belongs to has timed out.".into());
        }),
        told: vec![(
            1,
            cancelled(
                "the run was cancelled while waiting: CustomRun cancelled as the PipelineRun it belongs to has timed out.",
            ),
        )],
        ..Case::default()
    }
    .check();
}

#[test]
fn wait_false_is_decided_after_a_release_in_the_same_sync() {
    // The holder pr0's PipelineRun ends as pr2 (wait "false") arrives.
    let release_as_pr2_arrives = |runs: &mut Vec<RunView>| {
        finish(runs, 0);
        runs.push(nowait(2));
    };
    Case {
        name: "behind a waiter".into(),
        runs: vec![run(0), run(1)],
        at: 1,
        then: then(2, release_as_pr2_arrives),
        // The freed slot goes to the waiter; wait "false" never queues.
        holders: Some(&["pr1"]),
        queue: Some(&[]),
        told: vec![(2, not_acquired(&["pr1"]))],
        ..Case::default()
    }
    .check();
    Case {
        name: "alone: a freed slot is its own".into(),
        runs: vec![run(0)],
        at: 1,
        then: then(2, release_as_pr2_arrives),
        told: vec![(2, Told::Token(2))],
        ..Case::default()
    }
    .check();
}

#[test]
fn a_pipelinerun_never_supersedes_itself() {
    let spec = LockSpec::default();
    let running = |r: RunView, seq: Option<i64>| {
        with(r, |r| {
            r.supersede = Supersede::Running;
            r.age.sequence = seq;
        })
    };
    // pr0 (another group) holds; pr1's two lock tasks wait, with different sequences,
    // or one with and one without.
    let holder = with(run(0), |r| r.group = "other".into());
    for (a, b) in [(Some(5), Some(7)), (None, Some(7)), (Some(7), None)] {
        for together in [true, false] {
            let mut runs = vec![holder.clone(), running(run(1), a)];
            let mut d = decide(&spec, &MutexStatus::default(), &runs, t(1));
            runs.push(running(sibling(1, 2), b));
            if together {
                d = decide(&spec, &MutexStatus::default(), &runs, t(2));
            } else {
                apply(&mut runs, &d);
                d = decide(&spec, &d.status, &runs, t(2));
            }
            let case = format!("{a:?}/{b:?} together={together}");
            assert!(d.cancels.is_empty(), "{case}: {:?}", d.cancels);
            assert!(
                !d.outcomes
                    .iter()
                    .any(|(_, o)| matches!(o, Outcome::Superseded { .. })),
                "{case}: {:?}",
                d.outcomes
            );
            assert_eq!(queue(&d), ["pr1", "pr1"], "{case}");
        }
    }
}

#[test]
fn holder_keeps_the_slot_while_a_pod_of_its_ended_pipelinerun_drains() {
    // Cancelled: Tekton marks it done at once, its step is in its grace period.
    let mut d = Case {
        runs: vec![run(0), run(1)],
        at: 5,
        then: then(6, |runs| set_parent(runs, 0, ParentState::Draining)),
        holders: Some(&["pr0"]),
        queue: Some(&["pr1"]),
        ..Case::default()
    }
    .check();
    finish(&mut d.runs, 0);
    let d3 = decide(&LockSpec::default(), &d.last.status, &d.runs, t(7));
    assert_eq!(holders(&d3), ["pr1"]);
    assert_eq!(d3.status.last_token, 2);
}

#[test]
fn a_deleted_lock_run_keeps_the_slot_until_its_pipelinerun_is_released() {
    use ParentState::*;
    // The PipelineRun's state, when it is decided, and who then holds.
    let rows = [
        (Running, 6, "pr0"),
        (StopRequested, 6, "pr0"),
        (Draining, 6, "pr0"),
        (Done, 7, "pr1"),
        (Gone, 7, "pr1"),
    ];
    for (state, later, holder) in rows {
        let d = Case {
            name: format!("{state:?}"),
            runs: vec![run(0), run(1)],
            at: 5,
            then: then(later, move |runs| {
                runs[0].phase = Phase::Deleted;
                set_parent(runs, 0, state);
            }),
            ..Case::default()
        }
        .check();
        assert_eq!(holders(&d.last), [holder], "{state:?}");
        if holder == "pr0" {
            // A deleted run is told nothing.
            expect(&d.last, &[(0, Told::Nothing)]);
        }
    }
}

#[test]
fn tokens_never_wrap() {
    Case {
        status: MutexStatus {
            last_token: i64::MAX,
            ..Default::default()
        },
        runs: vec![run(0)],
        at: 1,
        // No grant past i64::MAX.
        holders: Some(&[]),
        last_token: Some(i64::MAX),
        told: vec![(0, any_waiting())],
        ..Case::default()
    }
    .check();
}

#[test]
fn a_run_that_never_held_leaves_no_mark() {
    // Build 82 joins behind 80 and is cancelled by a person: a rerun of 81 (a rollback)
    // is not stale.
    let mut d = Case {
        runs: vec![sequenced(0, 80), sequenced(1, 82)],
        at: 1,
        then: then(2, |runs| runs[1].phase = live(true, Timeout::NotYet)),
        ..Case::default()
    }
    .check();
    apply(&mut d.runs, &d.last);
    d.runs.push(sequenced(2, 81));
    let d3 = decide(&LockSpec::default(), &d.last.status, &d.runs, t(3));
    expect(&d3, &[(2, any_waiting())]);
    assert!(d3.cancels.is_empty());
    // The granted build marks its group.
    let marks: Vec<_> = d3.status.groups.iter().map(|m| m.newest.sequence).collect();
    assert_eq!(marks, [Some(80)]);
}

#[test]
fn a_run_alone_in_its_group_leaves_no_mark() {
    let alone = |i: usize| with(pending(i), |r| r.group = r.age.name.clone());
    let d = Case {
        runs: vec![alone(0), with(alone(1), |r| r.parent = None)],
        at: 1,
        then: then(2, |runs| finish(runs, 0)),
        ..Case::default()
    }
    .check();
    let st = &d.last.status;
    assert_eq!(st.holders.len(), 1, "the standalone run was granted");
    assert!(st.groups.is_empty(), "{:?}", st.groups);
}

#[test]
fn an_older_arrival_behind_a_newer_waiter_is_stale() {
    Case {
        runs: vec![pending(0), pending(2)],
        at: 3,
        then: then(4, |runs| runs.push(pending(1))),
        queue: Some(&["pr2"]),
        told: vec![(1, superseded_by("pr2"))],
        ..Case::default()
    }
    .check();
}

#[test]
fn a_deleted_standalone_holder_is_released() {
    Case {
        runs: vec![with(run(0), |r| r.parent = None), run(1)],
        at: 5,
        then: then(6, |runs| runs[0].phase = Phase::Deleted),
        holders: Some(&["pr1"]),
        ..Case::default()
    }
    .check();
}

#[test]
fn a_waiter_whose_pipelinerun_ended_or_drains_leaves_cancelled() {
    use ParentState::*;
    for state in [Draining, Done, StopRequested] {
        Case {
            name: format!("{state:?}"),
            runs: vec![run(0), run(1)],
            at: 5,
            then: then(6, move |runs| set_parent(runs, 1, state)),
            queue: Some(&[]),
            told: vec![(1, any_cancelled())],
            ..Case::default()
        }
        .check();
    }
}

#[test]
fn a_pipelinerun_is_known_by_its_uid_not_its_name() {
    // pr0 holds; it is deleted and re-created under the same name before the
    // controller sees the deletion. The new one is another PipelineRun.
    let d = Case {
        runs: vec![run(0)],
        at: 1,
        then: then(2, |runs| {
            runs.push(with(sibling(0, 2), |r| {
                r.parent.as_mut().unwrap().uid = "pr0-uid-2".into()
            }))
        }),
        ..Case::default()
    }
    .check();
    // No pass with the old token.
    expect_uid(&d.last, "uid-0-2", any_waiting());
    assert_eq!(
        d.last.status.holders[0].pipeline_run_uid.as_deref(),
        Some("pr0-uid")
    );
    // A cancel names the uid it is for.
    let d = Case {
        runs: vec![pending(1), pending(2), pending(3)],
        at: 5,
        ..Case::default()
    }
    .check();
    assert_eq!(d.last.cancels[0].pipeline_run_uid, "pr2-uid");
}

// ---- state is rebuilt from the runs, never reset (issue 10, item 1) ----

/// A run that was told `Acquired` with `token`, as it shows after the grant.
fn granted(i: usize, token: i64) -> RunView {
    with(run(i), |r| {
        r.phase = Phase::Done { superseded: false };
        r.acquired_token = Some(token);
    })
}

#[test]
fn a_wiped_status_adopts_the_holder_and_keeps_tokens_rising() {
    let spec = LockSpec::default();
    let mut runs = vec![granted(0, 41), run(1)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(5));
    assert_eq!(holders(&d), ["pr0"], "the run told Acquired holds again");
    assert_eq!(d.status.holders[0].token, 41);
    assert_eq!(queue(&d), ["pr1"], "no double grant");
    assert_eq!(d.status.last_token, 41);
    finish(&mut runs, 0);
    let d2 = decide(&spec, &d.status, &runs, t(6));
    expect(&d2, &[(1, acquired(42, 5))]);
}

#[test]
fn last_token_never_below_a_token_a_run_shows() {
    // Ended runs hold nothing, but their tokens still count.
    let done = |i, tok| {
        with(granted(i, tok), |r| {
            r.parent.as_mut().unwrap().state = ParentState::Done
        })
    };
    let d = Case {
        status: MutexStatus {
            last_token: 12,
            ..Default::default()
        },
        runs: vec![done(0, 7), done(1, 90), run(2)],
        at: 5,
        last_token: Some(91),
        ..Case::default()
    }
    .check();
    assert!(d.last.status.holders.iter().all(|h| h.token == 91));
}

#[test]
fn an_old_copy_of_the_status_is_corrected_from_the_runs() {
    // The copy still shows pr0 holding and pr1 waiting; since then pr0 ended
    // and pr1 was granted token 2.
    let spec = LockSpec::default();
    let mut runs = vec![run(0), run(1), run(2)];
    let d0 = decide(&spec, &MutexStatus::default(), &runs[..2], t(1));
    apply(&mut runs, &d0);
    finish(&mut runs, 0);
    let d1 = decide(&spec, &d0.status, &runs, t(2));
    apply(&mut runs, &d1);
    assert_eq!(holders(&d1), ["pr1"]);
    let d = decide(&spec, &d0.status, &runs, t(3));
    assert_eq!(holders(&d), ["pr1"]);
    assert_eq!(d.status.holders[0].token, 2);
    assert_eq!(queue(&d), ["pr2"]);
}

#[test]
fn siblings_of_an_adopted_holder_are_one_holder() {
    let a = with(granted(0, 3), |r| {
        r.run.uid = "uid-0a".into();
        r.run.name = "pr0-lock-a".into();
    });
    Case {
        runs: vec![a, granted(0, 3)],
        at: 5,
        holders: Some(&["pr0"]),
        ..Case::default()
    }
    .check();
}

#[test]
fn a_released_run_is_not_adopted() {
    use ParentState::*;
    // The state of the PipelineRun told Acquired with token 3, who then holds and
    // with what token. A draining PipelineRun still holds.
    let rows = [(Done, "pr1", 4), (Gone, "pr1", 4), (Draining, "pr0", 3)];
    for (state, holder, token) in rows {
        let d = Case {
            name: format!("{state:?}"),
            runs: vec![
                with(granted(0, 3), |r| r.parent.as_mut().unwrap().state = state),
                run(1),
            ],
            at: 5,
            ..Case::default()
        }
        .check();
        assert_eq!(holders(&d.last), [holder], "{state:?}");
        assert_eq!(d.last.status.holders[0].token, token, "{state:?}");
    }
}

#[test]
fn a_lost_status_rebuilds_the_supersede_mark_of_a_granted_run() {
    let holder = with(granted(5, 3), |r| r.supersede = Supersede::Pending);
    let stale = with(pending(2), |r| r.age.created = t(2));
    Case {
        runs: vec![holder, stale],
        at: 9,
        told: vec![(2, any_superseded())],
        ..Case::default()
    }
    .check();
}

// ---- a Mutex marked for deletion ----

#[test]
fn a_mutex_being_deleted_admits_no_one_new_and_releases_nothing() {
    let spec = LockSpec::default();
    let mut runs = vec![run(0), run(1)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(1));
    apply(&mut runs, &d);
    runs.push(run(2));
    let deleting = MutexFacts {
        deleting: true,
        ..Default::default()
    };
    let d2 = decide_with(&spec, &d.status, &runs, t(2), deleting);
    assert_eq!(holders(&d2), ["pr0"], "the holder keeps the slot");
    assert_eq!(queue(&d2), ["pr1"], "the waiter keeps its place");
    expect(&d2, &[(2, Told::Is(Outcome::MutexDeleting))]);
    // The waiter is still served; the newcomer still kept out.
    finish(&mut runs, 0);
    let d3 = decide_with(&spec, &d2.status, &runs, t(3), deleting);
    assert_eq!(holders(&d3), ["pr1"]);
    assert_eq!(d3.status.holders[0].token, 2);
    expect(&d3, &[(2, Told::Is(Outcome::MutexDeleting))]);
    apply(&mut runs, &d3);
    finish(&mut runs, 1);
    let d4 = decide_with(&spec, &d3.status, &runs, t(4), deleting);
    assert!(d4.status.holders.is_empty() && d4.status.queue.is_empty());
    // The new Mutex (empty status) picks up from the runs' tokens.
    let d5 = decide(&spec, &MutexStatus::default(), &runs, t(5));
    expect(&d5, &[(2, acquired(3, 3))]);
}

/// Issue 46 item 6: nothing creates a ClusterMutex again but its administrator, so a run that
/// arrives while one is being deleted is not kept waiting for it: it ends `LockDeleted`, while
/// the holder keeps its slot and the waiter its place, as on a Mutex.
#[test]
fn a_cluster_mutex_being_deleted_ends_a_newcomers_wait_at_once() {
    let spec = LockSpec::default();
    let mut runs = vec![run(0), run(1)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(1));
    apply(&mut runs, &d);
    runs.push(run(2));
    let deleting = MutexFacts {
        deleting: true,
        namespace_share: Some(250),
        priority_across_namespaces: false,
        ..Default::default()
    };
    assert!(!deleting.comes_back_when_deleted());
    let d2 = decide_with(&spec, &d.status, &runs, t(2), deleting);
    assert_eq!(holders(&d2), ["pr0"], "the holder keeps the slot");
    assert_eq!(queue(&d2), ["pr1"], "the waiter keeps its place");
    expect(&d2, &[(2, Told::Is(Outcome::LockDeleted))]);
    let (reason, message) =
        crate::run_status::condition(RunKind::CustomRun, "prod", &Outcome::LockDeleted);
    assert_eq!((reason.as_str(), reason.status()), ("LockDeleted", "False"));
    assert!(
        message.contains("nothing creates a ClusterMutex again"),
        "{message}"
    );
}

/// Chaos seed 303: a Mutex in use was deleted, its holder's PipelineRun too (and with it the
/// only run that showed token 1); the new Mutex of the key granted token 1 again. Tokens continue
/// from the deleted Mutex's last token, which the controller passes on as the token floor.
#[test]
fn a_new_mutex_continues_above_the_deleted_ones_last_token() {
    let spec = LockSpec::default();
    let runs = vec![run(0)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(1));
    assert_eq!(
        d.status.holders[0].token, 1,
        "no floor, no run: tokens start at 1"
    );
    let after = MutexFacts {
        token_floor: 7,
        ..Default::default()
    };
    let d = decide_with(&spec, &MutexStatus::default(), &runs, t(1), after);
    assert_eq!(d.status.holders[0].token, 8);
    // Neither the status nor a run's token is lowered by a floor below them.
    let mut runs = runs;
    apply(&mut runs, &d);
    let low = MutexFacts {
        token_floor: 3,
        ..Default::default()
    };
    let d2 = decide_with(&spec, &MutexStatus::default(), &runs, t(2), low);
    assert_eq!(d2.status.holders[0].token, 8);
    assert_eq!(d2.status.last_token, 8);
}

// ---- a bounded queue ----

#[test]
fn an_arrival_beyond_max_queue_fails_queue_full() {
    let spec = LockSpec {
        max_queue: 2,
        ..Default::default()
    };
    let runs: Vec<RunView> = (0..5).map(run).collect();
    let full = || {
        Told::Is(Outcome::QueueFull {
            limit: 2,
            namespace: None,
        })
    };
    let d = Case {
        spec: spec.clone(),
        runs: runs.clone(),
        at: 9,
        holders: Some(&["pr0"]),
        queue: Some(&["pr1", "pr2"]),
        told: vec![(3, full()), (4, full())],
        ..Case::default()
    }
    .check();
    // wait: "false" never queues, so it is not refused for a full queue.
    let runs = [&runs[..3], &[nowait(6)]].concat();
    let d = decide(&spec, &d.last.status, &runs, t(10));
    expect(&d, &[(6, any_not_acquired())]);
    assert_eq!(LockSpec::default().max_queue, 1000);
}

// ---- a bounded status (issue 10, item 3) ----

fn status_bytes(st: &MutexStatus) -> usize {
    serde_json::to_vec(st).unwrap().len()
}

/// Push `n` runs through one key, one at a time: each arrives, is granted, ends.
fn through_one_key(n: usize, f: impl Fn(RunView, usize) -> RunView) -> MutexStatus {
    let spec = LockSpec::default();
    let mut st = MutexStatus::default();
    for i in 0..n {
        let mut runs = vec![f(run(i), i)];
        let d = decide(&spec, &st, &runs, t(i as i64));
        apply(&mut runs, &d);
        assert_eq!(d.status.last_token, i as i64 + 1);
        match runs[0].parent.as_mut() {
            Some(p) => p.state = ParentState::Done,
            None => runs[0].phase = Phase::Deleted,
        }
        st = decide(&spec, &d.status, &runs, t(i as i64)).status;
    }
    st
}

#[test]
fn two_thousand_standalone_runs_keep_the_status_small() {
    let st = through_one_key(2000, |r, _| {
        with(r, |r| {
            r.parent = None;
            r.group = r.run.name.clone();
            r.age.name = r.run.name.clone();
            r.supersede = Supersede::Pending;
        })
    });
    assert!(st.groups.is_empty());
    assert!(status_bytes(&st) < 16 * 1024, "{}", status_bytes(&st));
}

#[test]
fn two_thousand_groups_keep_only_the_most_recent_marks() {
    let st = through_one_key(2000, |r, i| {
        with(r, |r| {
            r.group = format!("group-{i}");
            r.supersede = Supersede::Pending;
        })
    });
    assert_eq!(st.groups.len(), MAX_GROUP_MARKS);
    assert_eq!(st.groups[0].group, "group-1999", "the newest first");
    let size = status_bytes(&st);
    assert!(size < 96 * 1024, "{size} bytes");
}

#[test]
fn a_mark_of_a_group_idle_past_mark_idle_days_is_forgotten() {
    let spec = LockSpec {
        mark_idle_days: 2,
        ..Default::default()
    };
    let mut runs = vec![pending(5)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(10));
    apply(&mut runs, &d);
    finish(&mut runs, 0);
    let day = 24 * 3600;
    let d = decide(&spec, &d.status, &runs, t(day));
    assert_eq!(d.status.groups.len(), 1, "kept within the idle time");
    runs.remove(0);
    let d = decide(&spec, &d.status, &runs, t(2 * day + 11));
    assert!(d.status.groups.is_empty(), "{:?}", d.status.groups);
    // An older run of the group is no longer stale.
    let d = decide(&spec, &d.status, &[pending(1)], t(2 * day + 12));
    expect(&d, &[(1, any_acquired())]);
}

#[test]
fn a_group_that_still_holds_keeps_its_mark_however_long() {
    let spec = LockSpec {
        mark_idle_days: 1,
        ..Default::default()
    };
    let mut runs = vec![pending(5)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(10));
    apply(&mut runs, &d);
    let d = decide(&spec, &d.status, &runs, t(30 * 24 * 3600));
    assert_eq!(d.status.groups.len(), 1);
    runs.push(pending(1));
    let d = decide(&spec, &d.status, &runs, t(30 * 24 * 3600 + 1));
    expect(&d, &[(1, any_superseded())]);
}

/// A run that claims PipelineRun `pr<victim>` as its owner, which does not list it.
fn forged(i: usize, victim: usize) -> RunView {
    with(run(i), |r| {
        r.parent.as_mut().unwrap().name = format!("pr{victim}");
        r.parent.as_mut().unwrap().uid = format!("pr{victim}-uid");
        r.age.name = format!("pr{victim}");
        r.supersede = Supersede::Pending;
        r.phase = Phase::Unlisted;
    })
}

#[test]
fn an_unlisted_run_is_not_enrolled_and_cancels_nobody() {
    // pr1 holds, pr2 waits; a forged run "of" pr2 with a huge sequence arrives, and a
    // forged stale-looking run "of" pr1 (the holder): it must not cancel it.
    let d = Case {
        runs: vec![pending(1), pending(2)],
        at: 3,
        then: then(4, |runs| {
            runs.push(with(forged(9, 2), |r| r.age.sequence = Some(i64::MAX)));
            runs.push(with(forged(8, 1), |r| r.age.sequence = Some(-1)));
        }),
        cancels: Some(&[]),
        holders: Some(&["pr1"]),
        // Not queued, and pr2 is not superseded.
        queue: Some(&["pr2"]),
        // An unlisted run is told nothing.
        told: vec![(9, Told::Nothing), (8, Told::Nothing)],
        ..Case::default()
    }
    .check();
    let aged: Vec<_> = d.last.status.queue.iter().map(|w| w.age.sequence).collect();
    assert_eq!(
        aged,
        [None],
        "a forged sibling does not change its victim's age"
    );
}

#[test]
fn an_unlisted_run_never_reenters_a_held_slot() {
    Case {
        runs: vec![run(0)],
        at: 1,
        then: then(2, |runs| runs.push(forged(5, 0))),
        // No Acquired on behalf of pr0.
        told: vec![(5, Told::Nothing)],
        ..Case::default()
    }
    .check();
}

#[test]
fn an_unlisted_run_marked_superseded_recancels_nothing() {
    Case {
        runs: vec![forged(3, 0)],
        at: 1,
        cancels: Some(&[]),
        ..Case::default()
    }
    .check();
}

/// Record what each run is told; returns how many runs' statuses change.
fn tell(d: &Decision, said: &mut std::collections::HashMap<String, Outcome>) -> usize {
    d.outcomes
        .iter()
        .filter(|(r, o)| said.insert(r.uid.clone(), o.clone()).as_ref() != Some(o))
        .count()
}

/// Writes per grant stay constant: a grant changes the granted run's status and
/// the new head's, an arrival only its own, whether 10 or 1,000 runs wait.
#[test]
fn a_grant_or_an_arrival_changes_as_many_run_statuses_whatever_the_queue_length() {
    for waiters in [10, 1000] {
        let spec = LockSpec {
            max_queue: 100_000,
            ..Default::default()
        };
        let mut runs: Vec<RunView> = (0..=waiters).map(run).collect();
        let mut said = std::collections::HashMap::new();
        let d = decide(&spec, &MutexStatus::default(), &runs, t(10_000));
        assert_eq!(tell(&d, &mut said), waiters + 1, "everyone is told once");
        apply(&mut runs, &d);
        let mut status = d.status;
        for next in 1..=3 {
            finish(&mut runs, next - 1);
            let d = decide(&spec, &status, &runs, t(10_000 + next as i64));
            assert_eq!(holders(&d), [format!("pr{next}")]);
            let changed = tell(&d, &mut said);
            assert_eq!(changed, 2, "granted run and new head, {waiters} waiting");
            apply(&mut runs, &d);
            status = d.status;
        }
        runs.push(run(waiters + 1));
        let d = decide(&spec, &status, &runs, t(20_000));
        assert_eq!(
            tell(&d, &mut said),
            1,
            "only the newcomer, {waiters} waiting"
        );
        assert_eq!(queue(&d).last(), Some(&format!("pr{}", waiters + 1)));
    }
}

/// Issue 23 item 1: two lock runs of one PipelineRun on one key, the first with
/// `release-after`. Its section ending does not free the slot while the sibling
/// (re-entered with the same token) still guards a running section: the hold is
/// the PipelineRun's, released by the last of its lock runs, each by its own rule.
#[test]
fn a_release_after_sibling_keeps_the_hold_until_the_last_lock_run_lets_go() {
    let d = Case {
        runs: vec![run(0), run(1)],
        at: 1,
        then: then(2, |runs| runs.push(sibling(0, 2))),
        holders: Some(&["pr0"]),
        ..Case::default()
    }
    .check();
    expect_uid(&d.last, "uid-0-2", Told::Token(1));
    let mut runs = d.runs;
    apply(&mut runs, &d.last);
    // The first lock run's release-after task is done; the sibling's PipelineRun runs on.
    set_parent(&mut runs, 0, ParentState::SectionDone);
    let d3 = decide(&LockSpec::default(), &d.last.status, &runs, t(3));
    assert_eq!(
        holders(&d3),
        ["pr0"],
        "the sibling still guards its section"
    );
    assert_eq!(queue(&d3), ["pr1"]);
    let granted_pr1 = |d: &Decision| {
        d.outcomes
            .iter()
            .any(|(r, o)| r.uid == "uid-1" && matches!(o, Outcome::Acquired { .. }))
    };
    assert!(!granted_pr1(&d3), "pr1 must not deploy beside the sibling");
    // The next sync (say after a restart, status as written) does not adopt a second holder.
    let d4 = decide(&LockSpec::default(), &d3.status, &runs, t(4));
    assert_eq!(holders(&d4), ["pr0"]);
    // The PipelineRun ends: now the slot goes to pr1.
    set_parent(&mut runs, 0, ParentState::Done);
    set_parent(&mut runs, 2, ParentState::Done);
    let d5 = decide(&LockSpec::default(), &d4.status, &runs, t(5));
    assert_eq!(holders(&d5), ["pr1"]);
    told_is("released by the last", &d5, "uid-1", &Told::Token(2));
}

/// Issue 23 item 7: one tenant cannot fill a ClusterMutex's queue for the
/// others. With a share of 2 per namespace, team-a's third waiter is refused,
/// naming the namespace, and team-b still joins.
#[test]
fn a_namespace_beyond_its_share_of_a_cluster_mutex_queue_is_refused() {
    let of = |ns: &str, i: usize| {
        with(run(i), |r| {
            r.run.name = format!("{ns}/pr{i}-lock");
            r.parent.as_mut().unwrap().name = format!("{ns}/pr{i}");
        })
    };
    let runs = vec![
        of("team-a", 0),
        of("team-a", 1),
        of("team-a", 2),
        of("team-a", 3),
        of("team-b", 4),
    ];
    let facts = MutexFacts {
        namespace_share: Some(2),
        priority_across_namespaces: false,
        ..Default::default()
    };
    let d = decide_with(
        &LockSpec::default(),
        &MutexStatus::default(),
        &runs,
        t(5),
        facts,
    );
    assert_eq!(holders(&d), ["team-a/pr0"]);
    assert_eq!(queue(&d), ["team-a/pr1", "team-a/pr2", "team-b/pr4"]);
    let refused = Outcome::QueueFull {
        limit: 2,
        namespace: Some("team-a".into()),
    };
    told_is("over its share", &d, "uid-3", &Told::Is(refused));
}

/// Exclusion by PipelineRun over two keys, siblings, re-pointed and deleted runs.
mod pipeline_runs;

/// Issue 37 item 4: a queued PipelineRun whose record (an annotation its author can write)
/// claims a grant the lock's status does not list holds nothing and raises no token: the
/// next run is granted token 1.
#[test]
fn a_queued_pipeline_runs_claim_the_status_does_not_list_grants_nothing() {
    let spec = LockSpec::default();
    let forger = with(pending(0), |r| {
        r.run.kind = RunKind::PipelineRun;
        r.phase = Phase::Done { superseded: false };
        r.acquired_token = Some(MAX_TOKEN);
    });
    let runs = vec![forger, pending(1)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(2));
    assert_eq!(holders(&d), ["pr1"], "{:?}", d.status);
    assert_eq!(d.status.last_token, 1);
    expect(&d, &[(1, acquired(1, 1))]);
}

/// Issue 37: a queued PipelineRun the status lists as a holder, whose record was rewritten
/// before the grant reached it (its author claims another token, or an end), is told its
/// grant again, with the status's token: it starts, and the key is not held for good.
#[test]
fn a_queued_holder_whose_record_was_rewritten_is_told_its_grant_again() {
    let spec = LockSpec::default();
    let queued = |r: &mut RunView| r.run.kind = RunKind::PipelineRun;
    let runs = vec![with(pending(0), queued)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(1));
    expect(&d, &[(0, acquired(1, 1))]);
    for claim in [Some(MAX_TOKEN), None] {
        let rewritten = with(pending(0), |r| {
            queued(r);
            r.phase = Phase::Done { superseded: false };
            r.acquired_token = claim;
        });
        let d2 = decide(&spec, &d.status, &[rewritten, pending(1)], t(2));
        assert_eq!(holders(&d2), ["pr0"], "{:?}", d2.status);
        assert_eq!(d2.status.last_token, 1);
        expect(&d2, &[(0, acquired(1, 1))]);
    }
}

/// Issue 46 item 1: a queued PipelineRun someone else started while it waited (its
/// `spec.status` cleared, no grant) is no waiter and no holder: it is told
/// `StartedWithoutGrant` (its PipelineRun is cancelled), and the slot goes to the run behind
/// it when the holder ends. A holder the status lists, started a moment before its grant's own
/// patch landed, keeps its slot.
#[test]
fn a_queued_pipeline_run_started_without_its_grant_is_cancelled_never_granted() {
    let spec = LockSpec::default();
    let mut runs: Vec<RunView> = (0..3).map(queued_pipeline_run).collect();
    let d = decide(&spec, &MutexStatus::default(), &runs, t(3));
    assert_eq!(
        (holders(&d), queue(&d)),
        (vec!["pr0".into()], vec!["pr1".into(), "pr2".into()])
    );
    // pr0 started by its grant, its record not yet written; pr1 started by its author.
    runs[0].started = true;
    runs[1].started = true;
    let d2 = decide(&spec, &d.status, &runs, t(4));
    assert_eq!(
        (holders(&d2), queue(&d2)),
        (vec!["pr0".into()], vec!["pr2".into()])
    );
    let told = |uid: &str| {
        d2.outcomes
            .iter()
            .filter(|(r, _)| r.uid == uid)
            .map(|(_, o)| o.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        told("pr1-uid")
            .iter()
            .all(|o| *o == Outcome::StartedWithoutGrant),
        "{:?}",
        told("pr1-uid")
    );
    assert!(
        !told("pr1-uid").is_empty()
            && told("pr0-uid")
                .iter()
                .all(|o| matches!(o, Outcome::Acquired { token: 1, .. }))
    );
    let (reason, message) =
        crate::run_status::condition(RunKind::PipelineRun, "prod", &Outcome::StartedWithoutGrant);
    assert_eq!(
        (reason.as_str(), reason.status()),
        ("StartedWithoutGrant", "False")
    );
    assert!(
        message.contains("without its grant") && message.contains("prod"),
        "{message}"
    );
    apply(&mut runs, &d2);
    finish(&mut runs, 0);
    let d3 = decide(&spec, &d2.status, &runs, t(5));
    assert_eq!(holders(&d3), ["pr2"], "{:?}", d3.status);
}

/// Issue 46 item 7: on a ClusterMutex, a namespace's `sequence` (and `priority`) order its own
/// runs only. Tenant A's runs, created after tenant B's waiter with smaller build numbers (or
/// none), do not pass it: B's waiter is granted next, then A's in A's own order.
#[test]
fn on_a_cluster_mutex_one_namespaces_sequence_does_not_pass_another_namespaces_waiter() {
    let spec = LockSpec::default();
    let cluster = MutexFacts {
        namespace_share: Some(250),
        priority_across_namespaces: false,
        ..Default::default()
    };
    let tenant = |i: usize, ns: &str, sequence: Option<i64>, priority: i64| {
        with(run(i), |r| {
            r.run.name = format!("{ns}/pr{i}-lock");
            r.group = format!("{ns}/deploy-{i}");
            r.age.sequence = sequence;
            r.priority = priority;
        })
    };
    let runs = vec![
        tenant(0, "team-a", Some(1), 0),
        tenant(1, "team-b", Some(900), 0),
        tenant(2, "team-a", Some(3), 5),
        tenant(3, "team-a", Some(2), 0),
        tenant(4, "team-a", None, 0),
    ];
    let first = decide_with(&spec, &MutexStatus::default(), &runs[..1], t(0), cluster);
    assert_eq!(holders(&first), ["pr0"]);
    let d = decide_with(&spec, &first.status, &runs, t(5), cluster);
    assert_eq!(
        queue(&d),
        ["pr1", "pr2", "pr4", "pr3"],
        "{:?}",
        d.status.queue
    );
    // A ClusterMutex with `crossNamespacePriority` lets priority pass other namespaces:
    // team-a's priority-5 run goes first, then the namespaces take turns again.
    let trusting = MutexFacts {
        priority_across_namespaces: true,
        ..cluster
    };
    let d = decide_with(&spec, &first.status, &runs, t(5), trusting);
    assert_eq!(
        queue(&d),
        ["pr2", "pr1", "pr4", "pr3"],
        "{:?}",
        d.status.queue
    );
    // On a Mutex (one namespace) the runs' own claims order the whole queue, as before.
    let first = decide(&spec, &MutexStatus::default(), &runs[..1], t(0));
    let d = decide(&spec, &first.status, &runs, t(5));
    assert_eq!(
        queue(&d),
        ["pr2", "pr4", "pr3", "pr1"],
        "{:?}",
        d.status.queue
    );
}

/// Issue 49 item 1: a lock's status never grows past what the API server and etcd accept. With
/// names as long as Kubernetes allows (253 characters: run, PipelineRun, Pipeline) and a
/// `maxQueue` far above it, arrivals past [`crate::decide::STATUS_BYTES`] are refused
/// `StatusFull` (reason `QueueFull`), the status as written stays under it, and the README
/// says how many waiters that is.
#[test]
fn a_long_queue_of_long_names_stops_short_of_the_status_limit() {
    let spec = LockSpec {
        max_queue: 100_000,
        ..LockSpec::default()
    };
    let long = |i: usize, what: &str| format!("{what}-{i:06}-{}", "x".repeat(253 - 8 - what.len()));
    let runs: Vec<RunView> = (0..6_000)
        .map(|i| {
            with(run(i), |r| {
                r.run.name = long(i, "run");
                r.group = long(i, "pipeline");
                r.age.name = long(i, "pr");
                if let Some(p) = &mut r.parent {
                    p.name = long(i, "pr");
                }
            })
        })
        .collect();
    let d = decide(&spec, &MutexStatus::default(), &runs, t(6_000));
    let written = serde_json::to_vec(&d.status).unwrap().len();
    assert!(written <= crate::decide::STATUS_BYTES, "{written} bytes");
    let refused = d
        .outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::StatusFull { .. }))
        .count();
    let waiters = d.status.queue.len();
    assert!(
        refused > 0 && waiters + refused + 1 == runs.len(),
        "{waiters} waiting, {refused} refused"
    );
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let said = format!("{} waiters", waiters / 100 * 100);
    assert!(
        readme.contains(&said),
        "the README should say \"{said}\" (at least, at the longest names)"
    );
}

/// Issue 49 item 2: a holder whose grant the API server refused to deliver for good is no
/// holder: the slot goes to the next waiter with the next token (never the same one), the
/// refused run is told why, and it does not come back as a newcomer while the refusal stands.
#[test]
fn a_grant_that_cannot_be_delivered_is_taken_back() {
    let spec = LockSpec::default();
    let runs = vec![run(0), run(1), run(2)];
    let d = decide(&spec, &MutexStatus::default(), &runs, t(3));
    assert_eq!((holders(&d), d.status.last_token), (vec!["pr0".into()], 1));
    let refused = BTreeMap::from([("uid-0".to_string(), "denied by policy (403)".to_string())]);
    let (deadlocked, multi) = (BTreeMap::new(), MultiKeys::default());
    let input = |status| Input {
        spec: &spec,
        status,
        runs: &runs,
        now: t(4),
        facts: MutexFacts::default(),
        requests: &[],
        multi: &multi,
        deadlocked: &deadlocked,
        undelivered: &refused,
        closed_by_window: None,
    };
    let d2 = crate::decide::decide(&input(&d.status));
    assert_eq!(
        (holders(&d2), queue(&d2)),
        (vec!["pr1".into()], vec!["pr2".into()])
    );
    assert_eq!(d2.status.last_token, 2, "a new token for the next holder");
    let told: Vec<&Outcome> = d2
        .outcomes
        .iter()
        .filter(|(r, _)| r.uid == "uid-0")
        .map(|(_, o)| o)
        .collect();
    assert!(
        matches!(told[..], [Outcome::Cancelled { why }] if why.contains("could not be delivered") && why.contains("denied by policy")),
        "{told:?}"
    );
    let d3 = crate::decide::decide(&input(&d2.status));
    assert_eq!(
        (holders(&d3), queue(&d3)),
        (vec!["pr1".into()], vec!["pr2".into()]),
        "pr0 stays out"
    );
    // Its Cancelled was refused too (it still runs): it is told again, until that lands.
    let again: Vec<&Outcome> = d3
        .outcomes
        .iter()
        .filter(|(r, _)| r.uid == "uid-0")
        .map(|(_, o)| o)
        .collect();
    assert!(
        matches!(again[..], [Outcome::Cancelled { why }] if why.contains("could not be delivered")),
        "{again:?}"
    );
}

/// Issue 48: a closed window grants nothing new (holders keep the key), the waiters say which
/// window and until when (reason `WindowClosed`), and the status shows it; once it opens, the
/// head of the queue is granted. A freeze is said before a window.
#[test]
fn a_closed_window_grants_nothing_new_and_says_until_when() {
    let spec = LockSpec::default();
    let runs = [run(0), run(1)];
    let first = decide(&spec, &MutexStatus::default(), &runs[..1], t(1));
    assert_eq!(holders(&first), vec!["pr0".to_string()]);
    let (deadlocked, undelivered, multi) = (BTreeMap::new(), BTreeMap::new(), MultiKeys::default());
    let message = "deny window weekend-freeze until Mon 08:00 Europe/Berlin";
    let input = |spec, status, runs, window| Input {
        spec,
        status,
        runs,
        now: t(4),
        facts: MutexFacts::default(),
        requests: &[],
        multi: &multi,
        deadlocked: &deadlocked,
        undelivered: &undelivered,
        closed_by_window: window,
    };
    // The holder is gone; the window keeps pr1 waiting though the slot is free.
    let closed = crate::decide::decide(&input(&spec, &first.status, &runs[1..], Some(message)));
    assert_eq!(
        (holders(&closed), queue(&closed)),
        (vec![], vec!["pr1".to_string()])
    );
    assert_eq!(closed.status.closed_by_window.as_deref(), Some(message));
    let told = closed
        .outcomes
        .iter()
        .find(|(r, _)| r.uid == "uid-1")
        .map(|(_, o)| o);
    assert!(
        matches!(told, Some(Outcome::Frozen { window: Some(w), next: true, .. }) if w == message),
        "{told:?}"
    );
    let (reason, said) = crate::run_status::condition(RunKind::CustomRun, "env", told.unwrap());
    assert_eq!(reason.as_str(), "WindowClosed");
    assert!(
        said.starts_with(&format!("waiting for env: {message}; ")),
        "{said}"
    );
    // Frozen as well: the freeze is said.
    let frozen = LockSpec {
        frozen: true,
        ..LockSpec::default()
    };
    let both = crate::decide::decide(&input(&frozen, &first.status, &runs[1..], Some(message)));
    let told = both
        .outcomes
        .iter()
        .find(|(r, _)| r.uid == "uid-1")
        .map(|(_, o)| o);
    assert!(
        matches!(told, Some(Outcome::Frozen { window: None, .. })),
        "{told:?}"
    );
    // The window opens: pr1 is granted.
    let open = crate::decide::decide(&input(&spec, &closed.status, &runs[1..], None));
    assert_eq!(holders(&open), vec!["pr1".to_string()]);
    assert_eq!(open.status.closed_by_window, None);
}
