//! `tekton.dev/v1alpha1` Run: the older custom task protocol (Tekton before v0.47).

use super::labels::KeptLabels;
use super::{EmbeddedSpec, Param, RunStatus, TaskRef};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(group = "tekton.dev", version = "v1alpha1", kind = "Run", namespaced)]
#[kube(status = "RunStatus", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct RunSpec {
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub task_ref: Option<TaskRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: rare, and every cached run would carry its room.
    pub spec: Option<Box<EmbeddedSpec>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<Param>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// Not part of the object: its labels once the cache has taken them out of
    /// the label map (None: read the map).
    #[serde(skip)]
    pub kept_labels: Option<KeptLabels>,
}
