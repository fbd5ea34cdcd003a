//! Which lock takes a PipelineRun by its selector (`spec.selector`), and the
//! annotations that queue it there: the same annotations a producer could have
//! written (`tekton-mutex.dev/key`, `cluster-mutex`), plus `selected-by`, so that
//! from then on a selected run is queued, indexed and granted like an annotated one.
//!
//! Pure: the PipelineRun and the locks with a selector in, the decision out.

use crate::params::annotations::{CLUSTER_MUTEX, KEY, PENDING_FOR, SELECTED_BY, SEQUENCE};
use kube::ResourceExt;
use std::collections::BTreeMap;
use tekton_mutex_api::cluster_mutex::ClusterMutex;
use tekton_mutex_api::mutex::MAX_TOKEN;
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
    /// The admission policy made it Pending for `lock` (`Mutex/<name>` or
    /// `ClusterMutex/<name>`), whose selector no longer takes it (changed, or the lock is
    /// gone), and no other lock does: no lock holds it back, so it is let go (started, its
    /// mark removed), as it would have run had it been created now. The message says why.
    LetGo { lock: String, message: String },
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
    // A run Tekton has started is past selection (and the cache no longer keeps its labels).
    if !pr.is_pending() && pr.status.is_some() {
        return Selection::Unselected;
    }
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
    let own = pr.metadata.annotations.clone().unwrap_or_default();
    if takers.len() > 1 {
        let mut names: Vec<&str> = takers.iter().map(|t| t.by.as_str()).collect();
        names.sort();
        return Selection::Refused(format!(
            "the selectors of {} all take this PipelineRun: a PipelineRun is queued on one lock \
             only, so narrow those selectors until one takes it",
            names.join(" and ")
        ));
    }
    let Some(taker) = takers.pop() else {
        return unselected(pr, &own);
    };
    let annotations = match stamp_of(&taker) {
        Ok(annotations) => annotations,
        Err(message) => return Selection::Refused(format!("{}: {message}", taker.by)),
    };
    if let Some(message) = names_elsewhere(&own, &taker) {
        return Selection::Refused(message);
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
    // Pending, but neither by the admission policy nor with a key: someone else holds it back
    // (its producer, an approval, another queue), and only they may start it.
    if !own.contains_key(PENDING_FOR) && !own.contains_key(KEY) {
        return Selection::Unselected;
    }
    Selection::Stamp {
        by: taker.by,
        annotations,
    }
}

/// No selector takes it. One the admission policy made Pending for a selector that no longer
/// takes it (changed, or its lock deleted) would wait for nothing: it is let go.
fn unselected(pr: &PipelineRun, own: &BTreeMap<String, String>) -> Selection {
    match own.get(PENDING_FOR) {
        Some(lock) if pr.is_pending() && !own.contains_key(KEY) => Selection::LetGo {
            lock: lock.clone(),
            message: format!(
                "let go without a lock: the admission policy made this PipelineRun Pending at \
                 create because {}'s selector took it, but no selector takes it now (it \
                 changed, or the lock is gone), so tekton-mutex started it, as it would have \
                 run had it been created now",
                bounded(lock)
            ),
        },
        _ => Selection::Unselected,
    }
}

/// The annotations that queue a run where `taker` says.
fn stamp_of(taker: &Selecting) -> Result<BTreeMap<String, String>, String> {
    let key = taker.key.clone()?;
    let mut annotations = BTreeMap::from([
        (KEY.to_string(), key),
        (SELECTED_BY.to_string(), taker.by.clone()),
    ]);
    if let Some(sequence) = taker.sequence.clone().transpose()? {
        let fits = sequence
            .parse::<i64>()
            .is_ok_and(|n| (0..=MAX_TOKEN).contains(&n));
        if !fits {
            return Err(format!(
                "sequenceFrom gives {}, not an integer from 0 to {MAX_TOKEN}",
                bounded(&sequence)
            ));
        }
        annotations.insert(SEQUENCE.to_string(), sequence);
    }
    if taker.cluster {
        annotations.insert(CLUSTER_MUTEX.to_string(), "true".to_string());
    }
    Ok(annotations)
}

/// Why the run's own key annotations keep it from `taker`'s lock: a tenant cannot leave the
/// lock a selector puts its runs in. Unannotated, it takes the stamp.
fn names_elsewhere(own: &BTreeMap<String, String>, taker: &Selecting) -> Option<String> {
    let key = taker.key.as_deref().ok()?.trim();
    let own_cluster = own.get(CLUSTER_MUTEX).is_some_and(|c| c == "true");
    let elsewhere = match own.get(KEY).map(|k| k.trim()) {
        Some(k) => k != key || own_cluster != taker.cluster,
        None => own_cluster && !taker.cluster,
    };
    elsewhere.then(|| {
        format!(
            "{}'s selector takes this PipelineRun, but its annotations {KEY} ({}) and \
             {CLUSTER_MUTEX} ({}) name another lock: a selected PipelineRun queues where its \
             selector says, so remove those annotations",
            taker.by,
            bounded(own.get(KEY).map_or("none", String::as_str)),
            bounded(own.get(CLUSTER_MUTEX).map_or("none", String::as_str)),
        )
    })
}

/// A value as a message quotes it: at most 64 characters, so a huge one cannot make the
/// message itself too large to write.
fn bounded(value: &str) -> String {
    match value.char_indices().nth(64) {
        Some((end, _)) => format!("{:?}...", &value[..end]),
        None => format!("{value:?}"),
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
                    "{field}.param {param} must be a string param, but this PipelineRun's is {}",
                    bounded(&other.to_string())
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
