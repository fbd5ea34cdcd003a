//! The pure part of reading a run: age, group, deadline, timeout and parent state.

use super::*;
use crate::observe::Observe;
use serde_json::{Value, json};
use tekton_mutex_api::tekton::customrun::CustomRun;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).unwrap()
}

fn ts(secs: i64) -> String {
    t(secs).to_string()
}

/// A lock run created at second 10, owned by PipelineRun `pr` unless `owned` is false.
fn custom_run(owned: bool, spec: Value, status: Value) -> CustomRun {
    let mut meta = json!({
        "name": "pr-lock", "namespace": "ns", "uid": "run-uid",
        "creationTimestamp": ts(10),
    });
    if owned {
        meta["ownerReferences"] = json!([{
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": "pr",
            "uid": "pr-uid", "controller": true,
        }]);
    }
    let mut full =
        json!({"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"}});
    full.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
        "metadata": meta, "spec": full, "status": status,
    }))
    .unwrap()
}

/// PipelineRun `pr`; unless `status` says otherwise, it lists `pr-lock` as its child.
fn pipeline_run(labels: Value, spec: Value, mut status: Value) -> PipelineRun {
    if let Some(s) = status.as_object_mut() {
        s.entry("childReferences").or_insert(json!([{
            "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun", "name": "pr-lock",
            "pipelineTaskName": "lock",
        }]));
    }
    serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": "pr", "namespace": "ns", "uid": "pr-uid",
                     "creationTimestamp": ts(2), "labels": labels},
        "spec": spec, "status": status,
    }))
    .unwrap()
}

fn view_of(cr: &CustomRun, pr: Option<&PipelineRun>, now: i64) -> MemberView {
    let o = cr.observe();
    let cfg = o.config().unwrap();
    let parent = o.parent.as_ref().map(|(name, uid)| FetchedParent {
        name,
        uid,
        object: pr,
        pods_alive: false,
        section_done: false,
    });
    member_view(&o, &cfg, parent, t(now))
}

#[test]
fn age_is_the_pipelineruns_and_a_standalone_runs_own() {
    let pr = pipeline_run(json!({}), json!({}), json!({}));
    let cr = custom_run(
        true,
        json!({"params": [{"name": "sequence", "value": "81"}]}),
        json!({}),
    );
    let v = view_of(&cr, Some(&pr), 20).view;
    assert_eq!(v.age.created, t(2), "the PipelineRun's creation time");
    assert_eq!(v.age.name, "pr");
    assert_eq!(v.age.sequence, Some(81));
    // A PipelineRun that is gone: the run's own creation time, the parent's name.
    let v = view_of(&cr, None, 20).view;
    assert_eq!((v.age.created, v.age.name.as_str()), (t(10), "pr"));
    let lone = custom_run(false, json!({}), json!({}));
    let v = view_of(&lone, None, 20).view;
    assert_eq!((v.age.created, v.age.name.as_str()), (t(10), "pr-lock"));
    assert_eq!(v.parent, None);
}

#[test]
fn group_falls_back_from_param_to_pipeline_label_to_name() {
    let labelled = pipeline_run(
        json!({"tekton.dev/pipeline": "promote"}),
        json!({}),
        json!({}),
    );
    let unlabelled = pipeline_run(json!({}), json!({}), json!({}));
    let param = json!({"params": [{"name": "group", "value": "envs"}]});
    assert_eq!(
        view_of(&custom_run(true, param, json!({})), Some(&labelled), 20)
            .view
            .group,
        "envs"
    );
    let plain = custom_run(true, json!({}), json!({}));
    assert_eq!(view_of(&plain, Some(&labelled), 20).view.group, "promote");
    assert_eq!(view_of(&plain, Some(&unlabelled), 20).view.group, "pr");
    let mut own_label = plain.clone();
    own_label.metadata.labels = Some([(PIPELINE_LABEL.into(), "from-run".into())].into());
    assert_eq!(
        view_of(&own_label, Some(&labelled), 20).view.group,
        "from-run"
    );
}

#[test]
fn deadline_counts_from_the_attempt_start_and_zero_means_none() {
    let pr = pipeline_run(json!({}), json!({}), json!({}));
    let started = json!({"startTime": ts(30)});
    let cr = custom_run(true, json!({"timeout": "1m"}), started.clone());
    assert_eq!(view_of(&cr, Some(&pr), 40).deadline, Some(t(90)));
    let unstarted = custom_run(true, json!({"timeout": "1m"}), json!({}));
    assert_eq!(
        view_of(&unstarted, Some(&pr), 40).deadline,
        Some(t(70)),
        "from creation until it has a start time"
    );
    let unset = custom_run(true, json!({}), started.clone());
    assert_eq!(
        view_of(&unset, Some(&pr), 40).deadline,
        None,
        "the PipelineRun's own timeouts bound the wait"
    );
    let lone = custom_run(false, json!({}), started.clone());
    assert_eq!(
        view_of(&lone, None, 40).deadline,
        Some(t(30 + 3600)),
        "a standalone run gets Tekton's default of 1h"
    );
    let forever = custom_run(true, json!({"timeout": "0s"}), started);
    assert_eq!(view_of(&forever, Some(&pr), 40).deadline, None);
    let huge = custom_run(true, json!({"timeout": "4000000000000000h"}), json!({}));
    assert_eq!(view_of(&huge, Some(&pr), 40).deadline, None);
}

#[test]
fn timeout_is_a_retry_while_attempts_remain() {
    assert_eq!(timeout(Some(t(5)), 0, 1, t(4)), Timeout::NotYet);
    assert_eq!(timeout(Some(t(5)), 0, 1, t(5)), Timeout::Retry);
    assert_eq!(timeout(Some(t(5)), 1, 1, t(6)), Timeout::Final);
    assert_eq!(timeout(Some(t(5)), 0, 0, t(6)), Timeout::Final);
    assert_eq!(timeout(None, 0, 0, t(1_000_000)), Timeout::NotYet);
    let pr = pipeline_run(json!({}), json!({}), json!({}));
    let cr = custom_run(
        true,
        json!({"timeout": "1m", "retries": 1, "status": "RunCancelled"}),
        json!({"startTime": ts(0), "retriesStatus": [{}]}),
    );
    assert_eq!(
        view_of(&cr, Some(&pr), 61).view.phase,
        Phase::Live {
            cancel_requested: true,
            timeout: Timeout::Final
        }
    );
}

#[test]
fn a_final_condition_is_done() {
    let pr = pipeline_run(json!({}), json!({}), json!({}));
    let done =
        json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}]});
    let cr = custom_run(true, json!({}), done);
    assert!(matches!(
        view_of(&cr, Some(&pr), 20).view.phase,
        Phase::Done { .. }
    ));
}

#[test]
fn parent_state_from_the_fetched_pipelinerun() {
    let running = pipeline_run(json!({}), json!({}), json!({}));
    let stopping = pipeline_run(
        json!({}),
        json!({"status": "CancelledRunFinally"}),
        json!({}),
    );
    let done = pipeline_run(
        json!({}),
        json!({"status": "CancelledRunFinally"}),
        json!({"conditions": [{"type": "Succeeded", "status": "False", "reason": "Cancelled"}]}),
    );
    let failing = pipeline_run(
        json!({}),
        json!({}),
        json!({"conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "PipelineRunStopping"}]}),
    );
    assert_eq!(parent_state(Some(&running), false), ParentState::Running);
    assert_eq!(
        parent_state(Some(&stopping), false),
        ParentState::StopRequested
    );
    assert_eq!(
        parent_state(Some(&failing), false),
        ParentState::StopRequested
    );
    assert_eq!(parent_state(Some(&done), false), ParentState::Done);
    assert_eq!(parent_state(None, false), ParentState::Gone);
}

#[test]
fn an_ended_pipelinerun_with_a_live_pod_is_draining() {
    let done = pipeline_run(
        json!({}),
        json!({"status": "Cancelled"}),
        json!({"conditions": [{"type": "Succeeded", "status": "False", "reason": "Cancelled"}]}),
    );
    assert_eq!(parent_state(Some(&done), true), ParentState::Draining);
    assert_eq!(parent_state(None, true), ParentState::Draining);
    // A live pod of a running PipelineRun is just its work.
    let running = pipeline_run(json!({}), json!({}), json!({}));
    assert_eq!(parent_state(Some(&running), true), ParentState::Running);
}

#[test]
fn waiting_counts_from_the_first_attempt_and_a_cancel_says_why() {
    let pr = pipeline_run(json!({}), json!({}), json!({}));
    let unstarted = custom_run(true, json!({}), json!({}));
    assert_eq!(view_of(&unstarted, Some(&pr), 40).view.waiting_since, t(10));
    let retried = custom_run(
        true,
        json!({"status": "RunCancelled",
               "statusMessage": "CustomRun cancelled as the PipelineRun it belongs to has timed out."}),
        json!({"startTime": ts(70), "retriesStatus": [{"startTime": ts(15)}]}),
    );
    let v = view_of(&retried, Some(&pr), 80).view;
    assert_eq!(
        v.waiting_since,
        t(15),
        "not the PipelineRun's creation, not the retry"
    );
    assert_eq!(
        v.cancel_message.as_deref(),
        Some("CustomRun cancelled as the PipelineRun it belongs to has timed out.")
    );
}

#[test]
fn a_run_marked_superseded_is_done_superseded() {
    let pr = pipeline_run(json!({}), json!({}), json!({}));
    let marked = custom_run(
        true,
        json!({}),
        json!({"conditions": [{"type": "Succeeded", "status": "False", "reason": "CustomRunCancelled",
                               "message": "Superseded: newer PipelineRun b (group g) holds or waits for k"}],
               "extraFields": {"key": "k", "supersededBy": "b"}}),
    );
    assert_eq!(
        view_of(&marked, Some(&pr), 20).view.phase,
        Phase::Done { superseded: true }
    );
    let cancelled = custom_run(
        true,
        json!({}),
        json!({"conditions": [{"type": "Succeeded", "status": "False", "reason": "CustomRunCancelled"}],
               "extraFields": {"key": "k"}}),
    );
    assert_eq!(
        view_of(&cancelled, Some(&pr), 20).view.phase,
        Phase::Done { superseded: false }
    );
}

#[test]
fn a_run_its_pipelinerun_does_not_list_is_unlisted() {
    let cr = custom_run(true, json!({}), json!({}));
    let listed = pipeline_run(json!({}), json!({}), json!({}));
    assert!(matches!(
        view_of(&cr, Some(&listed), 20).view.phase,
        Phase::Live { .. }
    ));
    for children in [
        json!([]),
        json!([{"kind": "CustomRun", "name": "other-lock"}]),
        json!([{"kind": "TaskRun", "name": "pr-lock"}]),
    ] {
        let pr = pipeline_run(json!({}), json!({}), json!({"childReferences": children}));
        assert_eq!(
            view_of(&cr, Some(&pr), 20).view.phase,
            Phase::Unlisted,
            "{children}"
        );
    }
    // Unlisted wins over a status the run claims for itself.
    let done = custom_run(
        true,
        json!({}),
        json!({"conditions": [{"type": "Succeeded", "status": "False", "reason": "Superseded"}]}),
    );
    let pr = pipeline_run(json!({}), json!({}), json!({"childReferences": []}));
    assert_eq!(view_of(&done, Some(&pr), 20).view.phase, Phase::Unlisted);
    // A PipelineRun that is gone cannot vouch either way: the run just leaves.
    assert!(matches!(
        view_of(&cr, None, 20).view.phase,
        Phase::Live { .. }
    ));
}
