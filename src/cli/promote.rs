//! `tkn mutex promote KEY PIPELINERUN`: to the front of the queue, once.

use super::lock::one_of;
use super::request::submit;
use super::target::{Result, Target, Wait};
use crate::core::requests::{Action, Request};
use clap::Args;

#[derive(Args)]
pub struct PromoteArgs {
    /// The key (the Mutex's name, or with --cluster the ClusterMutex's).
    key: String,
    /// The waiting PipelineRun (or standalone run); on a ClusterMutex
    /// `namespace/name`, or its name in the command's namespace.
    pipeline_run: String,
    #[command(flatten)]
    wait: Wait,
}

pub async fn run(target: &Target, a: PromoteArgs) -> Result<()> {
    let waiting: Vec<String> = target
        .lock(&a.key)
        .await?
        .status()
        .queue
        .iter()
        .map(|w| w.pipeline_run.clone().unwrap_or(w.run.name.clone()))
        .collect();
    let cluster = if target.cluster { " --cluster" } else { "" };
    let waiter = one_of(target, &waiting, &a.pipeline_run, |_| {
        format!(
            "{} is not waiting for {} (see `tkn mutex describe {}{cluster}`)",
            a.pipeline_run, a.key, a.key
        )
    })?;
    let request = Request {
        pipeline_run: Some(waiter),
        ..Request::of(Action::Promote)
    };
    println!("{}", submit(target, &a.key, request, a.wait).await?);
    Ok(())
}
