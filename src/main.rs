//! `tekton-mutex run` starts the controller; `tekton-mutex crd` prints the Mutex CRD.

use tekton_mutex::controller::{self, Fault, Options};

const USAGE: &str = "usage:
  tekton-mutex run [--namespace NS] [--http-addr ADDR]
                                      start the controller (in-cluster config, else KUBECONFIG);
                                      ADDR (e.g. 0.0.0.0:8080) serves /healthz, /readyz, /metrics
  tekton-mutex crd                    print the Mutex CustomResourceDefinition

environment:
  RUST_LOG                log filter (default: info)
  TEKTON_MUTEX_NAMESPACE  watch only this namespace (same as --namespace)";

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("crd") if args.len() == 1 => {
            print!("{}", tekton_mutex::crd_yaml());
            0
        }
        Some("run") => match parse_run_args(&args[1..]) {
            Ok(opts) => run(opts).await,
            Err(e) => {
                eprintln!("error: {e}\n\n{USAGE}");
                2
            }
        },
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            0
        }
        _ => {
            eprintln!("{USAGE}");
            2
        }
    };
    std::process::exit(code);
}

fn parse_run_args(args: &[String]) -> Result<Options, String> {
    let mut opts = Options {
        namespace: std::env::var("TEKTON_MUTEX_NAMESPACE")
            .ok()
            .filter(|s| !s.is_empty()),
        ..Default::default()
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--namespace" | "-n" => {
                opts.namespace = Some(it.next().ok_or("--namespace needs a value")?.clone())
            }
            "--http-addr" => {
                let v = it
                    .next()
                    .ok_or("--http-addr needs a value, e.g. 0.0.0.0:8080")?;
                opts.http_addr = Some(v.parse().map_err(|_| {
                    format!("--http-addr {v:?} is not an address like 0.0.0.0:8080")
                })?);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    opts.fault = match std::env::var("TEKTON_MUTEX_FAULT").ok().as_deref() {
        None | Some("") => None,
        Some("exit-after-lock-write") => Some(Fault::ExitAfterLockWrite),
        Some(other) => {
            return Err(format!(
                "unknown TEKTON_MUTEX_FAULT {other:?} (known: exit-after-lock-write)"
            ));
        }
    };
    Ok(opts)
}

async fn run(opts: Options) -> i32 {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let client = match kube::Client::try_default().await {
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
