//! `release-after`, pure: the param, the names against the pipeline, what is
//! left to look at, and that the decision core lets a finished section go.

use super::*;
use crate::model::{Outcome, Parent, Phase, RunView, Timeout};
use crate::params::CancelMode;
use jiff::Timestamp;
use serde_json::{Value, json};
use tekton_mutex_api::mutex::{Age, LockSpec, MutexStatus, RunKind, RunRef, Supersede};

fn pr(status: Value) -> PipelineRun {
    serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": "pr", "namespace": "ns", "uid": "pr-uid"},
        "spec": {}, "status": status,
    }))
    .unwrap()
}

fn resolved(extra: Value) -> PipelineRun {
    let mut status = json!({"pipelineSpec": {
        "tasks": [{"name": "lock"}, {"name": "deploy"}, {"name": "test"}],
        "finally": [{"name": "report"}],
    }});
    status
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    pr(status)
}

fn names(s: &str) -> Vec<String> {
    parse(s).unwrap()
}

#[test]
fn the_param_lists_task_names() {
    assert_eq!(names("deploy"), ["deploy"]);
    assert_eq!(names(" deploy , migrate,deploy"), ["deploy", "migrate"]);
    for bad in ["", "deploy,", "Deploy", "a b", &"x".repeat(64)] {
        let err = parse(bad).unwrap_err();
        assert!(
            err.contains("must list pipeline task names"),
            "{bad:?}: {err}"
        );
    }
}

#[test]
fn names_must_be_tasks_of_the_pipeline() {
    let p = resolved(json!({}));
    let invalid = |v: NamesCheck| match v {
        NamesCheck::Invalid(m) => m,
        other => panic!("{other:?}"),
    };
    let fine = check(&names("deploy,report"), Some("lock"), Some(&p));
    assert_eq!(fine, NamesCheck::Fine);
    let err = invalid(check(&names("deploy,deplyo"), Some("lock"), Some(&p)));
    assert!(err.contains("names deplyo not in the pipeline"), "{err}");
    assert!(
        err.contains("its tasks are lock, deploy, test, report"),
        "{err}"
    );
    let own = invalid(check(&names("lock"), Some("lock"), Some(&p)));
    assert!(own.contains("the lock task itself"), "{own}");
    let standalone = invalid(check(&names("deploy"), None, None));
    assert!(standalone.contains("this run has none"), "{standalone}");
    let unresolved = pr(json!({}));
    let not_yet = check(&names("deploy"), None, Some(&unresolved));
    assert_eq!(not_yet, NamesCheck::NotYet);
    assert_eq!(check(&[], None, None), NamesCheck::Fine);
}

#[test]
fn a_section_is_looked_at_once_every_task_ran_or_was_skipped() {
    let child = |task: &str, name: &str| json!({"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": name, "pipelineTaskName": task});
    let not_started = resolved(json!({"childReferences": [child("lock", "pr-lock")]}));
    assert_eq!(children(&not_started, &names("deploy")), None);
    let matrix = resolved(json!({"childReferences": [
        child("lock", "pr-lock"), child("deploy", "pr-deploy-0"), child("deploy", "pr-deploy-1"),
    ]}));
    let found: Vec<&str> = children(&matrix, &names("deploy"))
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(found, ["pr-deploy-0", "pr-deploy-1"]);
    assert_eq!(children(&matrix, &names("deploy,test")), None);
    let skipped = resolved(json!({
        "childReferences": [child("deploy", "pr-deploy")],
        "skippedTasks": [{"name": "test", "reason": "When Expressions evaluated to false"}],
    }));
    assert_eq!(children(&skipped, &names("deploy,test")).unwrap().len(), 1);
}

#[test]
fn only_a_running_pipeline_run_turns_section_done() {
    assert_eq!(state(ParentState::Running, true), ParentState::SectionDone);
    assert_eq!(
        state(ParentState::StopRequested, true),
        ParentState::SectionDone
    );
    assert_eq!(state(ParentState::Running, false), ParentState::Running);
    for s in [ParentState::Draining, ParentState::Done, ParentState::Gone] {
        assert_eq!(state(s, true), s, "the end of the PipelineRun rules");
    }
}

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

fn run(i: i64, state: ParentState) -> RunView {
    RunView {
        run: RunRef {
            kind: RunKind::CustomRun,
            name: format!("pr{i}-lock"),
            uid: format!("uid-{i}"),
        },
        parent: Some(Parent {
            name: format!("pr{i}"),
            uid: format!("pr{i}-uid"),
            state,
        }),
        group: format!("g{i}"),
        age: Age {
            sequence: None,
            created: t(i),
            name: format!("pr{i}"),
        },
        priority: 0,
        supersede: Supersede::None,
        cancel_mode: CancelMode::default(),
        wait: true,
        waiting_since: t(i),
        cancel_message: None,
        phase: Phase::Live {
            cancel_requested: false,
            timeout: Timeout::NotYet,
        },
        acquired_token: None,
        started: false,
    }
}

#[test]
fn a_done_section_hands_the_slot_over_and_is_not_rebuilt() {
    let spec = LockSpec::default();
    let runs = [run(1, ParentState::Running), run(2, ParentState::Running)];
    let d = crate::decide::test_entry::decide(&spec, &MutexStatus::default(), &runs, t(5));
    assert_eq!(d.status.holders.len(), 1);
    // pr1 was told Acquired (its run is done), its section then ended.
    let mut holder = run(1, ParentState::SectionDone);
    holder.phase = Phase::Done { superseded: false };
    holder.acquired_token = Some(1);
    let runs = [holder.clone(), run(2, ParentState::Running)];
    let d = crate::decide::test_entry::decide(&spec, &d.status, &runs, t(6));
    let holding: Vec<&str> = d
        .status
        .holders
        .iter()
        .map(|h| h.run.name.as_str())
        .collect();
    assert_eq!(holding, ["pr2-lock"]);
    let granted = d.outcomes.iter().find(|(r, _)| r.name == "pr2-lock");
    assert!(matches!(
        granted,
        Some((_, Outcome::Acquired { token: 2, .. }))
    ));
    // Its token is not held again, even if the status is lost.
    let d = crate::decide::test_entry::decide(&spec, &MutexStatus::default(), &[holder], t(7));
    assert!(d.status.holders.is_empty());
    assert_eq!(d.status.last_token, 1);
}
