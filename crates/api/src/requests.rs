//! The queue-control records a lock's status keeps: the requests it acted on
//! ([`ObservedRequest`]) and the PipelineRuns a person let go ([`Dismissed`]).
//! The request protocol itself is `tekton_mutex_core::requests`.

use jiff::Timestamp;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Take the slot from a holder and cancel its PipelineRun (needs `force`).
    Release,
    /// Fail every waiter with reason `Cleared`.
    Clear,
    /// Move one waiter to the front of the queue, once.
    Promote,
    /// Drop a supersede group's mark, so that its runs are no longer judged
    /// stale against it (say, a mark raised by a mistyped `sequence`).
    Forget,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Release => "release",
            Action::Clear => "clear",
            Action::Promote => "promote",
            Action::Forget => "forget",
        }
    }
}

/// How the controller answered a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Verdict {
    Done,
    /// Nothing changed: the message says why.
    Refused,
}

/// A request the controller has acted on: the acknowledgement the CLI waits for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedRequest {
    /// The request's id: its annotation was `request.tekton-mutex.dev/<id>`.
    pub id: String,
    /// release, clear, promote or forget; absent for an unreadable request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Who asked, as the client reported it.
    #[serde(default)]
    pub by: String,
    pub verdict: Verdict,
    /// What was done, or why nothing was.
    pub message: String,
    /// When the controller acted on it.
    pub at: Timestamp,
}

/// Why a PipelineRun was let go by a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Dismissal {
    /// Its hold was released (`tkn mutex release --force`).
    Released,
    /// The queue it waited in was cleared (`tkn mutex clear`).
    Cleared,
}

/// A PipelineRun (or standalone run) a person let go. Kept while anything of
/// it can still run, so that it neither re-enters the queue nor is rebuilt as
/// a holder from its `Acquired` status, and its cancel is redone after a crash.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Dismissed {
    /// The PipelineRun let go; absent for a standalone run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run: Option<String>,
    /// The PipelineRun's uid, or the run's own for a standalone run.
    pub uid: String,
    pub dismissal: Dismissal,
    /// What its lock runs are told (and its PipelineRun's annotation says).
    pub message: String,
    /// Leave its PipelineRun running (clear --keep-pipelineruns).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_pipeline_run: bool,
}
