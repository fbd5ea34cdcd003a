//! `tkn mutex freeze KEY [--reason TEXT]` and `tkn mutex unfreeze KEY`: the
//! lock spec's `frozen` field (GitOps can set it too); the controller's
//! acknowledgement is `status.frozen` following it.

use super::lock::Lock;
use super::target::{Failure, Result, Target, Wait};
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct FreezeArgs {
    /// The key (the Mutex's name, or with --cluster the ClusterMutex's).
    key: String,
    /// Why: every waiter's status message shows it.
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    wait: Wait,
}

#[derive(Args)]
pub struct UnfreezeArgs {
    /// The key (the Mutex's name, or with --cluster the ClusterMutex's).
    key: String,
    #[command(flatten)]
    wait: Wait,
}

pub async fn freeze(target: &Target, a: FreezeArgs) -> Result<()> {
    let patch = json!({"spec": {"frozen": true, "frozenReason": a.reason}});
    set(target, &a.key, patch, true, a.wait).await?;
    println!(
        "{} is frozen: nothing new is granted; holders keep the slot, waiters wait",
        target.describe_lock(&a.key)
    );
    Ok(())
}

pub async fn unfreeze(target: &Target, a: UnfreezeArgs) -> Result<()> {
    let patch = json!({"spec": {"frozen": null, "frozenReason": null}});
    set(target, &a.key, patch, false, a.wait).await?;
    println!(
        "{} is unfrozen: it grants again",
        target.describe_lock(&a.key)
    );
    Ok(())
}

async fn set(
    target: &Target,
    key: &str,
    patch: serde_json::Value,
    frozen: bool,
    wait: Wait,
) -> Result<()> {
    target.lock(key).await?;
    let what = if frozen { "freeze" } else { "unfreeze" };
    target.patch_lock(key, &patch, what).await?;
    let acked =
        move |l: Option<&Lock>| l.is_none_or(|l| l.has_status() && l.status().frozen == frozen);
    let lock = target.await_lock(key, acked, wait).await.map_err(Failure)?;
    if lock.is_none() {
        return Err(Failure(format!(
            "{} was deleted",
            target.describe_lock(key)
        )));
    }
    Ok(())
}
