//! The `tkn-mutex` command (a tkn plugin: `tkn mutex ...`): one module per
//! command; `output` formats ages and tables; `request` writes a request
//! and waits for the controller's acknowledgement.

mod clear;
mod completion;
mod describe;
mod forget;
mod freeze;
mod list;
mod lock;
pub mod output;
mod promote;
mod release;
mod request;
mod target;
mod version;
mod window_override;

use clap::{CommandFactory, Parser, Subcommand};
use target::connect;
pub use target::{Failure, Global, Result, Target, Wait};

#[derive(Parser)]
#[command(
    name = "tkn-mutex",
    bin_name = "tkn mutex",
    version = crate::VERSION,
    about = "See and control the queues of tekton-mutex keys (a tkn plugin: tkn mutex ...)."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Cluster(ClusterCommand),
    /// Print this client's version and the controller's.
    Version(version::VersionArgs),
    /// Print a shell completion script: source <(tkn-mutex completion bash).
    Completion(completion::CompletionArgs),
}

/// The commands that act on the cluster.
#[derive(Subcommand)]
enum ClusterCommand {
    /// List the keys: holders and since when, queue length, last token, capacity, frozen.
    List(list::ListArgs),
    /// Show one key: holders, the queue in grant order, supersede marks, requests, Events.
    Describe(describe::DescribeArgs),
    /// Grant nothing new on a key: holders keep the slot, waiters wait (reason Frozen).
    Freeze(freeze::FreezeArgs),
    /// Let a frozen key grant again.
    Unfreeze(freeze::UnfreezeArgs),
    /// Let a key grant through its closed windows until a time, with a reason (or --clear).
    OverrideWindow(window_override::OverrideArgs),
    /// Take the slot from a stuck holder: the next waiter gets it, the holder's PipelineRun is cancelled.
    Release(release::ReleaseArgs),
    /// Fail every waiter of a key with reason Cleared (their PipelineRuns are cancelled).
    Clear(clear::ClearArgs),
    /// Move one waiting PipelineRun to the front of the queue, once.
    Promote(promote::PromoteArgs),
    /// Drop a supersede group's mark: its runs are no longer stale against it.
    Forget(forget::ForgetArgs),
}

/// Run the command line; returns the exit code.
pub async fn main() -> i32 {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {e}");
            1
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Completion(a) => completion::run(a, Cli::command()),
        Command::Version(a) => version::run(&cli.global, a).await,
        Command::Cluster(c) => {
            // A usage error is said at once, not after (or instead of) a connection error.
            c.check()?;
            let target = connect(&cli.global).await?;
            c.run(&target).await
        }
    }
}

impl ClusterCommand {
    /// What the arguments alone can tell is wrong, before any connection.
    fn check(&self) -> Result<()> {
        match self {
            ClusterCommand::Release(a) => release::check(a),
            ClusterCommand::OverrideWindow(a) => window_override::check(a),
            _ => Ok(()),
        }
    }

    async fn run(self, target: &Target) -> Result<()> {
        match self {
            ClusterCommand::List(a) => list::run(target, a).await,
            ClusterCommand::Describe(a) => describe::run(target, a).await,
            ClusterCommand::Freeze(a) => freeze::freeze(target, a).await,
            ClusterCommand::Unfreeze(a) => freeze::unfreeze(target, a).await,
            ClusterCommand::OverrideWindow(a) => window_override::run(target, a).await,
            ClusterCommand::Release(a) => release::run(target, a).await,
            ClusterCommand::Clear(a) => clear::run(target, a).await,
            ClusterCommand::Promote(a) => promote::run(target, a).await,
            ClusterCommand::Forget(a) => forget::run(target, a).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
        Cli::try_parse_from([&["tkn-mutex"], args].concat())
    }

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn release_needs_a_holder_and_global_flags_go_anywhere() {
        assert!(parse(&["release", "staging"]).is_err());
        let cli = parse(&[
            "release", "staging", "--holder", "pr-1", "--force", "-n", "ci",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("ci"));
        assert!(parse(&["describe", "staging", "-o", "xml"]).is_err());
        assert!(parse(&["list", "-A", "--context", "kind"]).is_ok());
    }

    #[test]
    fn the_global_flags_are_tkns() {
        let cli = parse(&["-c", "kind", "list", "-k", "/tmp/kc", "-n", "ci"]).unwrap();
        assert_eq!(cli.global.context.as_deref(), Some("kind"));
        assert_eq!(cli.global.namespace.as_deref(), Some("ci"));
        assert_eq!(
            cli.global.kubeconfig.as_deref(),
            Some(std::path::Path::new("/tmp/kc"))
        );
        let cli = parse(&["describe", "staging", "-c", "prod"]).unwrap();
        assert_eq!(cli.global.context.as_deref(), Some("prod"));
    }

    #[test]
    fn version_and_completion_are_commands_and_version_a_flag() {
        assert!(parse(&["version", "--controller-namespace", "ops"]).is_ok());
        assert!(parse(&["completion", "zsh"]).is_ok());
        assert!(parse(&["completion", "tcsh"]).is_err());
        let v = parse(&["--version"]).err().unwrap();
        assert_eq!(v.kind(), clap::error::ErrorKind::DisplayVersion);
    }

    #[tokio::test]
    async fn release_without_force_fails_before_connecting() {
        // A kubeconfig that does not exist: connecting would fail with "cannot read kubeconfig".
        let args = ["release", "staging", "--holder", "pr-1"];
        let cli = parse(&[&args[..], &["-k", "/nonexistent/kubeconfig"]].concat()).unwrap();
        let Err(Failure(e)) = run(cli).await else {
            panic!("release without --force must fail");
        };
        assert!(e.contains("add --force"), "{e}");
        let forced = parse(&[&args[..], &["--force", "-k", "/nonexistent/kubeconfig"]].concat());
        let Err(Failure(e)) = run(forced.unwrap()).await else {
            panic!("no kubeconfig");
        };
        assert!(e.starts_with("cannot read kubeconfig"), "{e}");
    }

    #[tokio::test]
    async fn completion_needs_no_cluster() {
        let cli = parse(&["completion", "bash", "-k", "/nonexistent/kubeconfig"]).unwrap();
        assert!(run(cli).await.is_ok());
    }
}
