//! `tkn mutex forget KEY GROUP`: drop a supersede group's mark, so that its
//! runs are no longer judged stale against it (say, after a run with a
//! mistyped `sequence` marked the group far ahead of every real build).

use super::lock::resolve;
use super::request::submit;
use super::target::{Failure, Result, Target, Wait};
use crate::core::requests::{Action, Request};
use clap::Args;

#[derive(Args)]
pub struct ForgetArgs {
    /// The key (the Mutex's name, or with --cluster the ClusterMutex's).
    key: String,
    /// The supersede group (`tkn mutex describe KEY` lists the marks); on a
    /// ClusterMutex `namespace/group`, or the group in the command's namespace.
    group: String,
    /// Why: recorded with the request.
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    wait: Wait,
}

pub async fn run(target: &Target, a: ForgetArgs) -> Result<()> {
    let marks: Vec<String> = target
        .lock(&a.key)
        .await?
        .status()
        .groups
        .iter()
        .map(|m| m.group.clone())
        .collect();
    let Some(group) = resolve(target, &marks, &a.group) else {
        return Err(Failure(format!(
            "group {} has no supersede mark on {} (marks: {})",
            a.group,
            a.key,
            if marks.is_empty() {
                "none".into()
            } else {
                marks.join(", ")
            }
        )));
    };
    let request = Request {
        id: String::new(),
        action: Action::Forget,
        pipeline_run: None,
        reason: a.reason,
        by: String::new(),
        force: false,
        keep_pipeline_runs: false,
        group: Some(group),
    };
    println!("{}", submit(target, &a.key, request, a.wait).await?);
    Ok(())
}
