//! A lock object in use is protected: a finalizer keeps a Mutex or ClusterMutex
//! that has holders, waiters or reservations from being removed. `kubectl delete`
//! then only marks it; the sync keeps serving its holders and waiters, admits no
//! one new, and takes the finalizer off once the lock is empty. The newcomers then
//! get a new Mutex, whose lock state is rebuilt from the runs (their tokens), never
//! reset, and whose tokens continue above the last one of the lock that went.
//!
//! The finalizer is on only while the lock is in use: it comes off as soon as the
//! lock is idle, once its `lastToken` is in the token ledger (token_floor.rs). So
//! an idle lock can be deleted with no controller running (an uninstall, a namespace
//! deletion, a GitOps prune), and nothing is stranded.

use crate::controller::apply::{events, lock_meta};
use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::controller::lock_object::LockObject;
use crate::controller::reconcile::token_floor;
use crate::core::model::Decision;
use crate::core::scope::Scope;
use kube::ResourceExt;

pub use crate::controller::apply::lock_meta::{IDLE_SINCE, LOCK_STATE_FINALIZER};

/// Does this Mutex carry our finalizer?
pub fn protected<L: LockObject>(lock: &L) -> bool {
    lock.finalizers().iter().any(|f| f == LOCK_STATE_FINALIZER)
}

/// Does the lock state about to be written name anyone?
pub fn in_use(decision: &Decision) -> bool {
    let st = &decision.status;
    !st.holders.is_empty() || !st.queue.is_empty() || !st.reservations.is_empty()
}

/// Take the finalizer off a lock that is idle (no holder, waiter or reservation), so that it can
/// be deleted with no controller running: an idle lock has nothing to lose but its `lastToken`,
/// and that is recorded in the token ledger first (token_floor.rs). Read fresh (the status was
/// just written) and patched with a compare-and-swap, so a change in between (someone joined) is
/// decided again first. True if removed.
pub async fn unprotect<L: LockObject>(
    ctx: &Context,
    scope: &Scope,
    key: &str,
) -> Result<bool, Error> {
    let api = L::api(&ctx.client, scope);
    let Some(lock) = api.get_opt(key).await? else {
        return Ok(false);
    };
    if !protected(&lock) {
        return Ok(false);
    }
    let status = lock.lock_status().cloned().unwrap_or_default();
    if !status.holders.is_empty() || !status.queue.is_empty() || !status.reservations.is_empty() {
        return Err(Error::Conflict);
    }
    // Its status says the ledger holds its last token already (a reserved block): no write.
    let covered = status.ledger_read_for.is_some() && status.ledger_read_for == lock.uid();
    if !covered || status.ledger_covers.is_none_or(|c| c < status.last_token) {
        let what = format!(
            "record the last token ({}) in the token ledger",
            status.last_token
        );
        let stuck = "its finalizer stays on, and a delete waits, until then";
        token_floor::record(ctx, scope, key, status.last_token)
            .await
            .inspect_err(|e| events::ledger_failed(ctx, &lock, &what, stuck, e))?;
    }
    lock_meta::remove_finalizer(ctx, &lock, status.last_token).await
}
