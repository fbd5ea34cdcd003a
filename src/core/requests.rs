//! Queue control by people (`tkn mutex`): the requests the CLI writes on a
//! Mutex and the records the controller keeps of them in its status.
//!
//! A freeze is a spec field (`spec.frozen`), so GitOps can set it too. A
//! release, clear or promote is a one-off request: an annotation
//! `request.tekton-mutex.dev/<id>` whose value is the request as JSON. The
//! controller checks it against the lock state, does it or refuses it,
//! records the outcome in `status.observedRequests` (the last
//! [`MAX_OBSERVED_REQUESTS`]) and then removes the annotation. The CLI never
//! writes the status: the Mutex's RBAC decides who may ask, and the
//! controller stays the only writer of lock state.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The annotation prefix of a request; the rest of the key is its id.
pub const REQUEST_PREFIX: &str = "request.tekton-mutex.dev/";
/// How many acknowledged requests a status remembers (most recent last).
pub const MAX_OBSERVED_REQUESTS: usize = 20;
/// On a PipelineRun cancelled because its hold was released: who did it and why.
pub const RELEASED_BY_ANNOTATION: &str = "tekton-mutex.dev/released-by";
/// On a PipelineRun cancelled because the queue it waited in was cleared.
pub const CLEARED_BY_ANNOTATION: &str = "tekton-mutex.dev/cleared-by";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Take the slot from a holder and cancel its PipelineRun (needs `force`).
    Release,
    /// Fail every waiter with reason `Cleared`.
    Clear,
    /// Move one waiter to the front of the queue, once.
    Promote,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Release => "release",
            Action::Clear => "clear",
            Action::Promote => "promote",
        }
    }
}

/// A request, as the annotation value says it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    /// The annotation key's suffix (not part of the value).
    #[serde(skip)]
    pub id: String,
    pub action: Action,
    /// The PipelineRun (or standalone run) a release or promote is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline_run: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Who asked, as the client reported it (from a SelfSubjectReview).
    #[serde(default)]
    pub by: String,
    /// A release takes a slot someone holds: it must say so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
    /// Clear: leave the waiters' PipelineRuns running.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_pipeline_runs: bool,
}

impl Request {
    /// The annotation that carries this request.
    pub fn annotation(&self) -> (String, String) {
        let value = serde_json::to_string(self).expect("a request always serializes");
        (format!("{REQUEST_PREFIX}{}", self.id), value)
    }
}

/// A fresh request id: time-ordered, unique enough for one Mutex, and valid as
/// the name part of an annotation key.
pub fn new_id(now: DateTime<Utc>, nonce: u32) -> String {
    format!("{}-{:08x}", now.format("%Y%m%dt%H%M%S%3f"), nonce)
}

/// The requests on a Mutex, oldest id first; an unreadable one is kept as an error
/// so that it is refused (and removed) rather than ignored.
pub fn requests_from(annotations: &BTreeMap<String, String>) -> Vec<Result<Request, Unreadable>> {
    annotations
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(REQUEST_PREFIX)?, v)))
        .map(|(id, v)| match serde_json::from_str::<Request>(v) {
            Ok(r) => Ok(Request { id: id.into(), ..r }),
            Err(e) => Err(Unreadable {
                id: id.into(),
                error: e.to_string(),
            }),
        })
        .collect()
}

/// A request annotation whose value is not a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    pub id: String,
    pub error: String,
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
    pub id: String,
    /// release, clear or promote; absent for an unreadable request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// Who asked, as the client reported it.
    #[serde(default)]
    pub by: String,
    pub verdict: Verdict,
    pub message: String,
    pub at: DateTime<Utc>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_through_its_annotation() {
        let r = Request {
            id: new_id(Utc::now(), 0xabc),
            action: Action::Release,
            pipeline_run: Some("deploy-1".into()),
            reason: Some("hung in finally".into()),
            by: "alice".into(),
            force: true,
            keep_pipeline_runs: false,
        };
        let (k, v) = r.annotation();
        assert!(k.starts_with(REQUEST_PREFIX));
        let name = k.strip_prefix(REQUEST_PREFIX).unwrap();
        assert!(name.len() <= 63 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        let read = requests_from(&[(k, v), ("other".into(), "x".into())].into());
        assert_eq!(read, vec![Ok(r)]);
    }

    #[test]
    fn an_unreadable_request_is_kept_as_an_error() {
        let read = requests_from(&[(format!("{REQUEST_PREFIX}x"), "{".into())].into());
        assert!(matches!(&read[..], [Err(Unreadable { id, .. })] if id == "x"));
    }
}
