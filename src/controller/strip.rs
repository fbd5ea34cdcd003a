//! What the caches keep: only what the controller reads. Applied to each object
//! as the watch delivers it, before it is cached, so that a cluster's history of
//! runs and PipelineRuns costs little memory. (The typed structs already drop
//! every field they do not name: pipelineSpec, taskRunTemplate, ...)

use super::section::PIPELINE_TASK_LABEL;
use crate::observe::{Observe, PIPELINE_LABEL, PIPELINE_RUN_LABEL, PIPELINE_RUN_UID_LABEL};
use crate::tekton::customrun::CustomRun;
use crate::tekton::pipelinerun::PipelineRun;
use crate::tekton::run::Run;
use kube::api::ObjectMeta;

/// The labels the controller reads; Tekton and users put many more on runs.
const READ_LABELS: &[&str] = &[
    PIPELINE_LABEL,
    PIPELINE_RUN_LABEL,
    PIPELINE_RUN_UID_LABEL,
    PIPELINE_TASK_LABEL,
];

/// Never read: who wrote which field, annotations (kubectl's
/// last-applied-configuration alone is a copy of the whole object), labels
/// other than Tekton's own.
fn meta(m: &mut ObjectMeta) {
    m.managed_fields = None;
    m.annotations = None;
    if let Some(labels) = &mut m.labels {
        labels.retain(|k, _| READ_LABELS.contains(&k.as_str()));
    }
}

/// A PipelineRun keeps its state and the runs it lists: its custom runs verify
/// a lock run's parent, its TaskRuns tell when a `release-after` section is done.
/// A done one (most of a cluster's history) runs nothing more: its state and
/// its custom runs are all that is read of it.
pub fn pipeline_run(pr: &mut PipelineRun) {
    meta(&mut pr.metadata);
    pr.metadata.owner_references = None;
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

/// Is it a run of ours: of a Mutex, or of a ClusterMutex?
fn ours<K: Observe>(r: &K) -> bool {
    let o = r.observe();
    o.is_mutex() || crate::cluster_mutex::target(&o).is_some()
}

/// Another custom task's run keeps only its identity: the controller never acts on it.
pub fn custom_run(cr: &mut CustomRun) {
    meta(&mut cr.metadata);
    if !ours(cr) {
        cr.spec.params.clear();
        cr.spec.custom_spec = None;
        cr.status = None;
    }
}

pub fn run(r: &mut Run) {
    meta(&mut r.metadata);
    if !ours(r) {
        r.spec.params.clear();
        r.spec.spec = None;
        r.status = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let before = cr.clone();
        custom_run(&mut cr);
        assert_eq!(cr.metadata.managed_fields, None);
        assert_eq!(cr.metadata.annotations, None);
        assert_eq!((&cr.spec, &cr.status), (&before.spec, &before.status));
        assert!(cr.observe().config().is_ok());
    }

    #[test]
    fn a_cluster_mutex_run_keeps_what_the_controller_reads() {
        let mut cr = custom_run_of("ClusterMutex");
        let before = cr.clone();
        custom_run(&mut cr);
        assert_eq!((&cr.spec, &cr.status), (&before.spec, &before.status));
    }

    #[test]
    fn only_the_labels_the_controller_reads_are_kept() {
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
        let kept: Vec<&str> = cr.labels().keys().map(String::as_str).collect();
        assert_eq!(kept, [PIPELINE_RUN_LABEL, PIPELINE_TASK_LABEL]);
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
