//! Vendored Tekton bindings: our own Rust types for the subset of Tekton we use.
//!
//! Only the fields the controller reads are modelled. The controller never
//! writes these types back whole: every write is a patch of the fields it owns,
//! so fields we do not model survive untouched.

pub mod customrun;
pub mod labels;
pub mod pipelinerun;
pub mod run;
pub mod taskrun;

use serde::{Deserialize, Serialize};

/// A knative-style condition, as Tekton uses them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// A param as Tekton sends it: the value may be a string, an array or an object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Param {
    pub name: String,
    pub value: serde_json::Value,
}

/// The status shared by CustomRun (v1beta1) and Run (v1alpha1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retries_status: Vec<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<RunResult>,
    /// Schemaless: where a custom task controller keeps fields of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_fields: Option<serde_json::Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub name: String,
    pub value: String,
}

impl RunStatus {
    /// The `Succeeded` condition, the one Tekton and tkn read.
    pub fn succeeded(&self) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == "Succeeded")
    }

    pub fn result(&self, name: &str) -> Option<&str> {
        self.results
            .iter()
            .find(|r| r.name == name)
            .map(|r| r.value.as_str())
    }
}

/// Is this condition final (True or False)?
pub fn is_done(cond: Option<&Condition>) -> bool {
    cond.is_some_and(|c| c.status == "True" || c.status == "False")
}

/// The spec a run embeds instead of referencing an object (`customSpec` / `spec.spec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EmbeddedSpec {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<serde_json::Value>,
}

/// A reference to the custom task (`customRef` / `spec.ref`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRef {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Value of `spec.status` that asks a CustomRun or Run to cancel.
pub const RUN_CANCELLED: &str = "RunCancelled";
