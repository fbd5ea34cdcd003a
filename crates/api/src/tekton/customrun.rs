//! `tekton.dev/v1beta1` CustomRun: how Tekton asks a custom task controller to run.

use super::labels::KeptLabels;
use super::{EmbeddedSpec, Param, RunStatus, TaskRef};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "tekton.dev",
    version = "v1beta1",
    kind = "CustomRun",
    namespaced
)]
#[kube(status = "RunStatus", schema = "disabled")]
#[serde(rename_all = "camelCase")]
pub struct CustomRunSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_ref: Option<TaskRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    /// Boxed: rare, and every cached run would carry its room.
    pub custom_spec: Option<Box<EmbeddedSpec>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<Param>,
    /// A Go duration string; absent means Tekton's default of 60m, `0s` means none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<i64>,
    /// `RunCancelled` when Tekton (or a person) cancels the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_message: Option<String>,
    /// Not part of the object: its labels once the cache has taken them out of
    /// the label map (None: read the map).
    #[serde(skip)]
    pub kept_labels: Option<KeptLabels>,
}
