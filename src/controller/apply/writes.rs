//! Every write the controller makes, one function per kind of write.
//! All are patches of fields we own, so nothing we do not model is lost.

use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::controller::lock_object::LockObject;
use crate::core::model::Cancel;
use crate::core::observe::ObservedRun;
use crate::core::run_status::{self, Reason};
use crate::model::mutex::{Mutex, MutexSpec, RunKind, RunRef};
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

/// What the controller creates carries `MANAGED_BY: MANAGER` (and only a Mutex
/// it created may be deleted when idle).
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const MANAGER: &str = "tekton-mutex";

/// The resource a run's status is written through.
fn status_resource(kind: RunKind) -> &'static str {
    match kind {
        RunKind::CustomRun => "customruns/status",
        RunKind::Run => "runs/status",
        // A queued PipelineRun is told through its annotations and spec.status.
        RunKind::PipelineRun => "pipelineruns",
    }
}
/// On a PipelineRun cancelled because it was superseded: the newer PipelineRun.
pub const SUPERSEDED_BY_ANNOTATION: &str = crate::core::run_status::queued::SUPERSEDED_BY;

pub enum Ensured {
    Created,
    /// Someone created it first; this is its spec.
    Existing(Box<MutexSpec>),
}

/// Create the Mutex object for a key, unless it exists.
pub async fn ensure_mutex(
    ctx: &Context,
    ns: &str,
    key: &str,
    spec: &MutexSpec,
) -> Result<Ensured, Error> {
    let api: Api<Mutex> = Api::namespaced(ctx.client.clone(), ns);
    let mut m = Mutex::new(key, spec.clone());
    m.metadata = ObjectMeta {
        name: Some(key.into()),
        namespace: Some(ns.into()),
        labels: Some([(MANAGED_BY.to_string(), MANAGER.to_string())].into()),
        ..Default::default()
    };
    ctx.metrics.api_write("create", "mutexes");
    match api.create(&PostParams::default(), &m).await {
        Ok(_) => Ok(Ensured::Created),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            Ok(Ensured::Existing(Box::new(api.get(key).await?.spec)))
        }
        Err(e) => Err(e.into()),
    }
}

/// The API server's answer to creating a lock whose CustomResourceDefinition is being deleted,
/// or is gone (the README's uninstall deletes it while the controller still runs).
pub fn lock_kind_uninstalled(e: &Error) -> bool {
    matches!(e, Error::Kube(kube::Error::Api(s))
        if (s.code == 403 && s.message.contains("custom resource definition is terminating"))
            // Gone: the kind (could not find the requested resource), or its whole API group
            // (the bare "404 page not found", once no CRD of tekton-mutex.dev is left).
            || (s.code == 404 && (s.message.contains("could not find the requested resource")
                || s.message.contains("404 page not found"))))
}

/// Write a lock's status, only if nobody changed the object since we read it.
pub async fn lock_status<L: LockObject>(ctx: &Context, lock: &L) -> Result<(), Error> {
    let api = L::api(&ctx.client, &lock.scope());
    ctx.metrics
        .api_write("update", &format!("{}/status", L::PLURAL));
    match api
        .replace_status(&lock.name_any(), &PostParams::default(), lock)
        .await
    {
        Ok(written) => {
            L::written(ctx).wrote(lock.resource_version(), written);
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::Conflict),
        Err(e) => {
            let resource = format!("{}/status", L::PLURAL);
            ctx.metrics.api_write_failed("update", &resource);
            Err(e.into())
        }
    }
}

/// Patch a run's status subresource; true if it was written. A conflict or a
/// vanished run is not an error: the change that caused it triggers another sync.
pub async fn run_status(
    ctx: &Context,
    kind: RunKind,
    ns: &str,
    name: &str,
    patch: &Value,
) -> Result<bool, Error> {
    let pp = PatchParams::default();
    ctx.metrics.api_write("patch", status_resource(kind));
    let res = match kind {
        RunKind::CustomRun => Api::<CustomRun>::namespaced(ctx.client.clone(), ns)
            .patch_status(name, &pp, &Patch::Merge(patch))
            .await
            .map(|_| ()),
        RunKind::Run => Api::<Run>::namespaced(ctx.client.clone(), ns)
            .patch_status(name, &pp, &Patch::Merge(patch))
            .await
            .map(|_| ()),
        RunKind::PipelineRun => Api::<PipelineRun>::namespaced(ctx.client.clone(), ns)
            .patch(name, &pp, &Patch::Merge(patch))
            .await
            .map(|_| ()),
    };
    match res {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
            debug!(
                run = name,
                code = e.code,
                "run changed under us; the next sync catches up"
            );
            Ok(false)
        }
        Err(e) => {
            ctx.metrics.api_write_failed("patch", status_resource(kind));
            Err(e.into())
        }
    }
}

pub async fn invalid_params(
    ctx: &Context,
    o: &ObservedRun<'_>,
    message: &str,
) -> Result<bool, Error> {
    let patch = run_status::invalid_params_patch(message, &o.status, Timestamp::now());
    run_status(ctx, o.kind, &o.namespace, &o.name, &patch).await
}

/// The PipelineRun a cancel is for, as an Event's subject.
pub fn pipeline_run_reference(ns: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(PipelineRun::api_version(&()).into()),
        kind: Some(PipelineRun::kind(&()).into()),
        name: Some(name.into()),
        namespace: Some(ns.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

/// Cancel a superseded PipelineRun (unless it is already over or stopping),
/// and record who superseded it as an Event on it.
pub async fn cancel_pipeline_run(
    ctx: &Context,
    ns: &str,
    key: &str,
    c: &Cancel,
) -> Result<(), Error> {
    let api: Api<PipelineRun> = Api::namespaced(ctx.client.clone(), ns);
    // Read it fresh: a done PipelineRun must not be patched.
    let Some(pr) = api.get_opt(&c.pipeline_run).await? else {
        return Ok(());
    };
    // Never the wrong one: a PipelineRun re-created under the name is left alone.
    if pr.is_done() || pr.stop_requested() || pr.uid().as_deref() != Some(&c.pipeline_run_uid) {
        return Ok(());
    }
    // No resourceVersion precondition: Tekton updates a running PipelineRun often,
    // and setting spec.status is idempotent. The annotation rides in the same patch,
    // so a cancelled PipelineRun always says who superseded it.
    // metadata.uid is immutable, so it makes the patch fail on any other object.
    let patch = json!({
        "metadata": {
            "uid": c.pipeline_run_uid,
            "annotations": {SUPERSEDED_BY_ANNOTATION: c.superseded_by},
        },
        "spec": {"status": c.mode.as_str()},
    });
    ctx.metrics.api_write("patch", "pipelineruns");
    match api
        .patch(
            &c.pipeline_run,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    ctx.metrics
        .cancels
        .get_or_create(&crate::metrics::Ns {
            namespace: ns.into(),
        })
        .inc();
    info!(key, group = %c.group, pipeline_run = %c.pipeline_run, superseded_by = %c.superseded_by, mode = c.mode.as_str(), "cancelled superseded PipelineRun");
    let reference = ObjectReference {
        api_version: Some(PipelineRun::api_version(&()).into()),
        kind: Some(PipelineRun::kind(&()).into()),
        name: Some(c.pipeline_run.clone()),
        namespace: Some(ns.into()),
        uid: pr.uid(),
        ..Default::default()
    };
    let note = format!(
        "superseded by newer PipelineRun {} on mutex {key} (group {}); cancelled with {}",
        c.superseded_by,
        c.group,
        c.mode.as_str()
    );
    publish_superseded(ctx, &reference, note, "Cancel").await;
    Ok(())
}

/// Record on a lock run that it was superseded (its status says so too).
pub async fn superseded_event(
    ctx: &Context,
    ns: &str,
    key: &str,
    run: &RunRef,
    by: &str,
    group: &str,
) {
    let reference = ObjectReference {
        api_version: Some(run.kind.api_version().into()),
        kind: Some(run.kind.as_str().into()),
        name: Some(run.name.clone()),
        namespace: Some(ns.into()),
        uid: Some(run.uid.clone()),
        ..Default::default()
    };
    let note = format!("superseded by newer PipelineRun {by} on mutex {key} (group {group})");
    publish_superseded(ctx, &reference, note, "Supersede").await;
}

/// An Event is a courtesy: failing to record one never fails the sync.
async fn publish_superseded(
    ctx: &Context,
    reference: &ObjectReference,
    note: String,
    action: &str,
) {
    let event = Event {
        type_: EventType::Normal,
        reason: Reason::Superseded.as_str().into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    ctx.metrics.api_write("create", "events");
    if let Err(e) = ctx.recorder.publish(&event, reference).await {
        warn!(error = %e, object = ?reference.name, "could not record the Superseded event");
    }
}

/// Write a token ledger ConfigMap (reconcile/token_floor.rs): a compare-and-swap on the
/// resourceVersion read if it `exists`, else its creation.
pub async fn token_ledger(
    ctx: &Context,
    api: &Api<ConfigMap>,
    ledger: &ConfigMap,
    exists: bool,
) -> Result<ConfigMap, kube::Error> {
    let verb = if exists { "update" } else { "create" };
    ctx.metrics.api_write(verb, "configmaps");
    match exists {
        true => {
            let name = ledger.metadata.name.as_deref().unwrap_or_default();
            api.replace(name, &PostParams::default(), ledger).await
        }
        false => api.create(&PostParams::default(), ledger).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(code: u16, message: &str) -> Error {
        Error::Kube(kube::Error::Api(
            serde_json::from_value(serde_json::json!({
                "status": "Failure", "code": code, "message": message, "reason": ""
            }))
            .unwrap(),
        ))
    }

    /// The API server's three answers to a create of a lock once the README's uninstall deleted
    /// its CRD (as the local control plane gives them), and look-alikes that are something else.
    #[test]
    fn an_uninstalled_lock_kind_is_told_from_other_refusals() {
        let terminating = "mutexes.tekton-mutex.dev \"env\" is forbidden: create not allowed \
                           while custom resource definition is terminating";
        assert!(lock_kind_uninstalled(&answer(403, terminating)));
        let kind_gone = "the server could not find the requested resource";
        assert!(lock_kind_uninstalled(&answer(404, kind_gone)));
        assert!(lock_kind_uninstalled(&answer(404, "404 page not found")));
        let rbac = "mutexes.tekton-mutex.dev is forbidden: User \"x\" cannot create resource";
        assert!(!lock_kind_uninstalled(&answer(403, rbac)));
        let namespace = "namespaces \"gone\" not found";
        assert!(!lock_kind_uninstalled(&answer(404, namespace)));
    }
}
