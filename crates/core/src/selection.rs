//! Which lock takes a PipelineRun by its selector (`spec.selector`), and the
//! annotations that queue it there: the same annotations a producer could have
//! written (`tekton-mutex.dev/key`, `cluster-mutex`), plus `selected-by`, so that
//! from then on a selected run is queued, indexed and granted like an annotated one.
//!
//! Pure: the PipelineRun and the locks with a selector in, the decision out.

use crate::params::annotations::{CLUSTER_MUTEX, KEY, SELECTED_BY, SEQUENCE};
use kube::ResourceExt;
use std::collections::BTreeMap;
use tekton_mutex_api::cluster_mutex::ClusterMutex;
use tekton_mutex_api::mutex::Mutex;
use tekton_mutex_api::selector::ValueFrom;
use tekton_mutex_api::tekton::pipelinerun::PipelineRun;

/// What the selectors say of one PipelineRun.
#[derive(Clone, Debug, PartialEq)]
pub enum Selection {
    /// No selector takes it.
    Unselected,
    /// One lock takes it, and its annotations already say so.
    Stamped,
    /// One lock takes it and it is Pending: these annotations queue it there.
    Stamp {
        /// The lock, as `Mutex/<name>` or `ClusterMutex/<name>`.
        by: String,
        annotations: BTreeMap<String, String>,
    },
    /// One lock takes it, but Tekton started it before it could be queued (it was not
    /// created Pending: the admission policy is missing). The message says so.
    NotQueued(String),
    /// It cannot be queued as the selectors say; the message says why and what to do.
    Refused(String),
}

/// A lock that selects, as [`select`] reads it.
struct Selecting {
    by: String,
    key: Result<String, String>,
    /// Its `sequenceFrom`, read from the run.
    sequence: Option<Result<String, String>>,
    cluster: bool,
}

/// The lock whose selector takes `pr`. `mutexes` are those of its namespace, and
/// `allowed` says whether a ClusterMutex lets the PipelineRun's namespace use it.
pub fn select(
    pr: &PipelineRun,
    mutexes: &[&Mutex],
    cluster_mutexes: &[&ClusterMutex],
    allowed: impl Fn(&ClusterMutex) -> bool,
) -> Selection {
    let labels = pr.metadata.labels.clone().unwrap_or_default();
    let pipeline = pr
        .spec
        .pipeline_ref
        .as_ref()
        .and_then(|r| r.name.as_deref());
    let mut takers: Vec<Selecting> = Vec::new();
    for m in mutexes {
        if m.spec
            .selector
            .as_ref()
            .is_some_and(|s| s.matches(&labels, pipeline))
        {
            let key = match &m.spec.key_from {
                Some(from) => value_from(pr, &labels, from, "keyFrom")
                    .and_then(|k| crate::key_name::object_name(&k).map(|_| k)),
                None => Ok(m.spec.key.clone().unwrap_or_else(|| m.name_any())),
            };
            takers.push(Selecting {
                by: format!("Mutex/{}", m.name_any()),
                key,
                sequence: m
                    .spec
                    .sequence_from
                    .as_ref()
                    .map(|f| value_from(pr, &labels, f, "sequenceFrom")),
                cluster: false,
            });
        }
    }
    for c in cluster_mutexes {
        let takes = c
            .spec
            .selector
            .as_ref()
            .is_some_and(|s| s.matches(&labels, pipeline));
        if takes && allowed(c) {
            takers.push(Selecting {
                by: format!("ClusterMutex/{}", c.name_any()),
                key: Ok(c.name_any()),
                sequence: c
                    .spec
                    .sequence_from
                    .as_ref()
                    .map(|f| value_from(pr, &labels, f, "sequenceFrom")),
                cluster: true,
            });
        }
    }
    decide(pr, takers)
}

/// One taker: its annotations, unless the run already names another lock.
fn decide(pr: &PipelineRun, mut takers: Vec<Selecting>) -> Selection {
    if takers.len() > 1 {
        let names: Vec<&str> = takers.iter().map(|t| t.by.as_str()).collect();
        return Selection::Refused(format!(
            "the selectors of {} all take this PipelineRun: a PipelineRun is queued on one lock \
             only, so narrow those selectors until one takes it",
            names.join(" and ")
        ));
    }
    let Some(taker) = takers.pop() else {
        return Selection::Unselected;
    };
    let (key, sequence) = match (taker.key, taker.sequence.transpose()) {
        (Ok(key), Ok(sequence)) => (key, sequence),
        (Err(message), _) | (_, Err(message)) => {
            return Selection::Refused(format!("{}: {message}", taker.by));
        }
    };
    let mut annotations = BTreeMap::from([
        (KEY.to_string(), key),
        (SELECTED_BY.to_string(), taker.by.clone()),
    ]);
    // The parser judges it (an integer) like a sequence annotation the run wrote.
    annotations.extend(sequence.map(|s| (SEQUENCE.to_string(), s)));
    if taker.cluster {
        annotations.insert(CLUSTER_MUTEX.to_string(), "true".to_string());
    }
    let own = pr.metadata.annotations.clone().unwrap_or_default();
    let own_key = own.get(KEY).map(|k| k.trim());
    let own_cluster = own.get(CLUSTER_MUTEX).is_some_and(|c| c == "true");
    // Unannotated, it takes the stamp; annotated, it must already name the same lock.
    let elsewhere = match own_key {
        Some(k) => k != annotations[KEY] || own_cluster != taker.cluster,
        None => own_cluster && !taker.cluster,
    };
    if elsewhere {
        return Selection::Refused(format!(
            "{}'s selector takes this PipelineRun, but its annotations {KEY} ({:?}) and \
             {CLUSTER_MUTEX} ({:?}) name another lock: a selected PipelineRun queues where its \
             selector says, so remove those annotations",
            taker.by,
            own.get(KEY),
            own.get(CLUSTER_MUTEX),
        ));
    }
    if annotations.iter().all(|(k, v)| own.get(k) == Some(v)) {
        return Selection::Stamped;
    }
    if !pr.is_pending() {
        return Selection::NotQueued(format!(
            "{}'s selector takes this PipelineRun, but it was not created with spec.status: \
             PipelineRunPending, so Tekton started it before tekton-mutex could queue it, and \
             nothing is locked for it. Install the admission policy \
             (config/admission/queue-at-create.yaml), which makes a selected PipelineRun \
             Pending as it is created",
            taker.by
        ));
    }
    Selection::Stamp {
        by: taker.by,
        annotations,
    }
}

/// The value `from` reads from the PipelineRun (`field` names the spec field in messages).
fn value_from(
    pr: &PipelineRun,
    labels: &BTreeMap<String, String>,
    from: &ValueFrom,
    field: &str,
) -> Result<String, String> {
    let found = match (&from.param, &from.label) {
        (Some(param), _) => pr
            .spec
            .params
            .iter()
            .find(|p| &p.name == param)
            .map(|p| match &p.value {
                serde_json::Value::String(s) => Ok(s.clone()),
                other => Err(format!(
                    "{field}.param {param} must be a string param, but this PipelineRun's is {other}"
                )),
            })
            .unwrap_or_else(|| {
                Err(format!(
                    "{field}.param {param}: this PipelineRun has no param {param:?}; give it one, \
                     or narrow the selector to the PipelineRuns that have it"
                ))
            }),
        (None, Some(label)) => labels.get(label).cloned().ok_or_else(|| {
            format!(
                "{field}.label {label}: this PipelineRun has no label {label:?}; give it one, \
                 or add it to the selector (matchExpressions: Exists)"
            )
        }),
        (None, None) => Err(format!("{field} names neither a param nor a label")),
    }?;
    Ok(found.trim().to_string())
}

#[cfg(test)]
mod tests;
