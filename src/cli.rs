//! The `tkn-mutex` command (a tkn plugin: `tkn mutex ...`): one module per
//! command; [`output`] formats ages and tables; [`request`] writes a request
//! and waits for the controller's acknowledgement.

mod clear;
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

use clap::{Parser, Subcommand};
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
    /// List the keys: holders and since when, queue length, last token, capacity, frozen.
    List(list::ListArgs),
    /// Show one key: holders, the queue in grant order, supersede marks, requests, Events.
    Describe(describe::DescribeArgs),
    /// Grant nothing new on a key: holders keep the slot, waiters wait (reason Frozen).
    Freeze(freeze::FreezeArgs),
    /// Let a frozen key grant again.
    Unfreeze(freeze::UnfreezeArgs),
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
    let target = connect(&cli.global).await?;
    match cli.command {
        Command::List(a) => list::run(&target, a).await,
        Command::Describe(a) => describe::run(&target, a).await,
        Command::Freeze(a) => freeze::freeze(&target, a).await,
        Command::Unfreeze(a) => freeze::unfreeze(&target, a).await,
        Command::Release(a) => release::run(&target, a).await,
        Command::Clear(a) => clear::run(&target, a).await,
        Command::Promote(a) => promote::run(&target, a).await,
        Command::Forget(a) => forget::run(&target, a).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn release_needs_a_holder_and_global_flags_go_anywhere() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["tkn-mutex"], args].concat());
        assert!(parse(&["release", "staging"]).is_err());
        let cli = parse(&[
            "release", "staging", "--holder", "pr-1", "--force", "-n", "ci",
        ])
        .unwrap();
        assert_eq!(cli.global.namespace.as_deref(), Some("ci"));
        assert!(parse(&["describe", "staging", "-o", "xml"]).is_err());
        assert!(parse(&["list", "-A", "--context", "kind"]).is_ok());
    }
}
