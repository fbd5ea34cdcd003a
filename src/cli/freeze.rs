//! `tkn mutex freeze KEY [--reason TEXT]` and `tkn mutex unfreeze KEY`: the
//! Mutex spec's `frozen` field (GitOps can set it too); the controller's
//! acknowledgement is `status.frozen` following it.

use super::request::{await_ack, patch_mutex};
use super::target::{Failure, Result, Target, Wait};
use crate::model::mutex::Mutex;
use clap::Args;
use serde_json::json;

#[derive(Args)]
pub struct FreezeArgs {
    /// The key (the Mutex's name).
    key: String,
    /// Why: every waiter's status message shows it.
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    wait: Wait,
}

#[derive(Args)]
pub struct UnfreezeArgs {
    /// The key (the Mutex's name).
    key: String,
    #[command(flatten)]
    wait: Wait,
}

pub async fn freeze(target: &Target, a: FreezeArgs) -> Result<()> {
    let patch = json!({"spec": {"frozen": true, "frozenReason": a.reason}});
    set(target, &a.key, patch, true, a.wait).await?;
    println!(
        "Mutex {} is frozen: nothing new is granted; holders keep the slot, waiters wait",
        a.key
    );
    Ok(())
}

pub async fn unfreeze(target: &Target, a: UnfreezeArgs) -> Result<()> {
    let patch = json!({"spec": {"frozen": null, "frozenReason": null}});
    set(target, &a.key, patch, false, a.wait).await?;
    println!("Mutex {} is unfrozen: it grants again", a.key);
    Ok(())
}

async fn set(
    target: &Target,
    key: &str,
    patch: serde_json::Value,
    frozen: bool,
    wait: Wait,
) -> Result<()> {
    target.mutex(key).await?;
    let what = if frozen { "freeze" } else { "unfreeze" };
    patch_mutex(target, key, &patch, what).await?;
    let acked = move |m: Option<&Mutex>| {
        m.is_none_or(|m| m.status.as_ref().is_some_and(|s| s.frozen == frozen))
    };
    let m = await_ack(target, key, acked, wait).await.map_err(Failure)?;
    if m.is_none() {
        return Err(Failure(format!("Mutex {key} was deleted")));
    }
    Ok(())
}
