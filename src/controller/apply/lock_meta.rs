//! The writes of a lock object's metadata: its finalizer on and off (reconcile/finalizer.rs says
//! when), the stamp of when it became idle, and its deletion once idle long enough
//! (reconcile/idle_deletion.rs says when). Each is a compare-and-swap on the resourceVersion
//! read, so a change in between is decided again first.

use crate::controller::context::{Context, Error};
use crate::controller::lock_object::LockObject;
use jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;
use tracing::info;

/// On an idle lock: when it became idle (RFC 3339), stamped with the finalizer's
/// removal, cleared when it goes back on (see `idle_deletion`).
pub const IDLE_SINCE: &str = "tekton-mutex.dev/idle-since";

/// On a lock with a `spec.selector`: the admission policies that make selected PipelineRuns
/// Pending take only the locks so labelled as params (config/admission/queue-at-create.yaml
/// labels them as they are written; this labels one that predates that policy).
pub const SELECTS: &str = "tekton-mutex.dev/selects";

/// Labels a selecting lock [`SELECTS`] if it is not yet (a lock written before the admission
/// policy that labels them was installed, or upgraded to): until then no PipelineRun create
/// sees its selector. A compare-and-swap; its change brings the lock back.
pub async fn label_selecting<L: LockObject>(ctx: &Context, lock: &L) -> Result<bool, Error> {
    let labelled = lock.labels().get(SELECTS).map(String::as_str) == Some("true");
    if !lock.selects() || labelled {
        return Ok(false);
    }
    let patch = json!({"metadata": {
        "labels": {SELECTS: "true"},
        "resourceVersion": lock.resource_version(),
    }});
    patch_metadata(ctx, lock, &patch).await?;
    info!(lock = %lock.name_any(), "labelled a selecting lock for the admission policy");
    Ok(true)
}

/// A merge patch of `lock`'s metadata, conditioned on the resourceVersion in `patch`: a
/// conflict is decided again.
async fn patch_metadata<L: LockObject>(
    ctx: &Context,
    lock: &L,
    patch: &serde_json::Value,
) -> Result<L, Error> {
    let api = L::api(&ctx.client, &lock.scope());
    ctx.metrics.api_write("patch", L::PLURAL);
    match api
        .patch(
            &lock.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await
    {
        Ok(patched) => Ok(patched),
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::Conflict),
        Err(e) => Err(e.into()),
    }
}

/// Keeps a lock with holders, waiters or reservations from being removed.
pub const LOCK_STATE_FINALIZER: &str = "tekton-mutex.dev/lock-state";

/// Add the finalizer before the status write that puts someone in the lock,
/// with a compare-and-swap on the resourceVersion we read. Returns the lock
/// with its new resourceVersion, so the status write that follows still applies.
pub async fn protect<L: LockObject>(ctx: &Context, mut lock: L) -> Result<L, Error> {
    let mut finalizers = lock.finalizers().to_vec();
    finalizers.push(LOCK_STATE_FINALIZER.into());
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "annotations": {IDLE_SINCE: null},
        "resourceVersion": lock.resource_version(),
    }});
    let patched = patch_metadata(ctx, &lock, &patch).await?;
    lock.meta_mut().resource_version = patched.resource_version();
    lock.meta_mut().finalizers = patched.meta().finalizers.clone();
    Ok(lock)
}

/// Take the finalizer off the idle lock `lock` (read fresh, its `lastToken` already in the
/// ledger) and stamp when it became idle. True if removed; a conflict is decided again.
pub async fn remove_finalizer<L: LockObject>(
    ctx: &Context,
    lock: &L,
    last_token: i64,
) -> Result<bool, Error> {
    let (scope, key) = (lock.scope(), lock.name_any());
    let finalizers: Vec<&String> = lock
        .finalizers()
        .iter()
        .filter(|f| *f != LOCK_STATE_FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "annotations": {IDLE_SINCE: Timestamp::now().to_string()},
        "resourceVersion": lock.resource_version(),
    }});
    ctx.metrics.api_write("patch", L::PLURAL);
    match L::api(&ctx.client, &scope)
        .patch(&key, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => {
            info!(
                key,
                namespace = scope.label(),
                last_token,
                deleting = lock.meta().deletion_timestamp.is_some(),
                "the lock is idle: its last token recorded, finalizer removed"
            );
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Err(Error::Conflict),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Stamp `IDLE_SINCE` on an idle lock that has none (one idle from before the stamp existed).
pub async fn stamp_idle_since<L: LockObject>(
    ctx: &Context,
    lock: &L,
    now: Timestamp,
) -> Result<(), Error> {
    let patch = json!({"metadata": {
        "annotations": {IDLE_SINCE: now.to_string()},
        "resourceVersion": lock.resource_version(),
    }});
    ctx.metrics.api_write("patch", L::PLURAL);
    match L::api(&ctx.client, &lock.scope())
        .patch(
            &lock.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        other => other.map(drop).map_err(Error::from),
    }
}

/// Delete a lock idle for longer than it is kept, only as it was read (uid and resourceVersion):
/// a run arriving in between wins.
pub async fn delete_idle<L: LockObject>(ctx: &Context, lock: &L) -> Result<(), Error> {
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: lock.resource_version(),
            uid: lock.uid(),
        }),
        ..Default::default()
    };
    ctx.metrics.api_write("delete", L::PLURAL);
    match L::api(&ctx.client, &lock.scope())
        .delete(&lock.name_any(), &params)
        .await
    {
        Ok(_) => {
            info!(key = %lock.name_any(), namespace = lock.scope().label(), "deleted the Mutex: idle for spec.idleDeleteDays");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
