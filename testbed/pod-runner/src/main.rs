//! pod-runner: a kubelet stand-in for the local control plane.
//!
//! Watches pods owned by TaskRuns (all namespaces, whatever their nodeName: there is no
//! scheduler), runs each step's script or command on the host in order, and reports the result
//! through the pod status subresource so the real Tekton controller finishes the TaskRun.
//!
//! Usage: pod-runner --kubeconfig FILE --work-dir DIR [--path-prefix DIR]...

mod plan;
mod run;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config, ResourceExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::run::{Host, run_pod};

fn parse_args() -> Result<Host> {
    let mut kubeconfig = None;
    let mut work_dir = None;
    let mut path_prefix = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value()?)),
            "--work-dir" => work_dir = Some(PathBuf::from(value()?)),
            "--path-prefix" => path_prefix.push(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!(
                    "usage: pod-runner --kubeconfig FILE --work-dir DIR [--path-prefix DIR]..."
                );
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?} (try --help)"),
        }
    }
    let kubeconfig = kubeconfig
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .context("--kubeconfig FILE (or KUBECONFIG) is required")?;
    let work_dir = work_dir.context("--work-dir DIR is required")?;
    std::fs::create_dir_all(&work_dir)?;
    Ok(Host {
        kubeconfig: std::path::absolute(kubeconfig)?,
        work_dir: std::path::absolute(work_dir)?,
        path_prefix,
    })
}

fn owned_by_taskrun(pod: &Pod) -> bool {
    pod.owner_references()
        .iter()
        .any(|o| o.kind == "TaskRun" && o.api_version.starts_with("tekton.dev/"))
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

fn finished(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    )
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .with_ansi(false)
        .init();
    let host = parse_args()?;
    let kubeconfig = Kubeconfig::read_from(&host.kubeconfig)
        .with_context(|| format!("reading {}", host.kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;

    let pods: Api<Pod> = Api::all(client.clone());
    let mut events = watcher::watcher(
        pods,
        watcher::Config::default().labels("tekton.dev/taskRun"),
    )
    .default_backoff()
    .boxed();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut running: HashMap<String, CancellationToken> = HashMap::new();
    let mut done: HashSet<String> = HashSet::new();
    let mut listed: Option<HashSet<String>> = None;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    info!(work_dir = %host.work_dir.display(), "pod-runner watching TaskRun pods");

    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            Some(uid) = done_rx.recv() => {
                running.remove(&uid);
                done.insert(uid);
            }
            ev = events.next() => {
                let Some(ev) = ev else { bail!("pod watch ended") };
                let ev = match ev {
                    Ok(ev) => ev,
                    Err(e) => { warn!("pod watch error (retrying): {e}"); continue; }
                };
                match ev {
                    Event::Init => listed = Some(HashSet::new()),
                    Event::InitDone => {
                        // Pods deleted while the watch was down: stop their scripts.
                        if let Some(seen) = listed.take() {
                            running.retain(|uid, token| {
                                let keep = seen.contains(uid);
                                if !keep { token.cancel(); }
                                keep
                            });
                        }
                    }
                    Event::Apply(pod) | Event::InitApply(pod) => {
                        let Some(uid) = pod.uid() else { continue };
                        if let Some(seen) = listed.as_mut() { seen.insert(uid.clone()); }
                        if pod.metadata.deletion_timestamp.is_some() {
                            if let Some(token) = running.remove(&uid) {
                                info!(pod = %key(&pod), "pod is being deleted: killing its steps");
                                token.cancel();
                            }
                            // What a kubelet does once the containers are gone: finish the
                            // graceful deletion, else the pod stays Terminating forever.
                            let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
                            let name = pod.name_any();
                            tokio::spawn(async move {
                                let _ = api.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await;
                            });
                            continue;
                        }
                        if finished(&pod) || running.contains_key(&uid) || done.contains(&uid)
                            || !owned_by_taskrun(&pod) {
                            continue;
                        }
                        let token = CancellationToken::new();
                        running.insert(uid.clone(), token.clone());
                        let (client, host, tx) = (client.clone(), host.clone(), done_tx.clone());
                        tokio::spawn(async move {
                            let key = key(&pod);
                            if let Err(e) = run_pod(client, pod, host, token).await {
                                error!(pod = %key, "pod failed to run: {e:#}");
                            }
                            let _ = tx.send(uid);
                        });
                    }
                    Event::Delete(pod) => {
                        if let Some(token) = pod.uid().and_then(|uid| running.remove(&uid)) {
                            info!(pod = %key(&pod), "pod deleted: killing its steps");
                            token.cancel();
                        }
                    }
                }
            }
        }
    }
    info!(running = running.len(), "stopping: killing running steps");
    for token in running.values() {
        token.cancel();
    }
    // Each cancelled pod task kills its process group, then reports done.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !running.is_empty() {
        match tokio::time::timeout_at(deadline, done_rx.recv()).await {
            Ok(Some(uid)) => {
                running.remove(&uid);
            }
            _ => break,
        }
    }
    Ok(())
}
