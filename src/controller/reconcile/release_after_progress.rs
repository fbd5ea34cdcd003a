//! `release-after` in the controller (the pure part is src/release_after.rs):
//! is a run's section of its PipelineRun over, and may the run use the param?
//! Both are asked of the API, not of caches: a release depends on the first,
//! and Tekton records the resolved pipeline only after creating the run.

use crate::controller::backoff::backoff_key;
use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::core::observe::{Observe, ObservedRun};
use crate::core::params::RunConfig;
use crate::core::release_after::{self, NamesCheck};
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::labels::PIPELINE_TASK_LABEL;
use crate::model::tekton::pipelinerun::{ChildReference, PipelineRun};
use crate::model::tekton::run::Run;
use crate::model::tekton::taskrun::TaskRun;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};

/// When intake looks again for a run's PipelineRun's resolved pipeline: soon
/// at first (Tekton records it right after creating the run), then ever more
/// rarely, per run, by the per-object backoff. A run whose PipelineRun never
/// starts (one created Pending, or a forged run) so costs next to nothing.
pub fn recheck<K: Resource<DynamicType = ()>>(ctx: &Context, obj: &K) -> Action {
    Action::requeue(ctx.backoff.failed(recheck_key(obj)))
}

/// Its own key: a successful reconcile (a wait is one) must not reset it.
fn recheck_key<K: Resource<DynamicType = ()>>(obj: &K) -> String {
    format!("release-after/{}", backoff_key(obj))
}

/// The pipeline task a run (or any child of a PipelineRun) runs for.
pub fn own_task<K: Observe>(obj: &K) -> Option<&str> {
    obj.label(PIPELINE_TASK_LABEL)
}

/// Intake's check. A run whose PipelineRun is gone is left to the sync.
pub async fn check<K: Observe + Resource<DynamicType = ()>>(
    ctx: &Context,
    o: &ObservedRun<'_>,
    obj: &K,
    cfg: &RunConfig,
) -> Result<NamesCheck, Error> {
    if cfg.release_after.is_empty() {
        return Ok(NamesCheck::Fine);
    }
    let verdict = judge(ctx, o, obj, cfg).await?;
    if verdict != NamesCheck::NotYet {
        ctx.backoff.succeeded(&recheck_key(obj));
    }
    Ok(verdict)
}

async fn judge<K: Observe>(
    ctx: &Context,
    o: &ObservedRun<'_>,
    obj: &K,
    cfg: &RunConfig,
) -> Result<NamesCheck, Error> {
    let own = own_task(obj);
    let Some((name, uid)) = &o.parent else {
        return Ok(release_after::check(&cfg.release_after, own, None));
    };
    let same = |p: &PipelineRun| p.uid().as_deref() == Some(uid.as_str());
    let cached = ctx
        .pipeline_runs
        .get(&ObjectRef::new(name).within(&o.namespace));
    let recorded = |p: &PipelineRun| p.status.as_ref().is_some_and(|s| s.pipeline_spec.is_some());
    let pr = match cached.filter(|p| same(p) && recorded(p)) {
        Some(p) => Some(p),
        None => Api::<PipelineRun>::namespaced(ctx.client.clone(), &o.namespace)
            .get_opt(name)
            .await?
            .filter(same)
            .map(std::sync::Arc::new),
    };
    let Some(pr) = pr else {
        return Ok(NamesCheck::Fine);
    };
    Ok(release_after::check(&cfg.release_after, own, Some(&pr)))
}

/// Whether the sync may enrol a new run: its names fit its PipelineRun (one
/// that is gone or done cannot say, as the cache keeps no pipeline of a done
/// one, and such a run only ever leaves).
pub fn enrols<K: Observe>(cfg: &RunConfig, obj: &K, parent: Option<Option<&PipelineRun>>) -> bool {
    let names = &cfg.release_after;
    match parent {
        Some(None) => true,
        Some(Some(pr)) if pr.is_done() => true,
        Some(pr) => release_after::check(names, own_task(obj), pr) == NamesCheck::Fine,
        None => release_after::check(names, own_task(obj), None) == NamesCheck::Fine,
    }
}

/// Are the named tasks of this running PipelineRun all done (succeeded, failed
/// or skipped), with no pod of theirs still running or terminating?
pub async fn done(
    ctx: &Context,
    ns: &str,
    pr: &PipelineRun,
    names: &[String],
) -> Result<bool, Error> {
    let Some(children) = release_after::children(pr, names) else {
        return Ok(false);
    };
    for c in children {
        if !child_done(ctx, ns, c).await? {
            return Ok(false);
        }
    }
    let (name, uid) = (pr.name_any(), pr.uid().unwrap_or_default());
    for task in names {
        if crate::controller::reconcile::pipeline_runs::live_pods_of(
            ctx,
            ns,
            &name,
            &uid,
            Some(task),
        )
        .await?
        {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A child that is gone is done (its pods are checked separately); a kind we
/// do not know is never done, so the PipelineRun's end releases it.
async fn child_done(ctx: &Context, ns: &str, c: &ChildReference) -> Result<bool, Error> {
    let client = ctx.client.clone();
    Ok(match c.kind.as_str() {
        "TaskRun" => Api::<TaskRun>::namespaced(client, ns)
            .get_opt(&c.name)
            .await?
            .is_none_or(|t| t.is_done()),
        "CustomRun" => Api::<CustomRun>::namespaced(client, ns)
            .get_opt(&c.name)
            .await?
            .is_none_or(|r| {
                crate::model::tekton::is_done(r.status.as_ref().and_then(|s| s.succeeded()))
            }),
        "Run" => Api::<Run>::namespaced(client, ns)
            .get_opt(&c.name)
            .await?
            .is_none_or(|r| {
                crate::model::tekton::is_done(r.status.as_ref().and_then(|s| s.succeeded()))
            }),
        _ => false,
    })
}
