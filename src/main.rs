//! The `tekton-mutex` command: `run` the controller, print the `crd`, or the `version`.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::time::Duration;
use tekton_mutex::controller::{self, LeaderElection, Options};
use tekton_mutex::manifests::{self, Install};

#[derive(Parser)]
#[command(
    name = "tekton-mutex",
    version = tekton_mutex::VERSION,
    about = "A Tekton custom task that lets a pipeline say: one at a time here."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the controller (in-cluster config, else KUBECONFIG).
    Run(RunArgs),
    /// Print the Mutex CustomResourceDefinition.
    Crd,
    /// Print the version and the git revision it was built from.
    Version,
    /// Print the install manifests with the image pinned (hack/release.sh writes release.yaml with it).
    Manifests {
        /// The controller image, pinned by digest: NAME[:TAG]@sha256:...
        #[arg(long, required_unless_present = "admission")]
        image: Option<String>,
        /// The version to label every object with (app.kubernetes.io/version).
        #[arg(long, default_value = tekton_mutex::VERSION)]
        version: String,
        /// The namespace-scoped install (Role instead of ClusterRole, no CRD).
        #[arg(long, conflicts_with = "admission")]
        namespaced: bool,
        /// Only the admission policy that queues PipelineRuns at create (config/admission/),
        /// for this MutatingAdmissionPolicy API: v1 (Kubernetes 1.36+) or v1beta1 (1.34, 1.35).
        #[arg(long, value_enum)]
        admission: Option<manifests::AdmissionApi>,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Watch and act in this namespace only (a Role is enough); default: all namespaces.
    #[arg(long, short = 'n', env = "TEKTON_MUTEX_NAMESPACE")]
    namespace: Option<String>,
    /// Serve /healthz, /readyz and /metrics here, e.g. 0.0.0.0:8080.
    #[arg(long, value_name = "ADDR")]
    http_addr: Option<SocketAddr>,
    /// How long to wait at start for the CRDs (Mutex, Tekton's CustomRun) to be served,
    /// in seconds, retrying with backoff, before exiting with an error; 0 checks once.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    crd_wait: u64,
    /// Log as human-readable text or as one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, env = "TEKTON_MUTEX_LOG_FORMAT")]
    log_format: LogFormat,
    /// The namespace of the ClusterMutexes' token ledger (ConfigMap tekton-mutex-token-floors):
    /// one that no uninstall deletes. Set it where the controller may not write kube-system.
    #[arg(
        long,
        default_value = controller::CLUSTER_LEDGER_NAMESPACE,
        env = "TEKTON_MUTEX_CLUSTER_LEDGER_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    cluster_ledger_namespace: String,
    #[command(flatten)]
    leader: LeaderArgs,
}

#[derive(Args)]
struct LeaderArgs {
    /// Act only while holding a coordination.k8s.io Lease, so that one replica
    /// of several acts at a time while the others wait warm.
    #[arg(long)]
    leader_elect: bool,
    /// The Lease's name.
    #[arg(long, default_value = "tekton-mutex")]
    lease_name: String,
    /// The Lease's namespace; default: POD_NAMESPACE, else --namespace, else tekton-mutex.
    #[arg(long)]
    lease_namespace: Option<String>,
    /// How long the Lease is valid after its last renewal, in seconds:
    /// a standby takes over at most this long after the leader dies.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(2..))]
    lease_duration: u64,
    /// The leader renews this many seconds before the Lease would expire.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    lease_renew_margin: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[tokio::main]
async fn main() {
    let code = match Cli::parse().command {
        Command::Crd => {
            print!("{}", tekton_mutex::crd_yaml());
            0
        }
        Command::Version => {
            println!(
                "tekton-mutex {} (revision {})",
                tekton_mutex::VERSION,
                tekton_mutex::REVISION
            );
            0
        }
        Command::Manifests {
            image,
            version,
            namespaced,
            admission,
        } => {
            let install = match namespaced {
                true => Install::Namespaced,
                false => Install::Cluster,
            };
            let rendered = match (admission, image) {
                (Some(api), _) => manifests::render_admission(api, &version),
                (None, image) => manifests::render(install, &image.unwrap_or_default(), &version),
            };
            match rendered {
                Ok(text) => {
                    print!("{text}");
                    0
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    2
                }
            }
        }
        Command::Run(args) => run(args).await,
    };
    std::process::exit(code);
}

fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn".into());
    // Colour only on a terminal: `kubectl logs` and log collectors get plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour);
    match format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

fn options(args: RunArgs) -> Result<Options, String> {
    let l = args.leader;
    if l.lease_renew_margin >= l.lease_duration {
        return Err(format!(
            "--lease-renew-margin ({}) must be shorter than --lease-duration ({})",
            l.lease_renew_margin, l.lease_duration
        ));
    }
    let leader_election = l.leader_elect.then(|| LeaderElection {
        lease_name: l.lease_name,
        lease_namespace: l
            .lease_namespace
            .or_else(|| {
                std::env::var("POD_NAMESPACE")
                    .ok()
                    .filter(|s| !s.is_empty())
            })
            .or_else(|| args.namespace.clone())
            .unwrap_or_else(|| "tekton-mutex".into()),
        identity: std::env::var("POD_NAME")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id())),
        duration: Duration::from_secs(l.lease_duration),
        renew_margin: Duration::from_secs(l.lease_renew_margin),
    });
    Ok(Options {
        namespace: args.namespace,
        http_addr: args.http_addr,
        leader_election,
        crd_wait: Duration::from_secs(args.crd_wait),
        cluster_ledger_namespace: args.cluster_ledger_namespace,
        #[cfg(feature = "fault-injection")]
        fault: controller::Fault::from_env()?,
    })
}

fn hostname() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|| "tekton-mutex".into())
}

async fn run(args: RunArgs) -> i32 {
    init_logs(args.log_format);
    let opts = match options(args) {
        Ok(o) => o,
        Err(e) => {
            tracing::error!("{e}");
            return 2;
        }
    };
    let client = match tekton_mutex::controller::connect().await {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes config: run in a cluster or set KUBECONFIG");
            return 1;
        }
    };
    match controller::run(client, opts).await {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "controller stopped");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn run_args(args: &[&str]) -> Result<RunArgs, String> {
        let all = ["tekton-mutex", "run"].iter().chain(args);
        match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
            Command::Run(a) => Ok(a),
            _ => Err("not run".into()),
        }
    }

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_flags_become_options() {
        let a = run_args(&["--log-format", "json", "-n", "ci", "--leader-elect"]).unwrap();
        assert!(matches!(a.log_format, LogFormat::Json));
        let o = options(a).unwrap();
        assert_eq!(o.namespace.as_deref(), Some("ci"));
        assert_eq!(o.crd_wait, Duration::from_secs(300));
        assert_eq!(o.cluster_ledger_namespace, "kube-system");
        let le = o.leader_election.unwrap();
        assert_eq!(le.duration, Duration::from_secs(15));
        assert_eq!(le.renew_margin, Duration::from_secs(5));
        assert!(run_args(&["--log-format", "xml"]).is_err());
        let a = run_args(&["--cluster-ledger-namespace", "platform"]).unwrap();
        assert_eq!(options(a).unwrap().cluster_ledger_namespace, "platform");
        assert!(run_args(&["--http-addr", "not-an-address"]).is_err());
    }

    #[test]
    fn a_renew_margin_must_fit_in_the_lease() {
        let a = run_args(&[
            "--leader-elect",
            "--lease-duration",
            "5",
            "--lease-renew-margin",
            "5",
        ])
        .unwrap();
        assert!(options(a).unwrap_err().contains("shorter"));
    }
}

/// jemalloc, not the system's malloc: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read before `main`:
/// - one arena. By default it keeps four per CPU it sees (the node's, not the
///   container's limit), each holding pages of its own; the controller's threads
///   mostly wait on the API server, and each has its own cache in front of the
///   arena. 4 MiB less at the peak on 2 CPUs, more on bigger nodes;
/// - a background thread that gives freed pages back to the OS after their
///   decay time (10 s). Without it jemalloc purges only while it allocates, so a
///   controller that goes quiet after a burst keeps the burst's pages for good.
///
/// `_RJEM_MALLOC_CONF` still overrides them.
#[unsafe(export_name = "_rjem_malloc_conf")]
static ALLOCATOR_CONF: Option<&std::ffi::c_char> =
    Some(unsafe { &*c"narenas:1,background_thread:true".as_ptr() });
