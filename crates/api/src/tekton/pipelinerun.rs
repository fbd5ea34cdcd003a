//! `tekton.dev/v1` PipelineRun: the parent whose lifetime bounds a held slot.

use super::Condition;
use super::labels::{KeptLabels, kept_label};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Tekton's reason while a PipelineRun with a failed task waits for the running ones.
const STOPPING: &str = "PipelineRunStopping";
/// `spec.status` of a PipelineRun created to wait: Tekton starts it (and its timeout) once cleared.
pub const PENDING: &str = "PipelineRunPending";

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(group = "tekton.dev", version = "v1", kind = "PipelineRun", namespaced)]
#[kube(status = "PipelineRunStatus", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct PipelineRunSpec {
    /// `Cancelled`, `CancelledRunFinally`, `StoppedRunFinally` or `PipelineRunPending`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// The Pipeline it runs, if by reference: a PipelineRun that has not started
    /// has no `tekton.dev/pipeline` label yet, and its supersede group is this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_ref: Option<PipelineRef>,
    /// Its params: a Mutex's `spec.keyFrom` may read its key from one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<crate::tekton::Param>,
    /// Not part of the object: its labels once the cache has taken them out of
    /// the label map (None: read the map).
    #[serde(skip)]
    pub kept_labels: Option<KeptLabels>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PipelineRunStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// The runs Tekton created for it: the only proof that a run is its child
    /// (an ownerReference can be written by anyone who may create runs).
    #[serde(default)]
    pub child_references: Vec<ChildReference>,
    /// Pipeline tasks Tekton decided not to run (`release-after` counts them as done).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped_tasks: Vec<TaskName>,
    /// The pipeline as resolved, only its task names (`release-after` checks them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: a done PipelineRun's is dropped, and every cached one would carry its room.
    pub pipeline_spec: Option<Box<PipelineTaskNames>>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A remote Pipeline (git, bundles, hub, cluster, ...): the resolver and its params.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolver: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<crate::tekton::Param>,
}

/// Anything with a `name`: a skipped task, a pipeline task.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskName {
    #[serde(default)]
    pub name: String,
}

/// The task names of a resolved pipeline spec.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PipelineTaskNames {
    #[serde(default)]
    pub tasks: Vec<TaskName>,
    #[serde(default)]
    pub finally: Vec<TaskName>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ChildReference {
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    /// The pipeline task it runs (several children share one under a matrix).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pipeline_task_name: String,
}

impl PipelineRun {
    /// One of the labels the controller reads (`tekton::labels`).
    pub fn label(&self, name: &str) -> Option<&str> {
        kept_label(&self.spec.kept_labels, &self.metadata, name)
    }

    /// Done means the Succeeded condition is final: Tekton sets it only after
    /// finally tasks have finished, so a done PipelineRun runs nothing more.
    pub fn is_done(&self) -> bool {
        super::is_done(self.succeeded())
    }

    /// Has someone asked this PipelineRun to stop (any graceful or hard cancel)?
    pub fn stop_requested(&self) -> bool {
        matches!(
            self.spec.status.as_deref(),
            Some(
                "Cancelled" | "CancelledRunFinally" | "StoppedRunFinally" | "PipelineRunCancelled"
            )
        )
    }

    /// Created to wait, and not started yet.
    pub fn is_pending(&self) -> bool {
        self.spec.status.as_deref() == Some(PENDING)
    }

    /// Is it on its way out: asked to stop, or `PipelineRunStopping` because a
    /// task failed and Tekton schedules nothing new?
    pub fn stopping(&self) -> bool {
        self.stop_requested()
            || self.succeeded().and_then(|c| c.reason.as_deref()) == Some(STOPPING)
    }

    /// Does its status list this run (of kind `CustomRun` or `Run`) as its child?
    pub fn lists(&self, kind: &str, name: &str) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.child_references
                .iter()
                .any(|c| c.kind == kind && c.name == name)
        })
    }

    fn succeeded(&self) -> Option<&Condition> {
        self.status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Succeeded"))
    }
}
