//! The queue-control steps of the decision: requests, dismissals, promotion, freeze.

use crate::decide::test_entry::*;
use crate::decide::tests::{run, t};
use crate::model::*;
use crate::requests::Unreadable;
use crate::requests::{Action, Dismissal, Request, Verdict};
#[allow(unused_imports)]
use std::collections::{BTreeMap, HashMap, HashSet};
use tekton_mutex_api::mutex::*;

fn request(id: &str, action: Action, pr: Option<&str>) -> Result<Request, Unreadable> {
    Ok(Request {
        id: id.into(),
        action,
        pipeline_run: pr.map(Into::into),
        reason: Some("on call".into()),
        by: "alice".into(),
        force: true,
        keep_pipeline_runs: false,
        group: None,
    })
}

/// One key's world: its status and runs, moved on by each decision as the applier would.
struct World {
    spec: LockSpec,
    status: MutexStatus,
    runs: Vec<RunView>,
    clock: i64,
}

impl World {
    fn new(n: usize) -> World {
        let mut w = World {
            spec: LockSpec::default(),
            status: MutexStatus::default(),
            runs: (0..n).map(run).collect(),
            clock: 100,
        };
        w.step(&[]);
        w
    }

    fn step(&mut self, requests: &[Result<Request, Unreadable>]) -> Decision {
        self.clock += 1;
        let facts = MutexFacts::default();
        let d = decide_requested(
            &self.spec,
            &self.status,
            &self.runs,
            t(self.clock),
            facts,
            requests,
        );
        for r in &mut self.runs {
            match d.outcomes.iter().find(|(x, _)| x.uid == r.run.uid) {
                Some((_, Outcome::Acquired { token, .. })) => {
                    r.acquired_token = Some(*token);
                    r.phase = Phase::Done { superseded: false };
                }
                Some((_, Outcome::Cleared { .. })) => r.phase = Phase::Done { superseded: false },
                _ => {}
            }
            let p = r.parent.as_mut().unwrap();
            if d.control_cancels
                .iter()
                .any(|c| c.pipeline_run_uid == p.uid)
            {
                p.state = ParentState::StopRequested;
            }
        }
        self.status = d.status.clone();
        d
    }

    fn finish(&mut self, i: usize) {
        self.runs[i].parent.as_mut().unwrap().state = ParentState::Done;
    }

    fn holders(&self) -> Vec<(String, i64)> {
        let h = &self.status.holders;
        h.iter()
            .map(|h| (h.pipeline_run.clone().unwrap(), h.token))
            .collect()
    }

    fn queue(&self) -> Vec<String> {
        let q = &self.status.queue;
        q.iter().map(|w| w.pipeline_run.clone().unwrap()).collect()
    }

    fn ack(&self, id: &str) -> &crate::requests::ObservedRequest {
        let acks = &self.status.observed_requests;
        acks.iter().find(|o| o.id == id).expect("acknowledged")
    }
}

#[test]
fn a_frozen_key_grants_nothing_and_its_waiters_say_why() {
    let mut w = World::new(2);
    w.spec.frozen = true;
    w.spec.frozen_reason = Some("change freeze".into());
    w.finish(0);
    let d = w.step(&[]);
    assert!(w.holders().is_empty(), "nothing granted while frozen");
    assert_eq!(w.queue(), ["pr1"]);
    assert!(w.status.frozen);
    let o = d.outcomes.iter().find(|(r, _)| r.uid == "uid-1").unwrap();
    assert!(
        matches!(&o.1, Outcome::Frozen { next: true, reason: Some(r), .. } if r == "change freeze")
    );
    w.spec.frozen = false;
    w.step(&[]);
    assert_eq!(w.holders(), [("pr1".to_string(), 2)]);
    assert!(!w.status.frozen);
}

#[test]
fn a_frozen_key_lets_holders_keep_the_slot_and_timeouts_apply() {
    let mut w = World::new(3);
    w.spec.frozen = true;
    w.runs[2].phase = Phase::Live {
        cancel_requested: false,
        timeout: Timeout::Final,
    };
    let d = w.step(&[]);
    assert_eq!(w.holders(), [("pr0".to_string(), 1)]);
    assert_eq!(w.queue(), ["pr1"]);
    assert!(
        d.outcomes
            .contains(&(w.runs[2].run.clone(), Outcome::TimedOut))
    );
}

#[test]
fn a_forced_release_hands_over_with_a_higher_token_and_cancels_the_holder() {
    let mut w = World::new(3);
    let d = w.step(&[request("r1", Action::Release, Some("pr0"))]);
    assert_eq!(w.ack("r1").verdict, Verdict::Done);
    assert_eq!(w.holders(), [("pr1".to_string(), 2)]);
    assert_eq!(w.queue(), ["pr2"]);
    let c = &d.control_cancels[..];
    assert!(
        matches!(c, [c] if c.pipeline_run == "pr0" && c.dismissal == Dismissal::Released
            && c.message.contains("alice") && c.message.contains("on call"))
    );
    // The released holder's Acquired status does not make it a holder again.
    w.step(&[]);
    assert_eq!(w.holders(), [("pr1".to_string(), 2)]);
    assert_eq!(w.status.dismissed.len(), 1);
    w.finish(0);
    w.step(&[]);
    assert!(
        w.status.dismissed.is_empty(),
        "forgotten once it cannot run"
    );
    // Even a lost status is rebuilt without it.
    w.status = MutexStatus::default();
    w.step(&[]);
    assert_eq!(w.holders(), [("pr1".to_string(), 2)]);
}

#[test]
fn a_release_needs_force_and_a_holder() {
    let mut w = World::new(2);
    let mut unforced = request("a", Action::Release, Some("pr0")).unwrap();
    unforced.force = false;
    let before = w.status.clone();
    w.step(&[
        Ok(unforced),
        request("b", Action::Release, Some("pr1")),
        request("c", Action::Release, Some("nope")),
        request("d", Action::Promote, Some("pr0")),
        Err(Unreadable {
            id: "e".into(),
            error: "not a request: bad".into(),
            action: None,
            by: String::new(),
        }),
    ]);
    for id in ["a", "b", "c", "d", "e"] {
        assert_eq!(w.ack(id).verdict, Verdict::Refused, "{id}");
    }
    assert!(w.ack("b").message.contains("does not hold"));
    assert_eq!(w.status.holders, before.holders);
    assert_eq!(w.status.queue, before.queue);
    assert!(w.status.dismissed.is_empty());
}

/// Issue 37 item 6: a clear whose reason is 200 KB, on a key with 12 waiters, is refused
/// as the clear it is and by whom, naming the bound, in the step that reads it; nothing of
/// its reason is kept, nobody is cleared, and the holder's end hands over at once.
#[test]
fn an_oversized_clear_is_refused_as_a_clear_and_the_key_hands_over() {
    let mut w = World::new(13);
    let mut big = request("big", Action::Clear, None).unwrap();
    big.reason = Some("x".repeat(200 * 1024));
    let read = crate::requests::requests_from(&[big.annotation()].into());
    let d = w.step(&read);
    let ack = w.ack("big");
    assert_eq!(
        (ack.verdict, ack.action, ack.by.as_str()),
        (Verdict::Refused, Some(Action::Clear), "alice")
    );
    assert!(ack.message.contains("reason") && ack.message.contains("at most 1024"));
    assert!(serde_json::to_string(&w.status).unwrap().len() < 16 * 1024);
    assert!(d.control_cancels.is_empty() && w.status.dismissed.is_empty());
    assert_eq!(w.queue().len(), 12, "nobody was cleared");
    // The annotation is read again until it is removed: acknowledged once, nothing more.
    let again = w.step(&read);
    assert_eq!(again.status.observed_requests.len(), 1);
    w.finish(0);
    w.step(&read);
    assert_eq!(w.holders(), [("pr1".to_string(), 2)], "handed over at once");
}

#[test]
fn clear_fails_every_waiter_and_cancels_unless_kept() {
    let mut w = World::new(4);
    let mut keep = request("k", Action::Clear, None).unwrap();
    keep.keep_pipeline_runs = true;
    let d = w.step(&[request("c", Action::Clear, None)]);
    assert!(w.queue().is_empty());
    assert_eq!(w.holders(), [("pr0".to_string(), 1)]);
    let cleared: Vec<_> = d
        .outcomes
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Cleared { message } if message.contains("alice")))
        .collect();
    assert_eq!(cleared.len(), 3);
    assert_eq!(d.control_cancels.len(), 3);
    // Cleared runs do not come back even though their PipelineRuns still run.
    w.step(&[]);
    assert!(w.queue().is_empty());
    // A newcomer after the clear queues as usual; a kept clear cancels nothing.
    w.runs.push(run(9));
    w.step(&[]);
    assert_eq!(w.queue(), ["pr9"]);
    let d = w.step(&[Ok(keep)]);
    assert!(d.control_cancels.is_empty());
    assert!(w.queue().is_empty());
}

#[test]
fn promote_moves_one_waiter_to_the_front_once() {
    let mut w = World::new(4);
    w.runs[1].priority = 5;
    w.step(&[]);
    assert_eq!(w.queue(), ["pr1", "pr2", "pr3"]);
    w.step(&[request("p", Action::Promote, Some("pr3"))]);
    assert_eq!(w.queue(), ["pr3", "pr1", "pr2"]);
    w.finish(0);
    w.step(&[]);
    assert_eq!(w.holders(), [("pr3".to_string(), 2)]);
    assert!(w.status.promoted.is_empty(), "once: forgotten when granted");
    assert_eq!(w.queue(), ["pr1", "pr2"]);
}

#[test]
fn a_request_is_acted_on_once_and_acknowledgements_stay_bounded() {
    let mut w = World::new(3);
    let r = request("p", Action::Promote, Some("pr2"));
    w.step(std::slice::from_ref(&r));
    w.step(&[request("q", Action::Promote, Some("pr1"))]);
    assert_eq!(w.queue(), ["pr1", "pr2"]);
    w.step(&[r]);
    assert_eq!(
        w.queue(),
        ["pr1", "pr2"],
        "an acknowledged request is not redone"
    );
    let many: Vec<_> = (0..30)
        .map(|i| request(&format!("x{i:02}"), Action::Promote, Some("nope")))
        .collect();
    w.step(&many);
    let acks = &w.status.observed_requests;
    assert_eq!(acks.len(), crate::requests::MAX_OBSERVED_REQUESTS);
    assert_eq!(acks.last().unwrap().id, "x29");
}

#[test]
fn a_holder_recorded_without_its_pipeline_run_uid_is_released_for_good() {
    let mut w = World::new(2);
    w.status.holders[0].pipeline_run_uid = None;
    w.step(&[request("r", Action::Release, Some("pr0"))]);
    assert_eq!(w.status.dismissed[0].uid, "pr0-uid");
    w.step(&[]);
    assert_eq!(w.holders(), [("pr1".to_string(), 2)]);
}

fn forget(id: &str, group: &str) -> Result<Request, Unreadable> {
    let mut r = request(id, Action::Forget, None)?;
    r.group = Some(group.into());
    Ok(r)
}

fn told(d: &Decision, uid: &str) -> Outcome {
    let o = d.outcomes.iter().find(|(r, _)| r.uid == uid);
    o.map(|(_, o)| o.clone()).expect("told")
}

/// Issue 23 item 10: one run with a huge `sequence` marks its group so high that
/// every later run is stale. Forgetting the mark lets them through, and the mark
/// does not come back from the run that raised it, though it still shows its grant.
#[test]
fn a_forgotten_mark_lets_the_group_through_and_never_comes_back() {
    let mut w = World::new(0);
    let sequenced = |i: usize, s: i64| {
        let mut r = run(i);
        r.supersede = Supersede::Pending;
        r.age.sequence = Some(s);
        r
    };
    w.runs.push(sequenced(0, 1 << 53));
    w.step(&[]);
    w.finish(0);
    w.step(&[]);
    assert!(w.holders().is_empty(), "pr0 is done");
    w.runs.push(sequenced(1, 41));
    let d = w.step(&[]);
    assert!(
        matches!(told(&d, "uid-1"), Outcome::Superseded { .. }),
        "stale: {:?}",
        told(&d, "uid-1")
    );
    w.runs[1].phase = Phase::Done { superseded: true };
    let missing = w.step(&[forget("f0", "nope")]);
    assert_eq!(
        missing.status.observed_requests[0].verdict,
        Verdict::Refused
    );
    w.step(&[forget("f1", "deploy")]);
    assert_eq!(w.ack("f1").verdict, Verdict::Done, "{:?}", w.ack("f1"));
    assert!(w.status.groups.is_empty(), "{:?}", w.status.groups);
    assert_eq!(
        w.status.forgotten_marks.len(),
        1,
        "kept: pr0 still shows its grant"
    );
    w.runs.push(sequenced(2, 42));
    let d = w.step(&[]);
    assert!(
        matches!(told(&d, "uid-2"), Outcome::Acquired { .. }),
        "{:?}",
        told(&d, "uid-2")
    );
    let marks: Vec<_> = w.status.groups.iter().map(|m| m.newest.sequence).collect();
    assert_eq!(marks, [Some(42)], "the mark is pr2's, not pr0's again");
    // Once pr0's run is gone, nothing can raise its mark: the record goes too.
    w.runs.remove(0);
    w.step(&[]);
    assert!(w.status.forgotten_marks.is_empty());
}
