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

pub use tekton_mutex_api::requests::{Action, Dismissal, Dismissed, ObservedRequest, Verdict};

use jiff::Timestamp;
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

/// A request, as the annotation value says it. Read strictly (no unknown field,
/// no field twice): the admission policy in config/ trusts that `"by":"..."`
/// can only be this field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
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
    /// Forget: the supersede group whose mark goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

impl Request {
    /// A request of `action` that says nothing more yet.
    pub fn of(action: Action) -> Request {
        Request {
            id: String::new(),
            action,
            pipeline_run: None,
            reason: None,
            by: String::new(),
            force: false,
            keep_pipeline_runs: false,
            group: None,
        }
    }

    /// The annotation that carries this request.
    pub fn annotation(&self) -> (String, String) {
        let value = serde_json::to_string(self).expect("a request always serializes");
        (format!("{REQUEST_PREFIX}{}", self.id), value)
    }
}

/// A fresh request id: time-ordered, unique enough for one Mutex, and valid as
/// the name part of an annotation key.
pub fn new_id(now: Timestamp, nonce: u32) -> String {
    format!("{}-{:08x}", now.strftime("%Y%m%dt%H%M%S%3f"), nonce)
}

/// The longest `reason`, `by` or PipelineRun name a request may carry, in bytes
/// (`spec.frozenReason` has the same bound in the CRD). What a request says is
/// copied into the status and into messages: unbounded, one request could grow
/// the status past what the API server accepts, and then the key grants nothing.
pub const MAX_TEXT: usize = 1024;

/// The requests on a Mutex, oldest id first; an unreadable one is kept as an error
/// so that it is refused (and removed) rather than ignored. One that reads but says
/// too much is refused as what it asked and by whom: its words are not kept.
pub fn requests_from(annotations: &BTreeMap<String, String>) -> Vec<Result<Request, Unreadable>> {
    annotations
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(REQUEST_PREFIX)?, v)))
        .map(|(id, v)| {
            let r = serde_json::from_str::<Request>(v).map_err(|e| Unreadable {
                id: id.into(),
                error: format!("not a request: {e}"),
                action: None,
                by: String::new(),
            })?;
            within_bounds(&r).map_err(|error| Unreadable {
                id: id.into(),
                error,
                action: Some(r.action),
                by: Some(r.by.as_str())
                    .filter(|by| by.len() <= MAX_TEXT)
                    .unwrap_or_default()
                    .to_string(),
            })?;
            Ok(Request { id: id.into(), ..r })
        })
        .collect()
}

/// Refuses a request whose words are longer than [`MAX_TEXT`], naming the field.
pub fn within_bounds(r: &Request) -> Result<(), String> {
    let fields = [
        ("reason", r.reason.as_deref()),
        ("by", Some(r.by.as_str())),
        ("pipelineRun", r.pipeline_run.as_deref()),
        ("group", r.group.as_deref()),
    ];
    for (name, text) in fields {
        let len = text.map_or(0, str::len);
        if len > MAX_TEXT {
            return Err(format!(
                "its {name} is {len} bytes, at most {MAX_TEXT} are allowed: shorten it and ask again"
            ));
        }
    }
    Ok(())
}

/// A request annotation refused as written: its value is not a request, or its
/// words are past [`MAX_TEXT`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unreadable {
    pub id: String,
    /// Why, as the acknowledgement says it.
    pub error: String,
    /// What it asked, when its value reads as a request.
    pub action: Option<Action>,
    /// Who asked, when that reads and is within bounds; else empty.
    pub by: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_round_trips_through_its_annotation() {
        let r = Request {
            id: new_id(Timestamp::from_second(1_800_000_000).unwrap(), 0xabc),
            action: Action::Release,
            pipeline_run: Some("deploy-1".into()),
            reason: Some("hung in finally".into()),
            by: "alice".into(),
            force: true,
            keep_pipeline_runs: false,
            group: None,
        };
        let (k, v) = r.annotation();
        assert!(k.starts_with(REQUEST_PREFIX));
        let name = k.strip_prefix(REQUEST_PREFIX).unwrap();
        assert!(name.len() <= 63 && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        let read = requests_from(&[(k, v), ("other".into(), "x".into())].into());
        assert_eq!(read, vec![Ok(r)]);
    }

    /// An id's time part: UTC, to the millisecond (cut, not rounded).
    #[test]
    fn a_request_id_is_its_time_to_the_millisecond() {
        let t = Timestamp::new(1_800_000_000, 123_999_999).unwrap();
        assert_eq!(new_id(t, 0xabc), "20270115t080000123-00000abc");
    }

    /// Issue 23 item 8: a 200 KB reason is refused, never copied into the status.
    #[test]
    fn a_request_with_words_past_the_bound_is_refused_naming_the_field() {
        let long = "x".repeat(200 * 1024);
        let at_bound = "y".repeat(MAX_TEXT);
        let request = |reason: &str, by: &str| Request {
            id: "r".into(),
            action: Action::Clear,
            pipeline_run: None,
            reason: Some(reason.into()),
            by: by.into(),
            force: false,
            keep_pipeline_runs: false,
            group: None,
        };
        for (r, field) in [
            (request(&long, "alice"), Some("reason")),
            (request("ok", &long), Some("by")),
            (request(&at_bound, &at_bound), None),
        ] {
            let read = requests_from(&[r.annotation()].into());
            match (&read[..], field) {
                ([Err(u)], Some(f)) => {
                    assert!(
                        u.error.contains(f) && u.error.contains("at most 1024"),
                        "{}",
                        u.error
                    );
                    assert!(u.error.len() < 200, "the refusal is short: {}", u.error);
                    // Issue 37 item 6: refused as the clear it is, by whom (if that is short).
                    assert_eq!(u.action, Some(Action::Clear));
                    let by = if f == "by" { "" } else { "alice" };
                    assert_eq!(u.by, by, "{f}");
                }
                ([Ok(_)], None) => {}
                (other, _) => panic!("{field:?}: {other:?}"),
            }
        }
    }

    /// The admission policy finds the requester as `"by":"NAME"` in the value:
    /// a request may carry no second object and no second `by` to hide another in.
    #[test]
    fn a_request_with_an_unknown_field_or_a_field_twice_is_unreadable() {
        for value in [
            r#"{"action":"clear","by":"security-oncall","x":{"by":"me"}}"#,
            r#"{"action":"clear","by":"security-oncall","by":"me"}"#,
        ] {
            let read = requests_from(&[(format!("{REQUEST_PREFIX}x"), value.into())].into());
            assert!(matches!(&read[..], [Err(_)]), "{value}: {read:?}");
        }
        let fine = r#"{"action":"clear","by":"me"}"#;
        let read = requests_from(&[(format!("{REQUEST_PREFIX}x"), fine.into())].into());
        assert!(matches!(&read[..], [Ok(r)] if r.by == "me"), "{read:?}");
    }

    #[test]
    fn an_unreadable_request_is_kept_as_an_error() {
        let read = requests_from(&[(format!("{REQUEST_PREFIX}x"), "{".into())].into());
        assert!(
            matches!(&read[..], [Err(Unreadable { id, action: None, error, .. })]
            if id == "x" && error.starts_with("not a request: "))
        );
    }
}
