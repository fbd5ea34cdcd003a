//! What a PipelineRun queued as a whole is told. A lock run is told through its
//! status; a PipelineRun's status is Tekton's, so the same status goes into the
//! record annotation, and the outcome acts on the PipelineRun itself: a grant
//! clears `spec.status` (it starts), an end of its wait cancels it before it
//! ever started, and a wait writes where it is in the queue.

use super::{Reason, condition};
use crate::model::Outcome;
use crate::params::CancelMode;
use crate::params::annotations::{CANCEL_REASON, ERROR, RECORD, TOKEN, WAITING};
use serde_json::{Value, json};
use tekton_mutex_api::mutex::RunKind;
use tekton_mutex_api::tekton::RunStatus;

/// The annotation that names the newer PipelineRun that superseded this one.
pub const SUPERSEDED_BY: &str = "tekton-mutex.dev/superseded-by";

/// The merge patch of the PipelineRun for `run_patch` (the patch a lock run
/// would get for `outcome`). `stoppable`: nobody has asked it to stop yet, so
/// an outcome that ends its wait cancels it, with `cancel_mode` (the view's:
/// `Cancelled` for one never granted). The resourceVersion of
/// `run_patch` rides along: a grant starts the PipelineRun only as it was read.
pub fn patch(
    key: &str,
    run_patch: &Value,
    outcome: &Outcome,
    record: &RunStatus,
    (cancel_mode, stoppable): (CancelMode, bool),
) -> Value {
    let mut merged = serde_json::to_value(record).unwrap_or_else(|_| json!({}));
    merge(&mut merged, &run_patch["status"]);
    let (reason, message) = condition(RunKind::PipelineRun, key, outcome);
    let mut annotations = json!({RECORD: merged.to_string(), ERROR: null});
    let mut spec = Value::Null;
    match (outcome, reason.status()) {
        (Outcome::Acquired { token, .. }, _) => {
            annotations[TOKEN] = json!(token.to_string());
            annotations[WAITING] = Value::Null;
            spec = json!({"status": null});
        }
        (_, "Unknown") => annotations[WAITING] = json!(message),
        (Outcome::Superseded { by, .. }, _) => {
            annotations[WAITING] = Value::Null;
            annotations[SUPERSEDED_BY] = json!(by);
            annotations[CANCEL_REASON] = json!(Reason::Superseded.as_str());
            spec = stop(stoppable, cancel_mode.as_str());
        }
        _ => {
            annotations[WAITING] = Value::Null;
            annotations[CANCEL_REASON] = json!(reason.as_str());
            spec = stop(stoppable, cancel_mode.as_str());
        }
    }
    let mut patch = json!({
        "metadata": {"resourceVersion": run_patch["metadata"]["resourceVersion"], "annotations": annotations},
    });
    if !spec.is_null() {
        patch["spec"] = spec;
    }
    patch
}

/// The patch for a PipelineRun whose annotations cannot be read: it stays
/// Pending, never started unguarded, and says what to fix.
pub fn refused_patch(message: &str) -> Value {
    json!({"metadata": {"annotations": {ERROR: message}}})
}

fn stop(stoppable: bool, mode: &str) -> Value {
    if stoppable {
        json!({"status": mode})
    } else {
        Value::Null
    }
}

/// RFC 7386 merge of `patch` into `target`, as the API server applies a merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let map = target.as_object_mut().expect("made an object above");
    for (k, v) in fields {
        if v.is_null() {
            map.remove(k);
        } else {
            merge(map.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run_status::{acquired_token, patch as run_patch};
    use jiff::Timestamp;

    fn told(outcome: &Outcome, record: &RunStatus, stoppable: bool) -> Value {
        let now: Timestamp = "2026-12-02T12:00:00Z".parse().unwrap();
        let rp = run_patch(
            RunKind::PipelineRun,
            "staging",
            outcome,
            record,
            Some("7"),
            now,
        )
        .unwrap();
        patch(
            "staging",
            &rp,
            outcome,
            record,
            (CancelMode::Cancelled, stoppable),
        )
    }

    fn record_of(p: &Value) -> RunStatus {
        serde_json::from_str(p["metadata"]["annotations"][RECORD].as_str().unwrap()).unwrap()
    }

    #[test]
    fn a_grant_starts_it_as_read_and_records_the_token() {
        let p = told(
            &Outcome::Acquired {
                token: 12,
                waited_seconds: 3,
            },
            &RunStatus::default(),
            true,
        );
        assert_eq!(p["spec"], json!({"status": null}));
        assert_eq!(p["metadata"]["resourceVersion"], json!("7"));
        assert_eq!(p["metadata"]["annotations"][TOKEN], json!("12"));
        assert_eq!(acquired_token(&record_of(&p)), Some(12));
    }

    #[test]
    fn a_wait_is_written_and_changes_nothing_else() {
        let waiting = Outcome::Waiting {
            next: true,
            holders: vec!["promote-1".into()],
            retry: false,
        };
        let p = told(&waiting, &RunStatus::default(), true);
        assert!(p.get("spec").is_none());
        let w = p["metadata"]["annotations"][WAITING].as_str().unwrap();
        assert!(w.contains("next in line") && w.contains("promote-1"), "{w}");
    }

    #[test]
    fn an_end_of_the_wait_cancels_it_unless_someone_already_stopped_it() {
        let superseded = Outcome::Superseded {
            by: "promote-5".into(),
            group: "g".into(),
        };
        let p = told(&superseded, &RunStatus::default(), true);
        assert_eq!(p["spec"]["status"], json!("Cancelled"));
        assert_eq!(
            p["metadata"]["annotations"][SUPERSEDED_BY],
            json!("promote-5")
        );
        let timed_out = told(&Outcome::TimedOut, &RunStatus::default(), true);
        assert_eq!(
            timed_out["metadata"]["annotations"][CANCEL_REASON],
            json!("QueueTimeout")
        );
        assert_eq!(timed_out["spec"]["status"], json!("Cancelled"));
        let stopped = told(&Outcome::TimedOut, &RunStatus::default(), false);
        assert!(
            stopped.get("spec").is_none(),
            "a user's own cancel mode stays"
        );
    }

    #[test]
    fn merge_follows_rfc_7386() {
        let mut t = json!({"a": 1, "b": {"c": 2, "d": 3}});
        merge(&mut t, &json!({"a": null, "b": {"c": 5}, "e": [1]}));
        assert_eq!(t, json!({"b": {"c": 5, "d": 3}, "e": [1]}));
    }
}
