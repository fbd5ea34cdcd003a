//! Queue control, the apply side: cancel the PipelineRuns a person let go
//! (with who and why in an annotation and an Event), then, once the status
//! holds the acknowledgements, record each request as an Event on the Mutex
//! and remove its annotation. See [`crate::core::requests`] for the protocol.

use crate::controller::apply::writes;
use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::controller::lock_object::LockObject;
use crate::core::model::{ControlCancel, Decision};
use crate::core::requests::{
    CLEARED_BY_ANNOTATION, Dismissal, RELEASED_BY_ANNOTATION, REQUEST_PREFIX, Request, Unreadable,
    Verdict,
};
use crate::core::run_status::Reason;
use crate::model::mutex::MutexStatus;
use crate::model::tekton::pipelinerun::PipelineRun;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, ResourceExt};
use serde_json::json;
use tracing::{info, warn};

/// Cancel each PipelineRun let go; a failure is kept (the first) and the rest go on.
pub async fn cancel_all(
    ctx: &Context,
    key: &str,
    cancels: &[(String, ControlCancel)],
    first_error: &mut Option<Error>,
) {
    for (ns, c) in cancels {
        if let Err(e) = cancel(ctx, ns, key, c).await {
            warn!(key, pipeline_run = %c.pipeline_run, error = %e, "could not cancel a PipelineRun let go");
            first_error.get_or_insert(e);
        }
    }
}

async fn cancel(ctx: &Context, ns: &str, key: &str, c: &ControlCancel) -> Result<(), Error> {
    let api: Api<PipelineRun> = Api::namespaced(ctx.client.clone(), ns);
    let Some(pr) = api.get_opt(&c.pipeline_run).await? else {
        return Ok(());
    };
    if pr.is_done() || pr.stop_requested() || pr.uid().as_deref() != Some(&c.pipeline_run_uid) {
        return Ok(());
    }
    let (annotation, reason) = match c.dismissal {
        Dismissal::Released => (RELEASED_BY_ANNOTATION, Reason::Released),
        Dismissal::Cleared => (CLEARED_BY_ANNOTATION, Reason::Cleared),
    };
    // metadata.uid is immutable: the patch fails on a PipelineRun re-created under the name.
    let patch = json!({
        "metadata": {"uid": c.pipeline_run_uid, "annotations": {annotation: c.message}},
        "spec": {"status": c.mode.as_str()},
    });
    ctx.metrics.api_write("patch", "pipelineruns");
    let pp = PatchParams::default();
    match api.patch(&c.pipeline_run, &pp, &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    info!(key, pipeline_run = %c.pipeline_run, message = %c.message, mode = c.mode.as_str(), "cancelled a PipelineRun let go by a person");
    let reference = writes::pipeline_run_reference(ns, &c.pipeline_run, &c.pipeline_run_uid);
    let note = format!(
        "on mutex {key}: {}; cancelled with {}",
        c.message,
        c.mode.as_str()
    );
    publish(ctx, &reference, reason, note, EventType::Warning).await;
    Ok(())
}

/// After the status write: each request newly acknowledged is recorded as an
/// Event on the Mutex, and every request annotation decided on is removed
/// (the acknowledgement in the status is what the CLI reads).
pub async fn acknowledge<L: LockObject>(
    ctx: &Context,
    mutex: &L,
    before: &MutexStatus,
    decision: &Decision,
    requests: &[Result<Request, Unreadable>],
) -> Result<(), Error> {
    if requests.is_empty() {
        return Ok(());
    }
    let (scope, key) = (mutex.scope(), mutex.name_any());
    let ns = scope.label();
    let reference = mutex.object_ref(&());
    for o in decision
        .status
        .observed_requests
        .iter()
        .filter(|o| !before.observed_requests.iter().any(|b| b.id == o.id))
    {
        let what = o.action.map_or("request", |a| a.as_str());
        let (reason, type_) = match o.verdict {
            Verdict::Done => ("QueueControl", EventType::Normal),
            Verdict::Refused => ("QueueControlRefused", EventType::Warning),
        };
        let note = format!("{what} by {} ({}): {}", o.by, o.id, o.message);
        info!(key, namespace = ns, id = %o.id, verdict = ?o.verdict, "{note}");
        publish_as(ctx, &reference, reason, note, type_).await;
    }
    let remove: serde_json::Map<String, serde_json::Value> = requests
        .iter()
        .map(|r| match r {
            Ok(r) => &r.id,
            Err(u) => &u.id,
        })
        .map(|id| (format!("{REQUEST_PREFIX}{id}"), serde_json::Value::Null))
        .collect();
    let patch = json!({"metadata": {"annotations": remove}});
    ctx.metrics.api_write("patch", L::PLURAL);
    let api = L::api(&ctx.client, &scope);
    match api
        .patch(&key, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn publish(
    ctx: &Context,
    reference: &ObjectReference,
    reason: Reason,
    note: String,
    type_: EventType,
) {
    publish_as(ctx, reference, reason.as_str(), note, type_).await
}

/// An Event is a courtesy: failing to record one never fails the sync.
async fn publish_as(
    ctx: &Context,
    reference: &ObjectReference,
    reason: &str,
    note: String,
    type_: EventType,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "QueueControl".into(),
        secondary: None,
    };
    ctx.metrics.api_write("create", "events");
    if let Err(e) = ctx.recorder.publish(&event, reference).await {
        warn!(error = %e, object = ?reference.name, "could not record a queue-control event");
    }
}
