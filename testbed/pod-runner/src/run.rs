//! Runs the steps of one TaskRun pod on the host and reports them through the pod status.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::logs::{StepLog, log_path};
use crate::plan::{Program, StepPlan, plan_pod};
use crate::stop::{StopSignal, kill_leftovers, wait_or_stop};

/// Host settings shared by every pod.
#[derive(Debug, Clone)]
pub struct Host {
    /// Per-pod directories live under here.
    pub work_dir: PathBuf,
    /// KUBECONFIG given to every step.
    pub kubeconfig: PathBuf,
    /// Directories put first on each step's PATH (the built kubectl and tkn).
    pub path_prefix: Vec<PathBuf>,
}

fn now() -> Value {
    serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now())).expect("time serializes")
}

#[derive(Debug, Clone)]
struct StepResult {
    exit_code: i32,
    reason: &'static str,
    started: Value,
    finished: Value,
    message: String,
}

/// Pod status writer: keeps the statuses of every container and patches them in one go.
struct StatusWriter {
    api: Api<Pod>,
    name: String,
    start_time: Value,
    init_names: Vec<String>,
    /// (container name, state)
    containers: Vec<(String, Value)>,
}

impl StatusWriter {
    fn set(&mut self, container: &str, state: Value) {
        if let Some(slot) = self.containers.iter_mut().find(|(n, _)| n == container) {
            slot.1 = state;
        }
    }

    async fn write(&self, phase: &str, message: Option<&str>) -> Result<()> {
        let init: Vec<Value> = self
            .init_names
            .iter()
            .map(|n| {
                json!({
                    "name": n, "image": "pod-runner", "imageID": "", "ready": false, "restartCount": 0,
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                        "startedAt": self.start_time, "finishedAt": self.start_time}}
                })
            })
            .collect();
        let containers: Vec<Value> = self
            .containers
            .iter()
            .map(|(n, state)| {
                let ready = state.get("running").is_some();
                json!({"name": n, "image": "pod-runner", "imageID": "", "ready": ready,
                       "restartCount": 0, "started": ready, "state": state})
            })
            .collect();
        let mut status = json!({
            "phase": phase,
            "startTime": self.start_time,
            "initContainerStatuses": init,
            "containerStatuses": containers,
        });
        if let Some(m) = message {
            status["message"] = json!(m);
        }
        // Retried while the API server is away (a restart), as a kubelet's status manager
        // retries: given up at once, a pod whose steps ended stayed Running for ever.
        let patch = Patch::Merge(json!({"status": status}));
        let deadline = std::time::Instant::now() + STATUS_RETRY;
        let mut pause = Duration::from_millis(200);
        loop {
            match self
                .api
                .patch_status(&self.name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if transient(&e) && std::time::Instant::now() < deadline => {
                    warn!(pod = %self.name, phase, "status write failed, retrying: {e}");
                    tokio::time::sleep(pause).await; // backoff between attempts
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!("patching status of pod {} to {phase}", self.name)
                    });
                }
            }
        }
    }
}

/// How long a pod status write is retried while the API server cannot take it.
const STATUS_RETRY: Duration = Duration::from_secs(180);

/// An error that a later attempt may not get: the API server unreachable, unavailable or
/// throttling (not a refusal such as a pod that is gone).
fn transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

fn terminated(r: &StepResult) -> Value {
    let mut t = json!({"exitCode": r.exit_code, "reason": r.reason,
                       "startedAt": r.started, "finishedAt": r.finished});
    if !r.message.is_empty() {
        t["message"] = json!(r.message);
    }
    json!({"terminated": t})
}

/// Runs a pod to completion, or until its deletion stops it (see [`crate::stop`]): then the
/// running step gets SIGTERM and its grace period, later steps do not start, and the pod ends
/// `Failed` once its processes have ended (the caller then removes the pod object).
pub async fn run_pod(client: Client, pod: Pod, host: Host, mut stop: StopSignal) -> Result<()> {
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let spec = pod
        .spec
        .clone()
        .ok_or_else(|| anyhow!("pod {ns}/{name} has no spec"))?;
    let pod_dir = host.work_dir.join(&ns).join(&name);
    std::fs::create_dir_all(pod_dir.join("root"))?;
    std::fs::create_dir_all(pod_dir.join("scripts"))?;
    std::fs::create_dir_all(pod_dir.join("tekton/results"))?;
    std::fs::create_dir_all(pod_dir.join("tekton/home"))?;
    let kubeconfig = write_pod_kubeconfig(&host.kubeconfig, &pod_dir, &ns)?;

    let mut writer = StatusWriter {
        api,
        name: name.clone(),
        start_time: now(),
        init_names: spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .collect(),
        containers: spec
            .containers
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    json!({"waiting": {"reason": "PodInitializing"}}),
                )
            })
            .collect(),
    };
    // Sidecars are not run; report them running until the steps end.
    for c in &spec.containers {
        if !c.name.starts_with(crate::plan::STEP_PREFIX) {
            writer.set(
                &c.name,
                json!({"running": {"startedAt": writer.start_time}}),
            );
        }
    }

    let plans = match plan_pod(&pod) {
        Ok(p) => p,
        Err(e) => {
            let msg = format!("pod-runner cannot run this pod: {e:#}");
            warn!(pod = %format!("{ns}/{name}"), "{msg}");
            let t = now();
            for c in &spec.containers {
                StepLog::end(&pod_dir, &c.name);
                writer.set(
                    &c.name,
                    terminated(&StepResult {
                        exit_code: 1,
                        reason: "PodRunnerError",
                        started: t.clone(),
                        finished: t.clone(),
                        message: String::new(),
                    }),
                );
            }
            return writer.write("Failed", Some(&msg)).await;
        }
    };
    writer.write("Running", None).await?;
    info!(pod = %format!("{ns}/{name}"), steps = plans.len(), dir = %pod_dir.display(), "running pod");

    let mut failed = false;
    for plan in &plans {
        let started = now();
        if failed || stop.requested() {
            // Tekton's entrypoint skips the steps after a failure and exits 1; a kubelet starts
            // no container of a pod being deleted.
            StepLog::end(&pod_dir, &plan.container);
            writer.set(
                &plan.container,
                terminated(&StepResult {
                    exit_code: 1,
                    reason: "Error",
                    started: started.clone(),
                    finished: started,
                    message: internal_message("Reason", "Skipped"),
                }),
            );
            continue;
        }
        writer.set(&plan.container, json!({"running": {"startedAt": started}}));
        writer.write("Running", None).await?;
        // run_step watches `stop` itself: it signals the step's whole process group.
        let outcome = run_step(&client, &pod, plan, &host, &kubeconfig, &pod_dir, &mut stop).await;
        let (code, note) = match outcome {
            Ok(code) => (code, None),
            Err(e) => (127, Some(format!("{e:#}"))),
        };
        if let Some(note) = &note {
            warn!(pod = %format!("{ns}/{name}"), step = %plan.container, "step could not start: {note}");
            append_log(&pod_dir, &plan.container, &format!("pod-runner: {note}\n"));
        }
        StepLog::end(&pod_dir, &plan.container);
        let mut result = StepResult {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" },
            started,
            finished: now(),
            message: results_message(&pod_dir),
        };
        info!(pod = %format!("{ns}/{name}"), step = %plan.container, exit_code = code,
              log = %log_path(&pod_dir, &plan.container).display(), "step finished");
        if code != 0 {
            if plan.on_error.as_deref() == Some("continue") {
                // Like Tekton's entrypoint: exit 0, and report the real code in the message.
                result.message = merge_messages(
                    &result.message,
                    &internal_message("ExitCode", &code.to_string()),
                );
                result.exit_code = 0;
                result.reason = "Completed";
            } else {
                failed = true;
            }
        }
        writer.set(&plan.container, terminated(&result));
    }
    let end = now();
    for c in &spec.containers {
        if !c.name.starts_with(crate::plan::STEP_PREFIX) {
            StepLog::end(&pod_dir, &c.name);
            writer.set(
                &c.name,
                terminated(&StepResult {
                    exit_code: 0,
                    reason: "Completed",
                    started: writer.start_time.clone(),
                    finished: end.clone(),
                    message: String::new(),
                }),
            );
        }
    }
    let phase = if failed || stop.requested() {
        "Failed"
    } else {
        "Succeeded"
    };
    writer.write(phase, None).await?;
    info!(pod = %format!("{ns}/{name}"), phase, "pod finished");
    Ok(())
}

fn internal_message(key: &str, value: &str) -> String {
    json!([{"key": key, "value": value, "type": 3}]).to_string()
}

fn merge_messages(a: &str, b: &str) -> String {
    let mut all: Vec<Value> = serde_json::from_str(a).unwrap_or_default();
    all.extend(serde_json::from_str::<Vec<Value>>(b).unwrap_or_default());
    if all.is_empty() {
        String::new()
    } else {
        Value::Array(all).to_string()
    }
}

/// Task results written so far (`$(results.x.path)` is rewritten into the pod directory), as a
/// Tekton termination message. Empty when there are none.
fn results_message(pod_dir: &Path) -> String {
    let mut results = Vec::new();
    if let Ok(entries) = std::fs::read_dir(pod_dir.join("tekton/results")) {
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            if let Ok(value) = std::fs::read_to_string(e.path()) {
                results.push(
                    json!({"key": e.file_name().to_string_lossy(), "value": value, "type": 1}),
                );
            }
        }
    }
    if results.is_empty() {
        String::new()
    } else {
        Value::Array(results).to_string()
    }
}

fn append_log(pod_dir: &Path, container: &str, text: &str) {
    if let Ok(mut log) = StepLog::open(pod_dir, container) {
        let _ = log.write(text.as_bytes());
    }
}

/// Copies a step's output from its pipe into its log until every writer has closed it.
fn copy_output(mut pipe: std::io::PipeReader, mut log: StepLog) {
    use std::io::Read;
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if let Err(e) = log.write(&buf[..n]) {
                    warn!("writing step output: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return warn!("reading step output: {e}"),
        }
    }
}

/// Kills a process group when dropped, unless disarmed once the group is known to be gone.
struct GroupKill(Option<i32>);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            crate::stop::signal_group(pgid, libc::SIGKILL);
        }
    }
}

/// Like in-cluster kubectl, which defaults to the pod's namespace: a copy of the cluster's
/// kubeconfig whose contexts default to `namespace`.
fn write_pod_kubeconfig(base: &Path, pod_dir: &Path, namespace: &str) -> Result<PathBuf> {
    let mut config = kube::config::Kubeconfig::read_from(base)
        .with_context(|| format!("reading {}", base.display()))?;
    for ctx in &mut config.contexts {
        if let Some(c) = ctx.context.as_mut() {
            c.namespace = Some(namespace.to_string());
        }
    }
    let path = pod_dir.join("kubeconfig");
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(path)
}

/// Rewrites the pod's `/tekton/...` paths into the pod directory on the host.
fn rewrite(s: &str, pod_dir: &Path) -> String {
    s.replace("/tekton/", &format!("{}/tekton/", pod_dir.display()))
}

/// Resolves a container's env into plain values.
async fn resolve_env(
    client: &Client,
    pod: &Pod,
    plan: &StepPlan,
) -> Result<BTreeMap<String, String>> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = BTreeMap::new();
    for e in &plan.env {
        let value = if let Some(v) = &e.value {
            v.clone()
        } else if let Some(from) = &e.value_from {
            if let Some(f) = &from.field_ref {
                field_value(pod, &f.field_path).ok_or_else(|| {
                    anyhow!("env {}: unsupported fieldRef {}", e.name, f.field_path)
                })?
            } else if let Some(r) = &from.config_map_key_ref {
                let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns)
                    .get(&r.name)
                    .await;
                match cm
                    .ok()
                    .and_then(|cm| cm.data.and_then(|d| d.get(&r.key).cloned()))
                {
                    Some(v) => v,
                    None if r.optional == Some(true) => continue,
                    None => {
                        return Err(anyhow!(
                            "env {}: configmap key {}/{} not found",
                            e.name,
                            r.name,
                            r.key
                        ));
                    }
                }
            } else if let Some(r) = &from.secret_key_ref {
                let s = Api::<Secret>::namespaced(client.clone(), &ns)
                    .get(&r.name)
                    .await;
                match s
                    .ok()
                    .and_then(|s| s.data.and_then(|d| d.get(&r.key).cloned()))
                {
                    Some(v) => String::from_utf8_lossy(&v.0).into_owned(),
                    None if r.optional == Some(true) => continue,
                    None => {
                        return Err(anyhow!(
                            "env {}: secret key {}/{} not found",
                            e.name,
                            r.name,
                            r.key
                        ));
                    }
                }
            } else {
                return Err(anyhow!("env {}: unsupported valueFrom", e.name));
            }
        } else {
            String::new()
        };
        out.insert(e.name.clone(), value);
    }
    Ok(out)
}

fn field_value(pod: &Pod, path: &str) -> Option<String> {
    let meta = &pod.metadata;
    let lookup = |m: &Option<BTreeMap<String, String>>, key: &str| {
        m.as_ref()
            .and_then(|m| m.get(key.trim_matches(|c| c == '\'' || c == '"')).cloned())
    };
    match path {
        "metadata.name" => meta.name.clone(),
        "metadata.namespace" => meta.namespace.clone(),
        "metadata.uid" => meta.uid.clone(),
        "spec.serviceAccountName" => pod.spec.as_ref()?.service_account_name.clone(),
        "spec.nodeName" => Some(pod.spec.as_ref()?.node_name.clone().unwrap_or_default()),
        "status.podIP" | "status.hostIP" => Some("127.0.0.1".into()),
        p if p.starts_with("metadata.labels[") => lookup(&meta.labels, &p[16..p.len() - 1]),
        p if p.starts_with("metadata.annotations[") => {
            lookup(&meta.annotations, &p[21..p.len() - 1])
        }
        _ => None,
    }
}

/// Runs one step to its end (by itself, or stopped by the pod's deletion): Ok(exit code, 128 +
/// signal when a signal ended it), Err when it could not start.
async fn run_step(
    client: &Client,
    pod: &Pod,
    plan: &StepPlan,
    host: &Host,
    kubeconfig: &Path,
    pod_dir: &Path,
    stop: &mut StopSignal,
) -> Result<i32> {
    let env = resolve_env(client, pod, plan).await?;
    let program: PathBuf = match &plan.program {
        Program::Script { path_in_pod, body } => {
            let file = pod_dir.join("scripts").join(
                Path::new(path_in_pod)
                    .file_name()
                    .ok_or_else(|| anyhow!("bad script path {path_in_pod}"))?,
            );
            std::fs::write(&file, rewrite(body, pod_dir))
                .with_context(|| format!("writing {}", file.display()))?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755))?;
            file
        }
        Program::Command { program } => PathBuf::from(program),
    };
    let cwd = match &plan.working_dir {
        Some(d) if !d.is_empty() => pod_dir.join("root").join(d.trim_start_matches('/')),
        _ => pod_dir.join("root"),
    };
    std::fs::create_dir_all(&cwd)?;

    let host_path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let mut path: Vec<String> = host
        .path_prefix
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    path.push(env.get("PATH").cloned().unwrap_or(host_path));
    let path = path.join(":");

    // Resolve a bare command name against the step's PATH, not the runner's.
    let program = match &plan.program {
        Program::Command { program: name } if !name.contains('/') => path
            .split(':')
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
            .ok_or_else(|| anyhow!("command {name:?} not found on PATH {path}"))?,
        _ => program,
    };

    // stdout and stderr share one pipe (their order kept), read by a copier that timestamps
    // each line for the kubelet log endpoint.
    let log = StepLog::open(pod_dir, &plan.container)?;
    let (pipe, pipe_writer) = std::io::pipe()?;
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(plan.args.iter().map(|a| rewrite(a, pod_dir)))
        .current_dir(&cwd)
        .envs(env.iter().map(|(k, v)| (k.clone(), rewrite(v, pod_dir))))
        .env("PATH", &path)
        .env("KUBECONFIG", kubeconfig)
        .stdin(Stdio::null())
        .stdout(Stdio::from(pipe_writer.try_clone()?))
        .stderr(Stdio::from(pipe_writer))
        .process_group(0)
        .kill_on_drop(true);
    let spawned = cmd.spawn();
    // Our copies of the pipe's write end: the copier sees EOF once the step's processes are gone.
    drop(cmd);
    let mut child = spawned
        .with_context(|| format!("starting {} for {}", program.display(), plan.container))?;
    let copier = tokio::task::spawn_blocking(move || copy_output(pipe, log));
    let pgid = child
        .id()
        .context("the step exited before its pid was known")? as i32;
    // Whatever happens to this future (finished, stopped, dropped), the step's process group
    // dies with it, including anything the script left running in the background.
    let mut group = GroupKill(Some(pgid));
    let ended = wait_or_stop(&mut child, pgid, stop).await?;
    kill_leftovers(pgid).await;
    group.0 = None;
    // The log is complete before the step is reported terminated. Bounded: a process that left
    // the group may hold the pipe open.
    if tokio::time::timeout(Duration::from_secs(5), copier)
        .await
        .is_err()
    {
        warn!(step = %plan.container, "step output still open 5 s after the step ended");
    }
    let code = exit_code(ended.status);
    if ended.stopped {
        info!(step = %plan.container, exit_code = code, "step ended after its pod's deletion");
    }
    Ok(code)
}

/// A shell-style exit code: the process's own, or 128 + the signal that ended it.
pub fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0))
}
