//! `tkn mutex promote KEY PIPELINERUN`: to the front of the queue, once.

use super::lock::resolve;
use super::request::submit;
use super::target::{Failure, Result, Target, Wait};
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
    let Some(waiter) = resolve(target, &waiting, &a.pipeline_run) else {
        return Err(Failure(format!(
            "{} is not waiting for {} (see `tkn mutex describe {}{}`)",
            a.pipeline_run,
            a.key,
            a.key,
            if target.cluster { " --cluster" } else { "" }
        )));
    };
    let request = Request {
        id: String::new(),
        action: Action::Promote,
        pipeline_run: Some(waiter),
        reason: None,
        by: String::new(),
        force: false,
        keep_pipeline_runs: false,
        group: None,
    };
    println!("{}", submit(target, &a.key, request, a.wait).await?);
    Ok(())
}
