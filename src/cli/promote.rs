//! `tkn mutex promote KEY PIPELINERUN`: to the front of the queue, once.

use super::request::submit;
use super::target::{Failure, Result, Target, Wait};
use crate::core::requests::{Action, Request};
use clap::Args;

#[derive(Args)]
pub struct PromoteArgs {
    /// The key (the Mutex's name).
    key: String,
    /// The waiting PipelineRun (or standalone run).
    pipeline_run: String,
    #[command(flatten)]
    wait: Wait,
}

pub async fn run(target: &Target, a: PromoteArgs) -> Result<()> {
    let m = target.mutex(&a.key).await?;
    let waiting = m
        .status
        .unwrap_or_default()
        .queue
        .iter()
        .any(|w| w.pipeline_run.as_deref().unwrap_or(&w.run.name) == a.pipeline_run);
    if !waiting {
        return Err(Failure(format!(
            "{} is not waiting for {} (see `tkn mutex describe {}`)",
            a.pipeline_run, a.key, a.key
        )));
    }
    let request = Request {
        id: String::new(),
        action: Action::Promote,
        pipeline_run: Some(a.pipeline_run),
        reason: None,
        by: String::new(),
        force: false,
        keep_pipeline_runs: false,
    };
    println!("{}", submit(target, &a.key, request, a.wait).await?);
    Ok(())
}
