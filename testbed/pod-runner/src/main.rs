//! pod-runner: a kubelet stand-in for the local control plane.
//!
//! Registers a Node, watches pods owned by TaskRuns (all namespaces), binds the unscheduled
//! ones to its Node (there is no scheduler), runs each step's script or command on the host in
//! order, and reports the result through the pod status subresource so the real Tekton
//! controller finishes the TaskRun.
//!
//! Its kubelet endpoint serves the step logs, so that `kubectl logs` and `tkn ... logs` work.
//!
//! A deleted pod is stopped as a kubelet stops it: SIGTERM to the step's process group, its
//! grace period, SIGKILL; the pod object is removed only once its processes have ended.
//!
//! Usage: pod-runner --kubeconfig FILE --work-dir DIR [--path-prefix DIR]... [--node-name NAME]
//!        [--kubelet-port PORT --tls-cert FILE --tls-key FILE --client-ca FILE]

mod kubelet;
mod logs;
mod node;
mod plan;
mod run;
mod stop;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Preconditions};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Config, ResourceExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tracing::{error, info, warn};

use crate::node::{bind, register};
use crate::run::{Host, run_pod};
use crate::stop::{StopHandle, grace_period, stop_channel};

/// Kubelet stand-in for the local control plane: runs TaskRun pods' steps on this host.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Kubeconfig of the cluster; every step gets a copy defaulting to its pod's namespace.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: PathBuf,
    /// Where per-pod directories (scripts, step output) are made.
    #[arg(long)]
    work_dir: PathBuf,
    /// A directory put first on every step's PATH (repeatable).
    #[arg(long)]
    path_prefix: Vec<PathBuf>,
    /// The Node this pod-runner registers and binds the pods it runs to.
    #[arg(long, default_value = "pod-runner")]
    node_name: String,
    /// Serve the kubelet log endpoint on 127.0.0.1:PORT (HTTPS), for `kubectl logs`.
    #[arg(long, requires_all = ["tls_cert", "tls_key", "client_ca"])]
    kubelet_port: Option<u16>,
    /// Serving certificate of the kubelet endpoint (PEM, with an IP SAN 127.0.0.1).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// CA whose client certificates (the API server's) the kubelet endpoint accepts.
    #[arg(long)]
    client_ca: Option<PathBuf>,
}

impl Args {
    /// Starts the kubelet log endpoint, if asked to; returns its port.
    async fn serve_kubelet(&self, work_dir: PathBuf) -> Result<Option<u16>> {
        let (Some(port), Some(cert), Some(key), Some(ca)) = (
            self.kubelet_port,
            &self.tls_cert,
            &self.tls_key,
            &self.client_ca,
        ) else {
            return Ok(None);
        };
        let tls = kubelet::tls_config(cert, key, ca)?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .with_context(|| format!("listening on 127.0.0.1:{port}"))?;
        tokio::spawn(kubelet::serve(listener, tls, work_dir));
        info!(port, "serving the kubelet log endpoint on 127.0.0.1");
        Ok(Some(port))
    }

    fn host(&self) -> Result<Host> {
        std::fs::create_dir_all(&self.work_dir)
            .with_context(|| format!("creating {}", self.work_dir.display()))?;
        Ok(Host {
            kubeconfig: std::path::absolute(&self.kubeconfig)?,
            work_dir: std::path::absolute(&self.work_dir)?,
            path_prefix: self.path_prefix.clone(),
        })
    }
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

/// The pods this runner runs, by uid.
struct Runner {
    client: Client,
    host: Host,
    /// Our Node: unscheduled pods are bound to it, pods bound elsewhere are not ours.
    node: String,
    running: HashMap<String, StopHandle>,
    /// Pods whose run ended (by uid), so that a later update does not start them again.
    done: HashSet<String>,
    done_tx: mpsc::UnboundedSender<String>,
    /// Set on our own SIGTERM: steps are killed then, but their pods are left alone.
    shutting_down: Arc<AtomicBool>,
}

impl Runner {
    /// A pod was added or changed.
    fn apply(&mut self, pod: Pod) {
        let Some(uid) = pod.uid() else { return };
        if pod.metadata.deletion_timestamp.is_some() {
            self.deleting(pod, uid);
            return;
        }
        let bound_to = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        if finished(&pod)
            || self.running.contains_key(&uid)
            || self.done.contains(&uid)
            || !owned_by_taskrun(&pod)
            || bound_to.as_ref().is_some_and(|n| *n != self.node)
        {
            return;
        }
        let (handle, signal) = stop_channel();
        self.running.insert(uid.clone(), handle.clone());
        let (client, host, tx) = (self.client.clone(), self.host.clone(), self.done_tx.clone());
        let shutting_down = self.shutting_down.clone();
        let node = self.node.clone();
        tokio::spawn(async move {
            let key = key(&pod);
            let api: Api<Pod> =
                Api::namespaced(client.clone(), &pod.namespace().unwrap_or_default());
            let name = pod.name_any();
            // Bound first, as a scheduler would: a pod on a node gets a graceful deletion
            // (the API server deletes an unscheduled pod at once).
            let bound = match bound_to {
                Some(_) => Ok(pod),
                None => bind(&api, &name, &node)
                    .await
                    .map(|()| with_node(pod, &node)),
            };
            let ran = match bound {
                Ok(pod) => run_pod(client, pod, host, signal).await,
                Err(e) => Err(e),
            };
            if let Err(e) = ran {
                error!(pod = %key, "pod failed to run: {e:#}");
            }
            // Deleted while it ran: its processes have ended now, so finish the deletion.
            if handle.requested() && !shutting_down.load(Ordering::SeqCst) {
                remove_pod(&api, &name, &uid).await;
            }
            let _ = tx.send(uid);
        });
    }

    /// A pod has a deletionTimestamp: stop its processes (SIGTERM, grace period, SIGKILL); the
    /// task running it removes the pod object after. A pod with nothing running is removed at
    /// once, as a kubelet does once the containers are gone (else it stays Terminating).
    fn deleting(&mut self, pod: Pod, uid: String) {
        if let Some(handle) = self.running.get(&uid) {
            let grace = grace_period(&pod);
            if !handle.requested() {
                info!(pod = %key(&pod), ?grace, "pod is being deleted: SIGTERM to its steps");
            }
            handle.request(grace);
            return;
        }
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        if node.is_some_and(|n| n != self.node) {
            return; // another node's pod
        }
        let api: Api<Pod> =
            Api::namespaced(self.client.clone(), &pod.namespace().unwrap_or_default());
        let name = pod.name_any();
        tokio::spawn(async move { remove_pod(&api, &name, &uid).await });
    }

    /// A pod object is gone (e.g. force-deleted): stop what still runs of it, with the grace
    /// period its last state gave.
    fn deleted(&mut self, pod: &Pod) {
        if let Some(handle) = pod.uid().and_then(|uid| self.running.get(&uid))
            && !handle.requested()
        {
            info!(pod = %key(pod), "pod object removed: stopping its steps");
            handle.request(grace_period(pod));
        }
    }
}

fn with_node(mut pod: Pod, node: &str) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.node_name = Some(node.to_string());
    }
    pod
}

/// Removes the pod object for good (grace period 0), only if it is still the same pod.
async fn remove_pod(api: &Api<Pod>, name: &str, uid: &str) {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {} // gone, or another pod
        Err(e) => warn!(pod = name, "removing the pod object: {e}"),
    }
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
    let args = Args::parse();
    let host = args.host()?;
    let kubeconfig = Kubeconfig::read_from(&host.kubeconfig)
        .with_context(|| format!("reading {}", host.kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    let client = Client::try_from(config)?;
    let port = args.serve_kubelet(host.work_dir.clone()).await?;
    register(&client, &args.node_name, port).await?;

    let pods: Api<Pod> = Api::all(client.clone());
    let mut events = watcher::watcher(
        pods,
        watcher::Config::default().labels("tekton.dev/taskRun"),
    )
    .default_backoff()
    .boxed();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<String>();
    let mut runner = Runner {
        client,
        host,
        node: args.node_name.clone(),
        running: HashMap::new(),
        done: HashSet::new(),
        done_tx,
        shutting_down: Arc::new(AtomicBool::new(false)),
    };
    let mut listed: Option<HashSet<String>> = None;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    info!(work_dir = %runner.host.work_dir.display(), "pod-runner watching TaskRun pods");

    loop {
        tokio::select! {
            _ = sigterm.recv() => break,
            _ = sigint.recv() => break,
            Some(uid) = done_rx.recv() => {
                runner.running.remove(&uid);
                runner.done.insert(uid);
            }
            ev = events.next() => {
                let Some(ev) = ev else { bail!("pod watch ended") };
                match ev {
                    Ok(Event::Init) => listed = Some(HashSet::new()),
                    Ok(Event::InitDone) => {
                        // Pods removed while the watch was down: stop their steps now.
                        if let Some(seen) = listed.take() {
                            for (uid, handle) in &runner.running {
                                if !seen.contains(uid) {
                                    handle.request(std::time::Duration::ZERO);
                                }
                            }
                        }
                    }
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                        if let (Some(seen), Some(uid)) = (listed.as_mut(), pod.uid()) {
                            seen.insert(uid);
                        }
                        runner.apply(pod);
                    }
                    Ok(Event::Delete(pod)) => runner.deleted(&pod),
                    Err(e) => warn!("pod watch error (retrying): {e}"),
                }
            }
        }
    }
    runner.shutting_down.store(true, Ordering::SeqCst);
    shutdown(runner.running, done_rx).await;
    Ok(())
}

/// On our own SIGTERM (cluster down): kill every step at once and wait, bounded, for the pod
/// tasks to see their processes end.
async fn shutdown(
    mut running: HashMap<String, StopHandle>,
    mut done_rx: mpsc::UnboundedReceiver<String>,
) {
    info!(running = running.len(), "stopping: killing running steps");
    for handle in running.values() {
        handle.request(std::time::Duration::ZERO);
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !running.is_empty() {
        match tokio::time::timeout_at(deadline, done_rx.recv()).await {
            Ok(Some(uid)) => {
                running.remove(&uid);
            }
            _ => break,
        }
    }
}
