//! `tkn mutex clear KEY [--keep-pipelineruns] [--reason TEXT]`.

use super::request::submit;
use super::target::{Result, Target, Wait};
use crate::core::requests::{Action, Request};
use clap::Args;

#[derive(Args)]
pub struct ClearArgs {
    /// The key (the Mutex's name, or with --cluster the ClusterMutex's).
    key: String,
    /// Fail the waiters' lock tasks but leave their PipelineRuns running.
    #[arg(long = "keep-pipelineruns")]
    keep_pipeline_runs: bool,
    /// Why: shown in every waiter's message.
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    wait: Wait,
}

pub async fn run(target: &Target, a: ClearArgs) -> Result<()> {
    target.lock(&a.key).await?;
    let request = Request {
        reason: a.reason,
        keep_pipeline_runs: a.keep_pipeline_runs,
        ..Request::of(Action::Clear)
    };
    println!("{}", submit(target, &a.key, request, a.wait).await?);
    Ok(())
}
