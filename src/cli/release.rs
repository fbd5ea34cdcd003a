//! `tkn mutex release KEY --holder PIPELINERUN --force [--reason TEXT]`.

use super::lock::one_of;
use super::request::submit;
use super::target::{Failure, Result, Target, Wait};
use crate::core::requests::{Action, Request};
use clap::Args;

#[derive(Args)]
pub struct ReleaseArgs {
    /// The key (the Mutex's name, or with --cluster the ClusterMutex's).
    key: String,
    /// The holding PipelineRun (or standalone run) to take the slot from; on a
    /// ClusterMutex `namespace/name`, or its name in the command's namespace.
    #[arg(long)]
    holder: String,
    /// Required: the holder's PipelineRun is cancelled and the next waiter gets the slot.
    #[arg(long)]
    force: bool,
    /// Why: recorded on the PipelineRun (annotation and Event).
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    wait: Wait,
}

/// What the arguments alone can tell, checked before connecting: a release
/// without --force is refused even where no cluster is reachable.
pub fn check(a: &ReleaseArgs) -> Result<()> {
    match a.force {
        true => Ok(()),
        false => Err(Failure(format!(
            "release takes the slot from {} and cancels its PipelineRun: add --force to do it",
            a.holder
        ))),
    }
}

pub async fn run(target: &Target, a: ReleaseArgs) -> Result<()> {
    check(&a)?;
    let holders: Vec<String> = target
        .lock(&a.key)
        .await?
        .status()
        .holders
        .iter()
        .map(|h| h.pipeline_run.clone().unwrap_or(h.run.name.clone()))
        .collect();
    let holder = one_of(target, &holders, &a.holder, |listed| {
        format!("{} does not hold {} (holders: {listed})", a.holder, a.key)
    })?;
    let request = Request {
        pipeline_run: Some(holder),
        reason: a.reason,
        force: true,
        ..Request::of(Action::Release)
    };
    println!("{}", submit(target, &a.key, request, a.wait).await?);
    Ok(())
}
