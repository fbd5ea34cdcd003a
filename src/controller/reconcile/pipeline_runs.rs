//! What a lock run's PipelineRun still does: the PipelineRun itself, and whether
//! any of its pods (or one task's pods, for `release-after`) still runs. A
//! release rests on these, so a pod is asked of the API, never of a cache.

use crate::controller::context::{Context, Error};
use crate::core::observe::LIVE_PODS;
use crate::model::tekton::labels::{
    PIPELINE_RUN_LABEL, PIPELINE_RUN_UID_LABEL, PIPELINE_TASK_LABEL,
};
use crate::model::tekton::pipelinerun::PipelineRun;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;

/// The run's PipelineRun, from the cache when it has it, else from the API.
/// None means it is gone (deleted, being deleted, or replaced under the same name).
pub async fn fetch_parent(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<Option<Arc<PipelineRun>>, Error> {
    let cached = ctx.pipeline_runs.get(&ObjectRef::new(name).within(ns));
    let pr = match cached.filter(|p| p.uid().as_deref() == Some(uid)) {
        Some(p) => Some(p),
        None => Api::<PipelineRun>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await?
            .filter(|p| p.uid().as_deref() == Some(uid))
            .map(Arc::new),
    };
    Ok(pr.filter(|p| p.meta().deletion_timestamp.is_none()))
}

/// Does a pod of this PipelineRun still exist in a non-terminal phase (running,
/// pending, or terminating with a deletionTimestamp)?
pub async fn pods_alive(ctx: &Context, ns: &str, name: &str, uid: &str) -> Result<bool, Error> {
    live_pods_of(ctx, ns, name, uid, None).await
}

/// Live pods of this PipelineRun, or of one of its pipeline tasks (`release-after`).
pub async fn live_pods_of(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: &str,
    task: Option<&str>,
) -> Result<bool, Error> {
    let mut selector = format!("{PIPELINE_RUN_LABEL}={name}");
    if let Some(task) = task {
        selector.push_str(&format!(",{PIPELINE_TASK_LABEL}={task}"));
    }
    let params = ListParams::default().labels(&selector).fields(LIVE_PODS);
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .list_metadata(&params)
        .await?;
    // Pods of an older PipelineRun of the same name do not count.
    Ok(pods.items.iter().any(|p| {
        p.labels()
            .get(PIPELINE_RUN_UID_LABEL)
            .is_none_or(|u| u == uid)
    }))
}
