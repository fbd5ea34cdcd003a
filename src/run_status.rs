//! What a run's status says for each outcome, as a merge patch of the fields
//! this controller owns. Pure: the caller supplies the current status and time.

use crate::decide::Outcome;
use crate::mutex::RunKind;
use crate::tekton::{Condition, RunStatus};
use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{Value, json};

/// Every reason this controller writes on a run's `Succeeded` condition. The
/// cancel and timeout reasons are Tekton's own, which Tekton reads back: a
/// PipelineRun counts a custom task as cancelled only with the cancel reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Waiting,
    Acquired,
    NotAcquired,
    InvalidParams,
    Superseded,
    Cancelled(RunKind),
    TimedOut(RunKind),
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Waiting => "Waiting",
            Reason::Acquired => "Acquired",
            Reason::NotAcquired => "NotAcquired",
            Reason::InvalidParams => "InvalidParams",
            Reason::Superseded => "Superseded",
            Reason::Cancelled(RunKind::CustomRun) => "CustomRunCancelled",
            Reason::Cancelled(RunKind::Run) => "RunCancelled",
            Reason::TimedOut(RunKind::CustomRun) => "CustomRunTimedOut",
            Reason::TimedOut(RunKind::Run) => "RunTimedOut",
        }
    }

    /// The condition status this reason goes with.
    pub fn status(self) -> &'static str {
        match self {
            Reason::Waiting => "Unknown",
            Reason::Acquired | Reason::NotAcquired => "True",
            Reason::InvalidParams
            | Reason::Superseded
            | Reason::Cancelled(_)
            | Reason::TimedOut(_) => "False",
        }
    }
}

/// The Succeeded condition an outcome calls for: its reason and message.
pub fn condition(kind: RunKind, key: &str, outcome: &Outcome) -> (Reason, String) {
    match outcome {
        Outcome::Waiting {
            position,
            of,
            holders,
            ..
        } => (
            Reason::Waiting,
            format!(
                "waiting for {key}: held by {} (position {position} of {of})",
                holders_text(holders)
            ),
        ),
        Outcome::Acquired {
            token,
            waited_seconds,
        } => (
            Reason::Acquired,
            format!("acquired {key} with token {token} after waiting {waited_seconds}s"),
        ),
        Outcome::NotAcquired { holders } => (
            Reason::NotAcquired,
            format!(
                "{key} is held by {}; not waiting because wait is \"false\"",
                holders_text(holders)
            ),
        ),
        Outcome::Superseded { by } => (
            Reason::Superseded,
            format!("superseded by newer PipelineRun {by} on {key}"),
        ),
        Outcome::Cancelled { why } => (
            Reason::Cancelled(kind),
            format!("left the queue for {key}: {why}"),
        ),
        Outcome::TimedOut => (
            Reason::TimedOut(kind),
            format!("timed out waiting for {key}"),
        ),
    }
}

fn holders_text(holders: &[String]) -> String {
    if holders.is_empty() {
        "nobody".into()
    } else {
        holders.join(", ")
    }
}

fn results(key: &str, outcome: &Outcome) -> Option<Value> {
    let r = |token: String, waited: String, acquired: &str| {
        json!([
            {"name": "acquired", "value": acquired},
            {"name": "key", "value": key},
            {"name": "token", "value": token},
            {"name": "waited-seconds", "value": waited},
        ])
    };
    match outcome {
        Outcome::Acquired {
            token,
            waited_seconds,
        } => Some(r(token.to_string(), waited_seconds.to_string(), "true")),
        // Later tasks may reference every result even when skipped by a `when`:
        // give the non-holder harmless values (token 0 is below every real token).
        Outcome::NotAcquired { .. } => Some(r("0".into(), "0".into(), "false")),
        _ => None,
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The merge patch that brings `current` to `outcome`, or None if it already says so.
pub fn patch(
    kind: RunKind,
    key: &str,
    outcome: &Outcome,
    current: &RunStatus,
    resource_version: Option<&str>,
    now: DateTime<Utc>,
) -> Option<Value> {
    let (reason, message) = condition(kind, key, outcome);
    let status = reason.status();
    let retry = matches!(outcome, Outcome::Waiting { retry: true, .. });
    let same = current.succeeded().is_some_and(|c| {
        c.status == status
            && c.reason.as_deref() == Some(reason.as_str())
            && c.message.as_deref() == Some(message.as_str())
    });
    if same && !retry {
        return None;
    }
    let cond = Condition {
        type_: "Succeeded".into(),
        status: status.into(),
        reason: Some(reason.as_str().into()),
        message: Some(message),
        last_transition_time: Some(rfc3339(now)),
    };
    let mut st = json!({
        "conditions": [cond],
        "startTime": current.start_time.clone().unwrap_or_else(|| rfc3339(now)),
        "extraFields": {"key": key},
    });
    if status != "Unknown" {
        st["completionTime"] = json!(rfc3339(now));
    }
    if let Some(r) = results(key, outcome) {
        st["results"] = r;
    }
    if retry {
        // This attempt timed out and a retry remains: record the attempt and wait afresh.
        let mut attempts = current.retries_status.clone();
        attempts.push(json!({
            "conditions": [Condition {
                type_: "Succeeded".into(),
                status: "False".into(),
                reason: Some(Reason::TimedOut(kind).as_str().into()),
                message: Some(format!("attempt {} timed out waiting for {key}", attempts.len() + 1)),
                last_transition_time: Some(rfc3339(now)),
            }],
            "startTime": current.start_time,
            "completionTime": rfc3339(now),
        }));
        st["retriesStatus"] = json!(attempts);
        st["startTime"] = json!(rfc3339(now));
    }
    Some(json!({"metadata": {"resourceVersion": resource_version}, "status": st}))
}

/// Status for a run whose spec we cannot accept.
pub fn invalid_params_patch(message: &str, current: &RunStatus, now: DateTime<Utc>) -> Value {
    json!({"status": {
        "conditions": [Condition {
            type_: "Succeeded".into(),
            status: "False".into(),
            reason: Some(Reason::InvalidParams.as_str().into()),
            message: Some(message.into()),
            last_transition_time: Some(rfc3339(now)),
        }],
        "startTime": current.start_time.clone().unwrap_or_else(|| rfc3339(now)),
        "completionTime": rfc3339(now),
    }})
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
    }

    #[test]
    fn waiting_message_names_key_holder_and_position() {
        let o = Outcome::Waiting {
            position: 2,
            of: 3,
            holders: vec!["env-staging-81".into()],
            retry: false,
        };
        let p = patch(
            RunKind::CustomRun,
            "jx-staging",
            &o,
            &RunStatus::default(),
            Some("7"),
            now(),
        )
        .unwrap();
        assert_eq!(
            p["status"]["conditions"][0]["message"],
            "waiting for jx-staging: held by env-staging-81 (position 2 of 3)"
        );
        assert_eq!(p["status"]["conditions"][0]["reason"], "Waiting");
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert!(p["status"].get("completionTime").is_none());
    }

    #[test]
    fn unchanged_status_is_not_patched_again() {
        let o = Outcome::Acquired {
            token: 4,
            waited_seconds: 9,
        };
        let p = patch(
            RunKind::CustomRun,
            "k",
            &o,
            &RunStatus::default(),
            None,
            now(),
        )
        .unwrap();
        let written: RunStatus = serde_json::from_value(p["status"].clone()).unwrap();
        assert_eq!(
            patch(RunKind::CustomRun, "k", &o, &written, None, now()),
            None
        );
        let results = &p["status"]["results"];
        assert_eq!(results[2], json!({"name": "token", "value": "4"}));
        assert_eq!(results[0], json!({"name": "acquired", "value": "true"}));
    }

    #[test]
    fn reasons_follow_the_protocol_of_each_kind() {
        let cancel = Outcome::Cancelled { why: "x".into() };
        let reason = |kind, o| condition(kind, "k", o).0.as_str();
        assert_eq!(reason(RunKind::CustomRun, &cancel), "CustomRunCancelled");
        assert_eq!(reason(RunKind::Run, &cancel), "RunCancelled");
        assert_eq!(
            reason(RunKind::CustomRun, &Outcome::TimedOut),
            "CustomRunTimedOut"
        );
        assert_eq!(reason(RunKind::Run, &Outcome::TimedOut), "RunTimedOut");
    }

    #[test]
    fn a_retry_records_the_attempt_and_restarts_the_clock() {
        let current = RunStatus {
            start_time: Some("2026-11-30T11:00:00Z".into()),
            ..Default::default()
        };
        let o = Outcome::Waiting {
            position: 1,
            of: 1,
            holders: vec!["a".into()],
            retry: true,
        };
        let p = patch(RunKind::CustomRun, "k", &o, &current, None, now()).unwrap();
        assert_eq!(p["status"]["retriesStatus"].as_array().unwrap().len(), 1);
        assert_eq!(p["status"]["startTime"], "2026-11-30T12:00:00Z");
        assert_eq!(
            p["status"]["retriesStatus"][0]["conditions"][0]["reason"],
            "CustomRunTimedOut"
        );
    }
}
