//! A whole PipelineRun as a lock's member: created `spec.status: PipelineRunPending`
//! with the annotation `tekton-mutex.dev/key`, it waits in the key's queue before
//! it starts. Its settings are the lock task's params under the annotation prefix
//! (`tekton-mutex.dev/priority` is param `priority`): they are read back into
//! params and parsed by the one parser ([`crate::params::parse`]), so a
//! setting means the same in both places.
//!
//! Pure: the annotations in, the params, the lock it names and its queue timeout out.

use crate::duration::parse_go_duration;
use kube::Resource;
use std::collections::BTreeMap;
use tekton_mutex_api::cluster_mutex::ClusterMutex;
use tekton_mutex_api::mutex::Mutex;
use tekton_mutex_api::tekton::{Param, TaskRef};

pub const PREFIX: &str = "tekton-mutex.dev/";
/// The opt-in: the key the PipelineRun waits for.
pub const KEY: &str = "tekton-mutex.dev/key";
/// `"true"`: the key names a ClusterMutex, not a Mutex of the namespace.
pub const CLUSTER_MUTEX: &str = "tekton-mutex.dev/cluster-mutex";
/// Its sequence (param `sequence`): higher = newer.
pub const SEQUENCE: &str = "tekton-mutex.dev/sequence";
/// A Go duration: cancel the PipelineRun if it is still queued after this long.
pub const QUEUE_TIMEOUT: &str = "tekton-mutex.dev/queue-timeout";
/// The lock task's params that a PipelineRun may set as annotations.
pub const PARAMS: &[&str] = &[
    "key",
    "sequence",
    "group",
    "supersede",
    "priority",
    "cancel-mode",
];

/// Written by the controller: the fencing token of the grant.
pub const TOKEN: &str = "tekton-mutex.dev/token";
/// Written by the controller: where the PipelineRun is in the queue.
pub const WAITING: &str = "tekton-mutex.dev/waiting";
/// Written by the controller: what is wrong with the annotations.
pub const ERROR: &str = "tekton-mutex.dev/error";
/// Written by the controller: why it cancelled a PipelineRun that never started.
pub const CANCEL_REASON: &str = "tekton-mutex.dev/cancel-reason";
/// Written by the controller: its record of what it told the PipelineRun, as a
/// lock run's status (the state is rebuilt from it like from a lock run's).
pub const RECORD: &str = "tekton-mutex.dev/lock-record";
/// Written by the controller: the lock whose `spec.selector` took the PipelineRun
/// (`Mutex/<name>` or `ClusterMutex/<name>`), with the key annotations it wrote.
pub const SELECTED_BY: &str = "tekton-mutex.dev/selected-by";
/// Written by the admission policy (config/admission/): the lock whose selector took the
/// PipelineRun as it was created and made it Pending.
pub const PENDING_FOR: &str = "tekton-mutex.dev/pending-for";
/// Annotations of ours that the controller writes, or queue control does.
const WRITTEN: &[&str] = &[
    SELECTED_BY,
    PENDING_FOR,
    TOKEN,
    WAITING,
    ERROR,
    CANCEL_REASON,
    RECORD,
    "tekton-mutex.dev/superseded-by",
    "tekton-mutex.dev/released-by",
    "tekton-mutex.dev/cleared-by",
];

/// What the annotations ask for, ready for the params parser.
#[derive(Clone, Debug, PartialEq)]
pub struct AnnotatedLock {
    pub params: Vec<Param>,
    /// The lock kind the PipelineRun queues on (a ClusterMutex by name).
    pub task_ref: TaskRef,
    /// The queue timeout, as given (validated).
    pub queue_timeout: Option<String>,
}

/// Is this PipelineRun asking to be queued (it has the key annotation)?
pub fn opted_in(annotations: &BTreeMap<String, String>) -> bool {
    annotations.contains_key(KEY)
}

/// The lock a PipelineRun's annotations ask for: None without the key annotation;
/// Err names the annotation at fault and what it allows.
pub fn read(annotations: &BTreeMap<String, String>) -> Option<Result<AnnotatedLock, String>> {
    let key = annotations.get(KEY)?;
    Some(read_all(annotations, key))
}

fn read_all(annotations: &BTreeMap<String, String>, key: &str) -> Result<AnnotatedLock, String> {
    for name in annotations.keys().filter(|n| n.starts_with(PREFIX)) {
        let setting = &name[PREFIX.len()..];
        let known = PARAMS.contains(&setting)
            || [CLUSTER_MUTEX, QUEUE_TIMEOUT, KEY].contains(&name.as_str())
            || WRITTEN.contains(&name.as_str());
        if !known {
            let mut allowed: Vec<String> = PARAMS.iter().map(|p| format!("{PREFIX}{p}")).collect();
            allowed.extend([CLUSTER_MUTEX.to_string(), QUEUE_TIMEOUT.to_string()]);
            return Err(format!(
                "unknown annotation {name}: a PipelineRun queued by annotation may set {}",
                allowed.join(", ")
            ));
        }
    }
    let cluster = match annotations.get(CLUSTER_MUTEX).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "annotation {CLUSTER_MUTEX} is {other:?}: it must be \"true\" or \"false\""
            ));
        }
    };
    let queue_timeout = annotations.get(QUEUE_TIMEOUT).cloned();
    if let Some(t) = &queue_timeout {
        parse_go_duration(t).map_err(|e| {
            format!("annotation {QUEUE_TIMEOUT} is {t:?}, not a Go duration (e.g. \"30m\"): {e}")
        })?;
    }
    let task_ref = target(cluster, key.trim());
    // A ClusterMutex is named by the reference; the key param would repeat it.
    let params = PARAMS
        .iter()
        .filter(|p| !(cluster && **p == "key"))
        .filter_map(|p| {
            let value = annotations.get(&format!("{PREFIX}{p}"))?;
            Some(Param {
                name: p.to_string(),
                value: serde_json::Value::String(value.clone()),
            })
        })
        .collect();
    Ok(AnnotatedLock {
        params,
        task_ref,
        queue_timeout,
    })
}

fn target(cluster: bool, key: &str) -> TaskRef {
    if cluster {
        TaskRef {
            api_version: ClusterMutex::api_version(&()).into(),
            kind: ClusterMutex::kind(&()).into(),
            name: Some(key.to_string()),
        }
    } else {
        TaskRef {
            api_version: Mutex::api_version(&()).into(),
            kind: Mutex::kind(&()).into(),
            name: None,
        }
    }
}

/// A parser message about a param, said of the annotation it came from.
pub fn as_annotation_message(message: &str) -> String {
    let mut out = message.to_string();
    for p in PARAMS {
        out = out.replace(&format!("param {p:?}"), &format!("annotation {PREFIX}{p}"));
    }
    out.replace("spec.timeout", QUEUE_TIMEOUT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_annotations_become_the_lock_tasks_params() {
        let a = annotations(&[
            (KEY, "jx-staging"),
            ("tekton-mutex.dev/priority", "5"),
            ("tekton-mutex.dev/supersede", "true"),
            (QUEUE_TIMEOUT, "30m"),
            ("other.dev/x", "ignored: not ours"),
        ]);
        let lock = read(&a).unwrap().unwrap();
        let names: Vec<&str> = lock.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["key", "supersede", "priority"]);
        assert_eq!(lock.task_ref.kind, "Mutex");
        assert_eq!(lock.queue_timeout.as_deref(), Some("30m"));
        assert!(read(&annotations(&[("tekton-mutex.dev/priority", "5")])).is_none());
    }

    #[test]
    fn a_cluster_mutex_is_named_by_the_key() {
        let a = annotations(&[(KEY, " shared-db\n"), (CLUSTER_MUTEX, "true")]);
        let lock = read(&a).unwrap().unwrap();
        assert_eq!(lock.task_ref.kind, "ClusterMutex");
        assert_eq!(lock.task_ref.name.as_deref(), Some("shared-db"));
        assert!(lock.params.is_empty());
    }

    #[test]
    fn bad_annotations_are_named_with_what_is_allowed() {
        let err = |pairs: &[(&str, &str)]| read(&annotations(pairs)).unwrap().unwrap_err();
        let unknown = err(&[(KEY, "k"), ("tekton-mutex.dev/release-after", "deploy")]);
        assert!(
            unknown.contains("tekton-mutex.dev/release-after") && unknown.contains("queue-timeout"),
            "{unknown}"
        );
        let cluster = err(&[(KEY, "k"), (CLUSTER_MUTEX, "yes")]);
        assert!(cluster.contains("\"true\" or \"false\""), "{cluster}");
        let timeout = err(&[(KEY, "k"), (QUEUE_TIMEOUT, "soon")]);
        assert!(timeout.contains(QUEUE_TIMEOUT), "{timeout}");
        // What the controller writes is not the user's mistake.
        assert!(
            read(&annotations(&[(KEY, "k"), (TOKEN, "3"), (RECORD, "{}")]))
                .unwrap()
                .is_ok()
        );
    }

    #[test]
    fn a_param_message_names_the_annotation() {
        let m = as_annotation_message("param \"priority\" must be an integer, got \"high\"");
        assert_eq!(
            m,
            "annotation tekton-mutex.dev/priority must be an integer, got \"high\""
        );
    }
}
