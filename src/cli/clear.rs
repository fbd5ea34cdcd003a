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

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, ClusterCommand, Command};
    use clap::Parser;
    use std::time::Duration;

    fn timeout(args: &[&str]) -> Duration {
        let cli = Cli::try_parse_from([&["tkn-mutex", "clear", "staging"], args].concat()).unwrap();
        match cli.command {
            Command::Cluster(ClusterCommand::Clear(a)) => a.wait.duration(),
            _ => unreachable!("parsed as clear"),
        }
    }

    #[test]
    fn the_timeout_takes_durations() {
        assert_eq!(timeout(&["--timeout", "30s"]), Duration::from_secs(30));
        assert_eq!(timeout(&["--timeout", "2m"]), Duration::from_secs(120));
        assert_eq!(timeout(&["--timeout=1h30m"]), Duration::from_secs(5400));
        assert_eq!(timeout(&["--timeout", "1"]), Duration::from_secs(1));
        assert_eq!(timeout(&[]), Duration::from_secs(30), "the default");
        let bad = ["tkn-mutex", "clear", "staging", "--timeout", "30 parsecs"];
        assert!(Cli::try_parse_from(bad).is_err());
    }
}
