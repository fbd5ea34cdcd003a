//! What a run's status says for each outcome, as a merge patch of the fields
//! this controller owns. Pure: the caller supplies the current status and time.

pub mod queued;
use crate::model::Outcome;
use jiff::Timestamp;
use serde_json::{Value, json};
use tekton_mutex_api::mutex::RunKind;
use tekton_mutex_api::tekton::{Condition, RunStatus};

/// Every reason this controller writes on a run's `Succeeded` condition or in an
/// Event. The cancel and timeout reasons are Tekton's own, which Tekton reads
/// back: a PipelineRun counts a custom task as cancelled only with the cancel
/// reason, so a superseded run ends `Cancelled(kind)` and its PipelineRun
/// `Cancelled` (tektoncd/pipeline v1.15.0, `pipelinerunresolution.go` `isCancelled`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Waiting,
    Acquired,
    NotAcquired,
    InvalidParams,
    /// The key's queue is at `spec.maxQueue`.
    QueueFull,
    /// The reason of the `Superseded` Events (on the PipelineRun and on the lock
    /// run). Controllers before the `Cancelled` contract also ended superseded
    /// runs with it; [`superseded`] still recognizes those.
    Superseded,
    Cancelled(RunKind),
    TimedOut(RunKind),
    /// Queued on a frozen key (`spec.frozen`); the message gives the freeze reason.
    Frozen,
    /// Queued while a scheduled window (`spec.windows`) grants nothing new; the message names
    /// the window and when it opens.
    WindowClosed,
    /// Let go by a person: the queue was cleared (`tkn mutex clear`), or the
    /// PipelineRun's hold released (`tkn mutex release --force`); the message says who.
    Cleared,
    /// The reason of the Event on a PipelineRun whose hold a person released.
    Released,
    /// The youngest of PipelineRuns that wait on each other's keys: its wait ends (`core::deadlock`).
    Deadlock,
    /// Arrived while its ClusterMutex was being deleted: nothing would ever grant it.
    LockDeleted,
    /// A queued PipelineRun started by someone else than its grant: cancelled.
    StartedWithoutGrant,
}

impl Reason {
    pub const fn as_str(self) -> &'static str {
        match self {
            Reason::Waiting => "Waiting",
            Reason::Acquired => "Acquired",
            Reason::NotAcquired => "NotAcquired",
            Reason::InvalidParams => "InvalidParams",
            Reason::QueueFull => "QueueFull",
            Reason::Superseded => "Superseded",
            Reason::Cancelled(RunKind::CustomRun) => "CustomRunCancelled",
            Reason::Cancelled(RunKind::Run) => "RunCancelled",
            Reason::TimedOut(RunKind::CustomRun) => "CustomRunTimedOut",
            Reason::TimedOut(RunKind::Run) => "RunTimedOut",
            // A PipelineRun queued as a whole: the reasons its cancel annotation gives.
            Reason::Cancelled(RunKind::PipelineRun) => "Cancelled",
            Reason::TimedOut(RunKind::PipelineRun) => "QueueTimeout",
            Reason::Frozen => "Frozen",
            Reason::WindowClosed => "WindowClosed",
            Reason::Cleared => "Cleared",
            Reason::Released => "Released",
            Reason::Deadlock => "Deadlock",
            Reason::LockDeleted => "LockDeleted",
            Reason::StartedWithoutGrant => "StartedWithoutGrant",
        }
    }

    /// The condition status this reason goes with.
    pub fn status(self) -> &'static str {
        match self {
            Reason::Waiting | Reason::Frozen | Reason::WindowClosed => "Unknown",
            Reason::Acquired | Reason::NotAcquired => "True",
            Reason::InvalidParams
            | Reason::QueueFull
            | Reason::Superseded
            | Reason::Cancelled(_)
            | Reason::TimedOut(_)
            | Reason::Cleared
            | Reason::Released
            | Reason::Deadlock
            | Reason::LockDeleted
            | Reason::StartedWithoutGrant => "False",
        }
    }
}

/// How a superseded run's message starts; people and alert rules look for it.
pub const SUPERSEDED_PREFIX: &str = "Superseded:";
/// `status.extraFields` key naming who superseded a run: the typed fact that a
/// run ended superseded (its PipelineRun's cancel is redone from it after a crash).
pub const SUPERSEDED_BY_FIELD: &str = "supersededBy";

/// `status.extraFields` key naming the kind of lock that wrote the status (beside
/// `key`, the lock's name): a grant is bound to the lock that made it.
pub const LOCK_KIND_FIELD: &str = "lockKind";
/// `status.extraFields` key naming the lock (its name) that wrote the status.
pub const LOCK_KEY_FIELD: &str = "key";

/// Was this run's status written by a lock other than the `kind` named `key`? A
/// run re-pointed at another key (its `key` param or `customRef` patched after it
/// was told) still says what the first lock told it, and the second lock never
/// adopts its grant. A status from before the kind was written names the key alone.
pub fn told_by_another_lock(status: &RunStatus, kind: &str, key: &str) -> bool {
    let Some(fields) = status.extra_fields.as_ref() else {
        return false;
    };
    let differs = |field: &str, ours: &str| {
        fields
            .get(field)
            .and_then(serde_json::Value::as_str)
            .is_some_and(|theirs| theirs != ours)
    };
    differs(LOCK_KEY_FIELD, key) || differs(LOCK_KIND_FIELD, kind)
}

/// The lock that wrote this run's status: its kind (None in a status from before the kind
/// was written) and its name. None if no lock wrote it.
pub fn written_by(status: &RunStatus) -> Option<(Option<String>, String)> {
    let fields = status.extra_fields.as_ref()?;
    let text = |field: &str| fields.get(field)?.as_str().map(String::from);
    Some((text(LOCK_KIND_FIELD), text(LOCK_KEY_FIELD)?))
}

/// `status.extraFields` key recording the run's `release-after` (its task names, sorted and
/// comma-joined; empty without the param) as the lock first told it: the section the run was
/// queued and granted for (issue 23 item 2).
pub const RELEASE_AFTER_FIELD: &str = "releaseAfter";

/// How `release-after` is recorded: order and repeats carry no meaning, so neither is kept.
fn release_after_record(names: &[String]) -> String {
    let mut sorted: Vec<&str> = names.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    sorted.join(",")
}

/// The `release-after` a lock recorded in this run's status, as task names. None in a status
/// no lock of this version wrote (an older controller's): there is nothing to hold the run to.
pub fn recorded_release_after(status: &RunStatus) -> Option<Vec<String>> {
    let recorded = status.extra_fields.as_ref()?.get(RELEASE_AFTER_FIELD)?;
    let names = recorded.as_str()?.split(',').filter(|n| !n.is_empty());
    Some(names.map(String::from).collect())
}

/// Adds the record of `release_after` to a status patch, unless `current` has one: the first
/// tell fixes the run's section, and a later write never moves it.
pub fn record_release_after(patch: &mut Value, current: &RunStatus, release_after: &[String]) {
    if recorded_release_after(current).is_none() {
        patch["status"]["extraFields"][RELEASE_AFTER_FIELD] =
            json!(release_after_record(release_after));
    }
}

/// The InvalidParams message for a run whose `release-after` (`now`, as read from its params)
/// is no longer what the lock recorded when it first told it; None if it is the same, or if
/// nothing was recorded.
pub fn release_after_change(status: &RunStatus, now: &[String]) -> Option<String> {
    let was = release_after_record(&recorded_release_after(status)?);
    let now = release_after_record(now);
    (was != now).then(|| {
        format!(
            "param \"release-after\" was {was:?} when the run was first queued, and is now {now:?}: \
             a lock run's section cannot change after it was first seen (the slot would go free at \
             another point than the one it waits or holds for); put the value back, or create a new run"
        )
    })
}

/// Did this run end superseded? By our marker, or by the reason older versions wrote.
pub fn superseded(status: &RunStatus) -> bool {
    let marked = status
        .extra_fields
        .as_ref()
        .and_then(|f| f.get(SUPERSEDED_BY_FIELD))
        .is_some_and(|v| v.is_string());
    let legacy = status
        .succeeded()
        .is_some_and(|c| c.reason.as_deref() == Some(Reason::Superseded.as_str()));
    marked || legacy
}

/// The Succeeded condition an outcome calls for: its reason and message.
pub fn condition(kind: RunKind, key: &str, outcome: &Outcome) -> (Reason, String) {
    match outcome {
        Outcome::Waiting { next, holders, .. } => (
            Reason::Waiting,
            format!("waiting for {key}: {}", place(key, *next, holders)),
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
        Outcome::Superseded { by, group } => (
            Reason::Cancelled(kind),
            format!(
                "{SUPERSEDED_PREFIX} newer PipelineRun {by} (group {group}) holds or waits for {key}"
            ),
        ),
        Outcome::Cancelled { why } => (
            Reason::Cancelled(kind),
            format!("left the queue for {key}: {why}"),
        ),
        Outcome::TimedOut => (
            Reason::TimedOut(kind),
            format!("timed out waiting for {key}"),
        ),
        Outcome::QueueFull { limit, namespace } => (
            Reason::QueueFull,
            queue_full(key, *limit, namespace.as_deref()),
        ),
        Outcome::StatusFull { bytes } => (
            Reason::QueueFull,
            format!(
                "the queue for {key} is full: one more waiter would make its status larger than \
                 {} KiB, beyond what the API server and etcd accept (their names are long); \
                 retry once one is granted, or lower spec.maxQueue",
                bytes / 1024
            ),
        ),
        Outcome::Frozen {
            next,
            holders,
            window: Some(window),
            ..
        } => (
            Reason::WindowClosed,
            format!(
                "waiting for {key}: {window}; {}",
                place(key, *next, holders)
            ),
        ),
        Outcome::Frozen {
            next,
            holders,
            reason,
            ..
        } => (
            Reason::Frozen,
            format!(
                "waiting for {key}: frozen{}; {}",
                reason
                    .as_deref()
                    .map_or(String::new(), |r| format!(": {r}")),
                place(key, *next, holders)
            ),
        ),
        Outcome::Cleared { message } => (Reason::Cleared, format!("let go of {key}: {message}")),
        Outcome::Deadlock { cycle } => (
            Reason::Deadlock,
            format!(
                "left the queue for {key} to break a deadlock: {cycle}; this PipelineRun is the \
                 youngest in the cycle. Take the keys in one order in every pipeline, or take \
                 them together with `keys`"
            ),
        ),
        Outcome::StartedWithoutGrant => (
            Reason::StartedWithoutGrant,
            format!(
                "started without its grant: its spec.status was cleared while it waited for \
                 {key}, by someone other than tekton-mutex, so it would run beside the holder; \
                 it is cancelled and holds nothing. Only its grant starts a queued \
                 PipelineRun: run it again to queue it, or without the key annotation to run \
                 it unlocked"
            ),
        ),
        Outcome::LockDeleted => (
            Reason::LockDeleted,
            format!(
                "not admitted to {key}: it is being deleted and takes no new runs, and nothing \
                 creates a ClusterMutex again but its administrator; run again once it is back"
            ),
        ),
        Outcome::Uninstalling => (
            Reason::LockDeleted,
            format!(
                "not admitted to {key}: tekton-mutex is being uninstalled (the lock's \
                 CustomResourceDefinition is being deleted, or is gone), so no lock of {key} can \
                 be created again; run again after a reinstall"
            ),
        ),
        Outcome::MutexDeleting => (
            Reason::Waiting,
            format!(
                "waiting for {key}: Mutex {key} is being deleted; it is created again once its holders and waiters are done"
            ),
        ),
    }
}

/// Where a waiter stands: only the head names the holders, so that a grant or
/// an arrival rewrites no other waiter's message.
fn place(key: &str, next: bool, holders: &[String]) -> String {
    if next {
        format!("next in line, held by {}", holders_text(holders))
    } else {
        format!("queued ({key}'s status lists the queue in order)")
    }
}

/// The result that carries an acquired run's fencing token.
pub const TOKEN_RESULT: &str = "token";
/// The result of a run of several keys naming each key's token, as a JSON object.
pub const TOKENS_RESULT: &str = "tokens";

/// The token a run was told `Acquired` with: its `token` result, once its
/// condition says `Acquired`. The lock state is rebuilt from it.
pub fn acquired_token(status: &RunStatus) -> Option<i64> {
    let acquired = status.succeeded().is_some_and(|c| {
        c.status == "True" && c.reason.as_deref() == Some(Reason::Acquired.as_str())
    });
    if !acquired {
        return None;
    }
    status
        .result(TOKEN_RESULT)?
        .parse()
        .ok()
        .filter(|t| tekton_mutex_api::mutex::token_in_range(*t))
}

/// Why a run was not admitted: the whole queue is full, or its namespace's share of it.
fn queue_full(key: &str, limit: u32, namespace: Option<&str>) -> String {
    match namespace {
        None => format!(
            "the queue for {key} is full: {limit} runs already wait (spec.maxQueue of Mutex {key} is {limit})"
        ),
        Some(ns) => format!(
            "namespace {ns} has its share of the queue for {key}: {limit} of its runs already wait \
             (spec.maxQueuePerNamespace of ClusterMutex {key} is {limit}); retry once one is granted"
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
            {"name": TOKEN_RESULT, "value": token},
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

fn rfc3339(t: Timestamp) -> String {
    // RFC 3339 in UTC (`Z`), in whole seconds: a fraction is dropped, not rounded.
    format!("{t:.0}")
}

/// The merge patch that brings `current` to `outcome`, or None if it already says so.
pub fn patch(
    kind: RunKind,
    key: &str,
    outcome: &Outcome,
    current: &RunStatus,
    resource_version: Option<&str>,
    now: Timestamp,
) -> Option<Value> {
    let (reason, message) = condition(kind, key, outcome);
    let status = reason.status();
    let retry = matches!(
        outcome,
        Outcome::Waiting { retry: true, .. } | Outcome::Frozen { retry: true, .. }
    );
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
        last_transition_time: Some(transition_time(current, status, reason, now)),
    };
    let mut extra = json!({"key": key});
    if let Outcome::Superseded { by, .. } = outcome {
        extra[SUPERSEDED_BY_FIELD] = json!(by);
    }
    let mut st = json!({
        "conditions": [cond],
        "startTime": current.start_time.clone().unwrap_or_else(|| rfc3339(now)),
        "extraFields": extra,
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

/// A condition's lastTransitionTime moves only when its status or reason does:
/// a new position in the queue is not a transition.
fn transition_time(current: &RunStatus, status: &str, reason: Reason, now: Timestamp) -> String {
    current
        .succeeded()
        .filter(|c| c.status == status && c.reason.as_deref() == Some(reason.as_str()))
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| rfc3339(now))
}

/// Status for a run whose spec we cannot accept.
pub fn invalid_params_patch(message: &str, current: &RunStatus, now: Timestamp) -> Value {
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
    use jiff::SignedDuration;

    fn now() -> Timestamp {
        "2026-11-30T12:00:00Z".parse().unwrap()
    }

    /// Issue 23 item 2: a grant binds to the lock that made it, by kind and name.
    #[test]
    fn a_grant_is_bound_to_the_lock_that_made_it() {
        let status = |fields: serde_json::Value| RunStatus {
            extra_fields: Some(fields),
            ..RunStatus::default()
        };
        let rows = [
            (
                json!({"key": "prod", "lockKind": "Mutex"}),
                "Mutex",
                "prod",
                false,
            ),
            (
                json!({"key": "prod", "lockKind": "Mutex"}),
                "Mutex",
                "staging",
                true,
            ),
            (
                json!({"key": "prod", "lockKind": "Mutex"}),
                "ClusterMutex",
                "prod",
                true,
            ),
            // Written before the kind was: the key alone decides.
            (json!({"key": "prod"}), "ClusterMutex", "prod", false),
            (json!({"key": "prod"}), "Mutex", "staging", true),
            (json!({}), "Mutex", "prod", false),
        ];
        for (fields, kind, key, another) in rows {
            let s = status(fields.clone());
            assert_eq!(
                told_by_another_lock(&s, kind, key),
                another,
                "{fields} by {kind} {key}"
            );
        }
        assert!(!told_by_another_lock(
            &RunStatus::default(),
            "Mutex",
            "prod"
        ));
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| n.to_string()).collect()
    }

    /// Issue 23 item 2: the first tell records `release-after`; later writes keep that record.
    #[test]
    fn the_first_tell_records_release_after_and_no_later_write_moves_it() {
        let mut first = json!({"status": {"extraFields": {"key": "k"}}});
        record_release_after(&mut first, &RunStatus::default(), &names(&["b", "a", "b"]));
        assert_eq!(first["status"]["extraFields"]["releaseAfter"], "a,b");
        let told = RunStatus {
            extra_fields: Some(first["status"]["extraFields"].clone()),
            ..RunStatus::default()
        };
        assert_eq!(recorded_release_after(&told), Some(names(&["a", "b"])));
        let mut later = json!({"status": {"extraFields": {"key": "k"}}});
        record_release_after(&mut later, &told, &names(&["c"]));
        assert_eq!(later["status"]["extraFields"].get("releaseAfter"), None);
        // Without the param the record is empty: adding one later is a change too.
        let mut none = json!({"status": {}});
        record_release_after(&mut none, &RunStatus::default(), &[]);
        assert_eq!(none["status"]["extraFields"]["releaseAfter"], "");
    }

    /// Issue 23 item 2: a changed `release-after` is refused naming the field and both
    /// values; the same names in another order, or a status no lock recorded, are not.
    #[test]
    fn a_changed_release_after_is_refused_naming_the_field_and_both_values() {
        let recorded = |value: &str| RunStatus {
            extra_fields: Some(json!({"key": "k", "releaseAfter": value})),
            ..RunStatus::default()
        };
        let why = release_after_change(&recorded("deploy"), &names(&["quick"])).unwrap();
        assert!(
            why.contains("\"release-after\"")
                && why.contains("\"deploy\"")
                && why.contains("\"quick\""),
            "{why}"
        );
        let added = release_after_change(&recorded(""), &names(&["deploy"])).unwrap();
        assert!(
            added.contains("was \"\"") && added.contains("now \"deploy\""),
            "{added}"
        );
        assert!(release_after_change(&recorded("deploy"), &[]).is_some());
        let same = names(&["migrate", "deploy"]);
        assert_eq!(
            release_after_change(&recorded("deploy,migrate"), &same),
            None
        );
        assert_eq!(release_after_change(&recorded(""), &[]), None);
        let older = RunStatus {
            extra_fields: Some(json!({"key": "k"})),
            ..RunStatus::default()
        };
        assert_eq!(release_after_change(&older, &names(&["deploy"])), None);
        assert_eq!(release_after_change(&RunStatus::default(), &[]), None);
    }

    #[test]
    fn the_run_next_in_line_is_told_who_holds_the_key() {
        let o = Outcome::Waiting {
            next: true,
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
            "waiting for jx-staging: next in line, held by env-staging-81"
        );
        assert_eq!(p["status"]["conditions"][0]["reason"], "Waiting");
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert!(p["status"].get("completionTime").is_none());
    }

    #[test]
    fn the_rest_of_the_queue_is_told_only_that_it_waits() {
        let o = Outcome::Waiting {
            next: false,
            holders: vec![],
            retry: false,
        };
        let p = patch(
            RunKind::CustomRun,
            "jx-staging",
            &o,
            &RunStatus::default(),
            None,
            now(),
        )
        .unwrap();
        assert_eq!(
            p["status"]["conditions"][0]["message"],
            "waiting for jx-staging: queued (jx-staging's status lists the queue in order)"
        );
        assert_eq!(
            patch(
                RunKind::CustomRun,
                "jx-staging",
                &o,
                &written(&p),
                None,
                now()
            ),
            None
        );
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
            next: true,
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

    fn waiting(next: bool) -> Outcome {
        Outcome::Waiting {
            next,
            holders: if next { vec!["a".into()] } else { vec![] },
            retry: false,
        }
    }

    fn written(p: &Value) -> RunStatus {
        serde_json::from_value(p["status"].clone()).unwrap()
    }

    #[test]
    fn last_transition_time_moves_only_with_status_or_reason() {
        let later = now() + SignedDuration::from_secs(30);
        let first = patch(
            RunKind::CustomRun,
            "k",
            &waiting(false),
            &RunStatus::default(),
            None,
            now(),
        )
        .unwrap();
        let ltt = |p: &Value| p["status"]["conditions"][0]["lastTransitionTime"].clone();
        assert_eq!(ltt(&first), "2026-11-30T12:00:00Z");
        // Moving to the head is a new message, not a transition.
        let moved = patch(
            RunKind::CustomRun,
            "k",
            &waiting(true),
            &written(&first),
            None,
            later,
        )
        .unwrap();
        assert_eq!(ltt(&moved), "2026-11-30T12:00:00Z");
        let acquired = Outcome::Acquired {
            token: 1,
            waited_seconds: 30,
        };
        let granted = patch(
            RunKind::CustomRun,
            "k",
            &acquired,
            &written(&moved),
            None,
            later,
        )
        .unwrap();
        assert_eq!(ltt(&granted), "2026-11-30T12:00:30Z");
    }

    #[test]
    fn a_superseded_run_ends_cancelled_with_the_word_in_front() {
        let o = Outcome::Superseded {
            by: "promote-81".into(),
            group: "promote".into(),
        };
        for (kind, reason) in [
            (RunKind::CustomRun, "CustomRunCancelled"),
            (RunKind::Run, "RunCancelled"),
        ] {
            let p = patch(kind, "jx-staging", &o, &RunStatus::default(), None, now()).unwrap();
            let c = &p["status"]["conditions"][0];
            assert_eq!(
                (c["status"].as_str(), c["reason"].as_str()),
                (Some("False"), Some(reason))
            );
            assert_eq!(
                c["message"],
                "Superseded: newer PipelineRun promote-81 (group promote) holds or waits for jx-staging"
            );
            assert!(p["status"]["completionTime"].is_string());
            assert!(superseded(&written(&p)), "the marker says superseded");
        }
    }

    #[test]
    fn only_the_marker_or_the_old_reason_means_superseded() {
        let cancelled = patch(
            RunKind::CustomRun,
            "k",
            &Outcome::Cancelled {
                why: "Superseded: not really".into(),
            },
            &RunStatus::default(),
            None,
            now(),
        )
        .unwrap();
        assert!(!superseded(&written(&cancelled)));
        let legacy = RunStatus {
            conditions: vec![Condition {
                type_: "Succeeded".into(),
                status: "False".into(),
                reason: Some("Superseded".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(superseded(&legacy), "runs ended by earlier versions");
    }
}
