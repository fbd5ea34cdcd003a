//! `tkn mutex forget KEY GROUP`: drop a supersede group's mark, so that its
//! runs are no longer judged stale against it (say, after a run with a
//! mistyped `sequence` marked the group far ahead of every real build).

use super::lock::one_of;
use super::request::submit;
use super::target::{Result, Target, Wait};
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
    let group = one_of(target, &marks, &a.group, |listed| {
        format!(
            "group {} has no supersede mark on {} (marks: {listed})",
            a.group, a.key
        )
    })?;
    let request = Request {
        reason: a.reason,
        group: Some(group),
        ..Request::of(Action::Forget)
    };
    println!("{}", submit(target, &a.key, request, a.wait).await?);
    Ok(())
}
