//! `tekton.dev/v1` TaskRun: only whether it is done (`release-after` waits for it).

use super::Condition;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(group = "tekton.dev", version = "v1", kind = "TaskRun", namespaced)]
#[kube(status = "TaskRunStatus", schema = "disabled")]
pub struct TaskRunSpec {}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskRunStatus {
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

impl TaskRun {
    /// Final: succeeded or failed (retries included, as Tekton retries in place).
    pub fn is_done(&self) -> bool {
        let cond = self
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Succeeded"));
        super::is_done(cond)
    }
}
