//! Intake of a PipelineRun that a lock's `spec.selector` takes: fetch the locks
//! that select in its namespace, ask the core which one takes it
//! ([`crate::core::selection`]), and stamp the annotations that queue it there.
//! From then on it is an annotated queued PipelineRun like any other.

use crate::controller::apply::events::{self, Transition};
use crate::controller::apply::writes;
use crate::controller::context::{Context, Error};
use crate::controller::lock_object::NamespaceLabels;
use crate::controller::reconcile::cluster_admission;
use crate::core::params::annotations;
use crate::core::selection::{self, Selection};
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::{Mutex, RunKind, RunRef};
use crate::model::tekton::pipelinerun::PipelineRun;
use kube::ResourceExt;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use tracing::info;

/// What intake does next with a PipelineRun, as far as selectors go.
pub enum Step {
    /// Its annotations say where it queues (or no selector takes it): go on.
    Continue,
    /// The stamp was written; its change brings the PipelineRun back.
    Stamped,
    /// It cannot be queued as the selectors say: the message goes on it.
    Refused(String),
    /// A selector takes it, but Tekton started it before it could be queued: it is told so.
    NotQueued(String),
    /// The cache may be behind the lock its mark names: look again shortly.
    Later,
}

/// Which lock's selector takes `pr`, and its stamp written if it lacks it.
pub async fn step(ctx: &Context, pr: &PipelineRun) -> Result<Step, Error> {
    Ok(
        match selection_of(ctx, pr, &mut NamespaceLabels::new()).await? {
            Selection::Unselected | Selection::Stamped => Step::Continue,
            Selection::Refused(message) => Step::Refused(message),
            Selection::NotQueued(message) => Step::NotQueued(message),
            Selection::Stamp { by, annotations } => {
                stamp(ctx, pr, &by, &annotations).await?;
                Step::Stamped
            }
            Selection::LetGo { lock, message } => match cache_current(ctx, pr, &lock).await? {
                true => {
                    let_go(ctx, pr, &lock, &message).await?;
                    Step::Stamped
                }
                false => Step::Later,
            },
        },
    )
}

/// Is the cache's word on `lock` (`Mutex/<name>` or `ClusterMutex/<name>`, as a run's mark
/// names it) the API server's? A run is let go only on that word: a cache that has not seen
/// the lock yet, or its newest selector, must not start a run the lock takes.
async fn cache_current(ctx: &Context, pr: &PipelineRun, lock: &str) -> Result<bool, Error> {
    let ns = pr.namespace().unwrap_or_default();
    let (cached, live) = if let Some(name) = lock.strip_prefix("Mutex/") {
        let cached = ctx.mutexes.get(&ObjectRef::new(name).within(&ns));
        let api: kube::Api<Mutex> = kube::Api::namespaced(ctx.client.clone(), &ns);
        (
            cached.map(|m| m.resource_version()),
            api.get_opt(name).await?.map(|m| m.resource_version()),
        )
    } else if let Some(name) = lock.strip_prefix("ClusterMutex/") {
        let store = ctx.cluster_mutexes.as_ref();
        let cached = store.and_then(|s| s.get(&ObjectRef::new(name)));
        let api: kube::Api<ClusterMutex> = kube::Api::all(ctx.client.clone());
        (
            cached.map(|c| c.resource_version()),
            api.get_opt(name).await?.map(|c| c.resource_version()),
        )
    } else {
        // A mark naming no lock kind: no lock can claim the run.
        return Ok(true);
    };
    Ok(match live {
        None => true,
        Some(rv) => cached == Some(rv),
    })
}

/// Starts a run no lock takes any more, its mark removed, if it is still the PipelineRun read
/// (a compare-and-swap on its resourceVersion), with a Warning Event that says why.
async fn let_go(ctx: &Context, pr: &PipelineRun, lock: &str, message: &str) -> Result<(), Error> {
    let (ns, name) = (pr.namespace().unwrap_or_default(), pr.name_any());
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": pr.resource_version(), "annotations":
            {annotations::PENDING_FOR: null, annotations::ERROR: null}},
        "spec": {"status": null},
    });
    if writes::run_status(ctx, RunKind::PipelineRun, &ns, &name, &patch).await? {
        info!(pipeline_run = %name, namespace = %ns, lock, "no selector takes it now: let go");
        let said = Transition {
            reason: LET_GO,
            note: message.to_string(),
            type_: EventType::Warning,
        };
        let uid = pr.uid().unwrap_or_default();
        let run = RunRef {
            kind: RunKind::PipelineRun,
            name,
            uid,
        };
        events::record(ctx, &ns, &run, said);
    }
    Ok(())
}

/// The reason of the Warning on a PipelineRun let go because no selector takes it now.
pub const LET_GO: &str = "LetGo";

/// Does selection refuse this Pending run? Then no lock may grant it, whatever its
/// annotations say (a tenant cannot leave its selector's lock by annotating the run).
/// `seen` memoises namespace labels across the runs of one sync.
pub async fn refuses(
    ctx: &Context,
    pr: &PipelineRun,
    seen: &mut NamespaceLabels,
) -> Result<bool, Error> {
    if !pr.is_pending() {
        return Ok(false);
    }
    let selection = selection_of(ctx, pr, seen).await?;
    Ok(matches!(selection, Selection::Refused(_)))
}

/// What the selectors of `pr`'s namespace (and the ClusterMutexes) say of it.
async fn selection_of(
    ctx: &Context,
    pr: &PipelineRun,
    seen: &mut NamespaceLabels,
) -> Result<Selection, Error> {
    let ns = pr.namespace().unwrap_or_default();
    let mutexes: Vec<Arc<Mutex>> = ctx
        .mutexes
        .state()
        .into_iter()
        .filter(|m| m.spec.selector.is_some() && m.namespace().as_deref() == Some(&ns))
        .collect();
    let cluster: Vec<Arc<ClusterMutex>> = ctx
        .cluster_mutexes
        .as_ref()
        .map(|s| s.state())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.spec.selector.is_some())
        .collect();
    let mut allowed = Vec::new();
    for c in &cluster {
        if cluster_admission::allowed(ctx, &c.spec, &ns, seen).await? {
            allowed.push(c.name_any());
        }
    }
    let m: Vec<&Mutex> = mutexes.iter().map(Arc::as_ref).collect();
    let c: Vec<&ClusterMutex> = cluster.iter().map(Arc::as_ref).collect();
    Ok(selection::select(pr, &m, &c, |c| {
        allowed.contains(&c.name_any())
    }))
}

/// Writes the annotations that queue it, if it is still the PipelineRun read (a
/// compare-and-swap on its resourceVersion: it may have started meanwhile; then the
/// next event decides again).
async fn stamp(
    ctx: &Context,
    pr: &PipelineRun,
    by: &str,
    stamp: &std::collections::BTreeMap<String, String>,
) -> Result<(), Error> {
    let (ns, name) = (pr.namespace().unwrap_or_default(), pr.name_any());
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": pr.resource_version(), "annotations": stamp},
    });
    if writes::run_status(ctx, RunKind::PipelineRun, &ns, &name, &patch).await? {
        info!(pipeline_run = %name, namespace = %ns, lock = by, key = %stamp[annotations::KEY],
              "PipelineRun selected: queued");
    }
    Ok(())
}

/// The settings a Mutex created for a selected PipelineRun's key starts with: those of
/// the Mutex whose `keyFrom` derived the key (not its freeze: that is its own).
pub fn template(ctx: &Context, pr: &PipelineRun) -> Option<crate::model::mutex::LockSpec> {
    let by = pr
        .metadata
        .annotations
        .as_ref()?
        .get(annotations::SELECTED_BY)?;
    let name = by.strip_prefix("Mutex/")?;
    let ns = pr.namespace()?;
    let selecting = ctx.mutexes.get(&ObjectRef::new(name).within(&ns))?;
    selecting.spec.key_from.as_ref()?;
    let mut lock = selecting.spec.lock.clone();
    (lock.frozen, lock.frozen_reason) = (false, None);
    Some(lock)
}

/// What selection hears of besides annotated PipelineRuns: those the admission policy made
/// Pending (marked `tekton-mutex.dev/pending-for`), and new ones (Tekton has not reported on
/// them yet: one that a selector takes but that started unqueued is told so).
pub fn may_be_selected(pr: &PipelineRun) -> bool {
    let annotations = pr.metadata.annotations.as_ref();
    let annotated = annotations.is_some_and(annotations::opted_in);
    !annotated && !pr.is_done() && (awaits_selection(pr) || pr.status.is_none())
}

/// A run the admission policy made Pending for a selector, not yet queued.
pub fn awaits_selection(pr: &PipelineRun) -> bool {
    let annotations = pr.metadata.annotations.as_ref();
    let marked = annotations.is_some_and(|a| a.contains_key(annotations::PENDING_FOR));
    let annotated = annotations.is_some_and(annotations::opted_in);
    marked && !annotated && pr.is_pending()
}
