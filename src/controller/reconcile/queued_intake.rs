//! Intake of a PipelineRun queued as a whole (created `PipelineRunPending` with
//! the annotation `tekton-mutex.dev/key`): refuse bad annotations, and make sure
//! the key's Mutex exists. It never starts a PipelineRun: only the lock's sync
//! does, by granting it. A refused one stays Pending, with the error on it.

use crate::controller::apply::events::{self, Transition};
use crate::controller::apply::writes;
use crate::controller::context::{Context, Error};
use crate::controller::reconcile::selection::{self, Step};
use crate::controller::reconcile::{cluster_admission, intake};
use crate::core::model::Outcome;
use crate::core::observe::cluster_mutex_targets;
use crate::core::observe::pending::PendingRun;
use crate::core::params::annotations::{self, ERROR, KEY};
use crate::core::run_status::{self, queued::refused_patch};
use crate::model::mutex::{RunKind, RunRef};
use crate::model::tekton::pipelinerun::PipelineRun;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use std::sync::Arc;
use tracing::warn;

/// The reason of the Warning on a PipelineRun that started before it could be queued.
pub const NOT_QUEUED: &str = "NotQueued";
/// The reason said on a run no lock can be created for any more (the README's uninstall).
const LOCK_DELETED: &str = run_status::Reason::LockDeleted.as_str();

pub async fn reconcile(pr: Arc<PipelineRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    if pr.is_done() || pr.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    match selection::step(&ctx, &pr).await? {
        Step::Continue => {}
        Step::Stamped => return Ok(Action::await_change()),
        Step::Refused(message) => return refuse_once(&ctx, &pr, "InvalidParams", message).await,
        Step::NotQueued(message) => return refuse_once(&ctx, &pr, NOT_QUEUED, message).await,
        Step::Later => return Ok(Action::requeue(intake::RECHECK)),
    }
    let Some(queued) = PendingRun::of(pr.clone()) else {
        return Ok(Action::await_change());
    };
    let o = queued.observe();
    if pr.is_done() || o.deleting {
        return Ok(Action::await_change());
    }
    let problem = if queued.started_unqueued() {
        let key = pr.metadata.annotations.as_ref().and_then(|a| a.get(KEY));
        Some((
            NOT_QUEUED,
            format!(
                "annotation {KEY} ({key:?}) is ignored: the PipelineRun was not created with \
                 spec.status: PipelineRunPending, so Tekton started it before tekton-mutex could \
                 queue it, and nothing is locked for it. Create it Pending to queue it"
            ),
        ))
    } else if let Some(message) = o.repointed() {
        // Its key annotation changed while it waited: it belongs to neither lock.
        Some(("InvalidParams", message))
    } else {
        match o.config() {
            Err(message) => Some(("InvalidParams", message)),
            Ok(cfg) => match cluster_mutex_targets(&o) {
                Some(Ok(names)) => cluster_admission::refusal(&ctx, &o, &names[0]).await?,
                Some(Err(message)) => Some(message),
                None => {
                    let mut cfg = cfg;
                    if let Some(lock) = selection::template(&ctx, &pr) {
                        cfg.spec.lock = lock;
                    }
                    match intake::mutex_for(&ctx, &o, &cfg).await {
                        // The README's uninstall: it stays Pending, said to wait for nothing.
                        Err(e) if writes::lock_kind_uninstalled(&e) => {
                            let uninstalling = Outcome::Uninstalling;
                            let (_, m) = run_status::condition(o.kind, &cfg.key, &uninstalling);
                            return refuse_once(&ctx, &pr, LOCK_DELETED, m).await;
                        }
                        other => other?,
                    }
                }
            }
            .map(|m| ("InvalidParams", m)),
        }
    };
    let said = pr.metadata.annotations.as_ref().and_then(|a| a.get(ERROR));
    match problem {
        Some((reason, message)) if said != Some(&message) => {
            refuse(&ctx, &queued.object, reason, &message).await?
        }
        None if said.is_some() => clear_error(&ctx, &queued).await?,
        _ => {}
    }
    let keys = o.config().map(|cfg| cfg.keys).unwrap_or_default();
    Ok(intake::recheck_while_deleting(&ctx, &o.namespace, &keys))
}

/// Write the error on the PipelineRun (it stays as it is), with a Warning Event.
async fn refuse(
    ctx: &Context,
    pr: &PipelineRun,
    reason: &'static str,
    message: &str,
) -> Result<(), Error> {
    let (ns, name) = (pr.namespace().unwrap_or_default(), pr.name_any());
    warn!(pipeline_run = %name, namespace = %ns, %message, "PipelineRun not queued");
    let kind = RunKind::PipelineRun;
    if writes::run_status(ctx, kind, &ns, &name, &refused_patch(message)).await? {
        let warning = Transition {
            reason,
            note: message.to_string(),
            type_: EventType::Warning,
        };
        let uid = pr.uid().unwrap_or_default();
        events::record(ctx, &ns, &RunRef { kind, name, uid }, warning);
    }
    Ok(())
}

/// The user fixed the annotations: the error goes.
async fn clear_error(ctx: &Context, queued: &PendingRun) -> Result<(), Error> {
    let o = queued.observe();
    let patch = serde_json::json!({"metadata": {"annotations": {ERROR: null}}});
    writes::run_status(ctx, o.kind, &o.namespace, &o.name, &patch).await?;
    Ok(())
}

/// The error on a selected PipelineRun (it stays as it is: Pending, it is never started),
/// with a Warning Event, unless it already says it.
async fn refuse_once(
    ctx: &Context,
    pr: &PipelineRun,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    let said = pr.metadata.annotations.as_ref().and_then(|a| a.get(ERROR));
    if said != Some(&message) {
        refuse(ctx, pr, reason, &message).await?;
    }
    Ok(Action::await_change())
}

/// What intake hears of: the PipelineRuns that ask to be queued and are not done,
/// and those created Pending that a lock's selector may take.
pub fn needs_intake(pr: &PipelineRun) -> bool {
    let asks = pr
        .metadata
        .annotations
        .as_ref()
        .is_some_and(annotations::opted_in);
    (asks && !pr.is_done()) || selection::may_be_selected(pr)
}
