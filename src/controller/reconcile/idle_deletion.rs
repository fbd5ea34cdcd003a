//! Free-form keys make Mutexes that no one removes: a repo URL per pull request
//! would grow the cluster's objects, and the controller's caches, without bound.
//! So a Mutex the controller created itself (never one a person or GitOps
//! applied) goes once it has been idle for `spec.idleDeleteDays`.
//!
//! Idle means no finalizer: it comes off when the lock empties, right after its
//! `lastToken` went into the token ledger (finalizer.rs), and that same patch
//! stamps `IDLE_SINCE`; the patch that puts the finalizer back clears it. The
//! delete is conditional on the resourceVersion read, so a run arriving in
//! between wins; a key that comes back gets a new Mutex whose tokens continue
//! above the ledger's.

use crate::controller::apply::lock_meta;
use crate::controller::context::{Context, Error};
use crate::controller::lock_object::LockObject;
use crate::controller::reconcile::finalizer::{self, IDLE_SINCE};
use jiff::Timestamp;
use kube::ResourceExt;

/// When the idle lock `lock` may go: None if never (not ours to delete, or kept).
fn expiry<L: LockObject>(lock: &L) -> Option<Timestamp> {
    let keep = lock.idle_delete_after()?;
    let since: Timestamp = lock.annotations().get(IDLE_SINCE)?.parse().ok()?;
    since.checked_add(keep).ok()
}

/// After a sync that left `lock` idle and unprotected: stamp when it became idle
/// if no one did (a lock idle from before), or delete it once that is long enough ago.
pub async fn settle<L: LockObject>(ctx: &Context, lock: &L, now: Timestamp) -> Result<(), Error> {
    if lock.idle_delete_after().is_none() || finalizer::protected(lock) {
        return Ok(());
    }
    if !lock.annotations().contains_key(IDLE_SINCE) {
        return lock_meta::stamp_idle_since(ctx, lock, now).await;
    }
    if expiry(lock).is_none_or(|at| at > now) {
        return Ok(());
    }
    lock_meta::delete_idle(ctx, lock).await
}
