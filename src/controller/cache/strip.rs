//! What the caches keep: only what the controller reads. Applied to each object
//! as the watch delivers it, before it is cached, so that a cluster's history of
//! runs and PipelineRuns costs little memory. (The typed structs already drop
//! every field they do not name: pipelineSpec, taskRunTemplate, ...)

use crate::core::observe::Observe;
use crate::core::run_status;
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::labels::KeptLabels;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use crate::model::tekton::{RunStatus, is_done};
use kube::api::ObjectMeta;

/// Never read: who wrote which field, annotations (kubectl's
/// last-applied-configuration alone is a copy of the whole object).
fn meta(m: &mut ObjectMeta) {
    m.managed_fields = None;
    m.annotations = None;
}

/// A PipelineRun keeps its state, the runs it lists (its custom runs verify a
/// lock run's parent, its TaskRuns tell when a `release-after` section is done)
/// and its Pipeline's name, outside its label map. A done one (most of a cluster's history) runs
/// nothing more: its state and its custom runs are all that is read of it.
pub fn pipeline_run(pr: &mut PipelineRun) {
    // Of its annotations, only ours: a PipelineRun queued as a whole is read from them.
    let ours = pr.metadata.annotations.take().map(|mut a| {
        a.retain(|k, _| k.starts_with(crate::core::params::annotations::PREFIX));
        a
    });
    meta(&mut pr.metadata);
    pr.metadata.annotations = ours.filter(|a| !a.is_empty());
    pr.metadata.owner_references = None;
    // Its Pipeline's name groups its runs that carry none. One not started yet (Pending, or
    // new) keeps its labels and params too: a lock's selector and keyFrom read them.
    let unstarted = pr.is_pending() || pr.status.is_none();
    let labels = unstarted.then(|| pr.metadata.labels.clone()).flatten();
    pr.spec.kept_labels = Some(KeptLabels::take(&mut pr.metadata));
    if unstarted {
        pr.metadata.labels = labels;
    } else {
        pr.spec.params = Vec::new();
    }
    if !pr.is_done() {
        return;
    }
    if let Some(status) = &mut pr.status {
        status
            .child_references
            .retain(|c| c.kind == "CustomRun" || c.kind == "Run");
        status.skipped_tasks = Vec::new();
        status.pipeline_spec = None;
        for c in &mut status.conditions {
            c.message = None;
            c.last_transition_time = None;
        }
    }
}

/// A run keeps the labels the controller reads, outside its label map.
/// Another custom task's run keeps only its identity: the controller never acts on it.
pub fn custom_run(cr: &mut CustomRun) {
    meta(&mut cr.metadata);
    cr.spec.kept_labels = Some(KeptLabels::take(&mut cr.metadata));
    if !cr.observe().is_ours() {
        cr.spec.params.clear();
        cr.spec.custom_spec = None;
        cr.status = None;
    } else if let Some(status) = &mut cr.status {
        done_run_status(status);
    }
}

pub fn run(r: &mut Run) {
    meta(&mut r.metadata);
    r.spec.kept_labels = Some(KeptLabels::take(&mut r.metadata));
    if !r.observe().is_ours() {
        r.spec.params.clear();
        r.spec.spec = None;
        r.status = None;
    } else if let Some(status) = &mut r.status {
        done_run_status(status);
    }
}

/// The results read back from a done run: its token, and each key's token
/// for a run of several keys (the lock state is rebuilt from them).
const READ_RESULTS: &[&str] = &[
    run_status::TOKEN_RESULT,
    crate::core::run_status::TOKENS_RESULT,
];

/// A done run of ours (most of a cluster's history) is never written again.
/// Of its status the controller reads how it ended (status and reason), its
/// fencing tokens, whether it was superseded (`extraFields`) and when it
/// started waiting; its messages, times and other results go.
fn done_run_status(status: &mut RunStatus) {
    if !is_done(status.succeeded()) {
        return;
    }
    for c in &mut status.conditions {
        c.message = None;
        c.last_transition_time = None;
    }
    status.completion_time = None;
    status
        .results
        .retain(|r| READ_RESULTS.contains(&r.name.as_str()));
    status.results.shrink_to_fit();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::run_status::TOKENS_RESULT;
    use crate::model::tekton::RunStatus;
    use crate::model::tekton::customrun::CustomRunSpec;
    use crate::model::tekton::labels::{PIPELINE_LABEL, PIPELINE_RUN_LABEL, PIPELINE_TASK_LABEL};
    use kube::ResourceExt;
    use serde_json::json;

    fn custom_run_of(kind: &str) -> CustomRun {
        serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
            "metadata": {"name": "r", "namespace": "ns",
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": kind},
                     "params": [{"name": "key", "value": "k"}]},
            "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_mutex_run_keeps_what_the_controller_reads() {
        let mut cr = custom_run_of("Mutex");
        let before = (cr.spec.clone(), cr.status.clone());
        custom_run(&mut cr);
        assert_eq!(cr.metadata.managed_fields, None);
        assert_eq!(cr.metadata.annotations, None);
        assert_eq!(without_kept_labels(&cr), before);
        assert!(cr.observe().config().is_ok());
    }

    #[test]
    fn a_cluster_mutex_run_keeps_what_the_controller_reads() {
        let mut cr = custom_run_of("ClusterMutex");
        let before = (cr.spec.clone(), cr.status.clone());
        custom_run(&mut cr);
        assert_eq!(without_kept_labels(&cr), before);
    }

    /// Its spec and status as they came (`custom_run_of` has no labels).
    fn without_kept_labels(cr: &CustomRun) -> (CustomRunSpec, Option<RunStatus>) {
        let mut spec = cr.spec.clone();
        spec.kept_labels = None;
        (spec, cr.status.clone())
    }

    #[test]
    fn a_done_run_keeps_how_it_ended_its_tokens_and_when_it_waited() {
        let mut cr = custom_run_of("Mutex");
        cr.status = serde_json::from_value(json!({
            "conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired",
                            "message": "acquired k with token 7", "lastTransitionTime": "2026-01-01T00:00:01Z"}],
            "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:00:01Z",
            "retriesStatus": [{"startTime": "2025-12-31T23:00:00Z"}],
            "results": [{"name": "acquired", "value": "true"}, {"name": "key", "value": "k"},
                        {"name": "token", "value": "7"}, {"name": "waited-seconds", "value": "0"},
                        {"name": "tokens", "value": "{\"a\":4,\"k\":7}"}],
            "extraFields": {"key": "k", "supersededBy": "r2"},
        }))
        .unwrap();
        let read = |cr: &CustomRun| {
            let o = cr.observe();
            let s = &o.status;
            (
                o.is_done(),
                run_status::acquired_token(s),
                s.result(TOKENS_RESULT).map(str::to_string),
                run_status::superseded(s),
                o.waiting_since(),
            )
        };
        let before = read(&cr);
        custom_run(&mut cr);
        assert_eq!(read(&cr), before);
        assert_eq!(before.1, Some(7));
        assert_eq!(before.2.as_deref(), Some(r#"{"a":4,"k":7}"#));
        let status = cr.status.as_ref().unwrap();
        assert_eq!(status.conditions[0].message, None);
        assert_eq!(
            (status.results.len(), status.completion_time.as_ref()),
            (2, None)
        );
    }

    #[test]
    fn a_live_run_keeps_its_whole_status() {
        let mut cr = custom_run_of("Mutex");
        cr.status.as_mut().unwrap().conditions[0].message = Some("waiting for k".into());
        let before = cr.status.clone();
        custom_run(&mut cr);
        assert_eq!(cr.status, before);
    }

    #[test]
    fn a_run_keeps_only_the_labels_the_controller_reads_out_of_its_label_map() {
        let mut cr = custom_run_of("Mutex");
        cr.metadata.labels = Some(
            [
                (PIPELINE_RUN_LABEL, "deploy-1"),
                (PIPELINE_TASK_LABEL, "lock"),
                ("tekton.dev/memberOf", "tasks"),
                ("app.kubernetes.io/part-of", "shop"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        custom_run(&mut cr);
        assert!(cr.labels().is_empty());
        assert_eq!(cr.label(PIPELINE_RUN_LABEL), Some("deploy-1"));
        assert_eq!(cr.label(PIPELINE_TASK_LABEL), Some("lock"));
        assert_eq!(cr.label(PIPELINE_LABEL), None);
    }

    #[test]
    fn a_pipeline_run_not_started_keeps_its_labels_and_params_for_selectors() {
        let mut pr: PipelineRun = serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": "p", "namespace": "ns", "labels": {"env": "staging"}},
            "spec": {"status": "PipelineRunPending",
                     "params": [{"name": "environment", "value": "staging"}]},
        }))
        .unwrap();
        pipeline_run(&mut pr);
        assert_eq!(pr.labels().get("env").map(String::as_str), Some("staging"));
        assert_eq!(pr.spec.params.len(), 1);
    }

    #[test]
    fn a_pipeline_run_running_or_done_keeps_its_pipeline_label_out_of_its_label_map() {
        let pr = |status: &str| -> PipelineRun {
            serde_json::from_value(json!({
                "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
                "metadata": {"name": "p", "namespace": "ns",
                             "labels": {PIPELINE_LABEL: "deploy", "app": "shop"}},
                "spec": {},
                "status": {"conditions": [{"type": "Succeeded", "status": status}]},
            }))
            .unwrap()
        };
        for mut pr in [pr("Unknown"), pr("True")] {
            assert_eq!(pr.label(PIPELINE_LABEL), Some("deploy"));
            pipeline_run(&mut pr);
            assert!(pr.labels().is_empty());
            assert_eq!(pr.label(PIPELINE_LABEL), Some("deploy"));
        }
    }

    #[test]
    fn another_custom_tasks_run_keeps_only_its_identity() {
        let mut cr = custom_run_of("Approval");
        custom_run(&mut cr);
        assert!(cr.spec.params.is_empty() && cr.status.is_none());
        assert!(!cr.observe().is_mutex());
    }

    #[test]
    fn a_done_pipeline_run_keeps_its_state_and_its_custom_runs() {
        let mut pr: PipelineRun = serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": "p", "namespace": "ns",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "x", "uid": "u"}]},
            "spec": {},
            "status": {"conditions": [{"type": "Succeeded", "status": "False", "reason": "Cancelled",
                                       "message": "PipelineRun \"p\" was cancelled"}],
                       "childReferences": [{"kind": "TaskRun", "name": "p-build"},
                                           {"kind": "CustomRun", "name": "p-lock"}],
                       "skippedTasks": [{"name": "notify"}],
                       "pipelineSpec": {"tasks": [{"name": "build"}, {"name": "lock"}]}},
        }))
        .unwrap();
        let before = (pr.is_done(), pr.stopping());
        pipeline_run(&mut pr);
        assert_eq!((pr.is_done(), pr.stopping()), before);
        assert!(pr.lists("CustomRun", "p-lock") && !pr.lists("TaskRun", "p-build"));
        let status = pr.status.as_ref().unwrap();
        assert!(status.pipeline_spec.is_none() && status.skipped_tasks.is_empty());
        assert_eq!(status.conditions[0].reason.as_deref(), Some("Cancelled"));
        assert!(pr.metadata.owner_references.is_none());
    }

    #[test]
    fn a_pipeline_run_keeps_its_state_and_its_runs() {
        let mut pr: PipelineRun = serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": "p", "namespace": "ns", "managedFields": [{"manager": "x"}]},
            "spec": {"status": "Cancelled", "pipelineSpec": {"tasks": []}},
            "status": {"conditions": [{"type": "Succeeded", "status": "Unknown"}],
                       "childReferences": [{"kind": "TaskRun", "name": "p-build"},
                                           {"kind": "CustomRun", "name": "p-lock"}]},
        }))
        .unwrap();
        pipeline_run(&mut pr);
        assert_eq!(pr.metadata.managed_fields, None);
        assert!(pr.lists("CustomRun", "p-lock") && pr.lists("TaskRun", "p-build"));
        assert!(pr.stop_requested());
        assert_eq!(pr.status.as_ref().unwrap().conditions.len(), 1);
    }
}
