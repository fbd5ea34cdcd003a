//! The local control plane's own processes (hack/cluster.sh): restart its kube-apiserver or
//! etcd with the same command line, wait for the API to serve again, and compact etcd, for the
//! faults of the chaos campaign and of cluster tests that need the infrastructure to fail.

use super::{repo_root, secs, wait_until};
use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

pub fn cluster_dir() -> PathBuf {
    std::env::var_os("TEKTON_MUTEX_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cluster"))
}

fn gone_or_zombie(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

/// Restarts a component of hack/cluster.sh (`etcd` or `kube-apiserver`) with the same command
/// line: SIGTERM the recorded pid, wait for it to exit, stay down `down`, start it again in its
/// own session logging to the same file, and record the new pid where `cluster.sh down` finds it.
pub async fn restart_component(name: &str, down: Duration) -> Result<()> {
    let dir = cluster_dir();
    let pid_file = dir.join("pids").join(format!("{name}.pid"));
    let pid: u32 = std::fs::read_to_string(&pid_file)
        .with_context(|| format!("reading {}", pid_file.display()))?
        .trim()
        .parse()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    if !args.iter().any(|a| a.contains(&*dir.to_string_lossy())) {
        bail!("pid {pid} of {name} is not this cluster's ({args:?})");
    }
    let gone = || async move { Ok(gone_or_zombie(pid).then_some(())) };
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    // A kube-apiserver with open watches may take long to drain: SIGKILL after a grace period.
    if wait_until(&format!("{name} to exit"), secs(15), gone)
        .await
        .is_err()
    {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        wait_until(&format!("{name} to die"), secs(15), gone).await?;
    }
    tokio::time::sleep(down).await; // the fault's downtime, not a synchronization
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("logs").join(format!("{name}.log")))?;
    // Through bash, to close fd 9: the per-checkout lock hack/chaos.sh holds (flock) must not
    // be inherited by a component that outlives the campaign.
    let child = Command::new("bash")
        .args(["-c", "exec 9>&-; exec setsid \"$@\"", "restart"])
        .args(&args)
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("restarting {name}"))?;
    std::fs::write(&pid_file, format!("{}\n", child.id()))?;
    // The child is reaped by `cluster.sh down` (or by init once this process exits).
    std::mem::forget(child);
    Ok(())
}

/// Waits until the API server answers a read that goes to etcd.
pub async fn wait_api(client: &Client) -> Result<()> {
    let ns: Api<Namespace> = Api::all(client.clone());
    wait_until("the API server to serve again", secs(120), || {
        let ns = ns.clone();
        async move { Ok(ns.get("default").await.ok().map(|_| ())) }
    })
    .await
}

/// The client URL of the cluster's etcd, as its kube-apiserver was started with it.
fn etcd_url() -> Result<String> {
    let pid_file = cluster_dir().join("pids").join("kube-apiserver.pid");
    let pid = std::fs::read_to_string(&pid_file)?.trim().to_string();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let at = args.iter().position(|a| a == "--etcd-servers");
    at.and_then(|i| args.get(i + 1).cloned())
        .context("the kube-apiserver's --etcd-servers")
}

/// Compacts etcd at its current revision (through its JSON gateway, `/v3/kv/compaction`): every
/// watch from an earlier resourceVersion then ends with 410 Gone, as after a long outage.
/// Returns the revision.
pub fn compact_etcd() -> Result<i64> {
    let url = etcd_url()?;
    let post = |path: &str, body: &str| -> Result<serde_json::Value> {
        let out = Command::new("curl")
            .args([
                "-sf",
                "--max-time",
                "10",
                "-X",
                "POST",
                &format!("{url}{path}"),
                "-d",
                body,
            ])
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "curl {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(serde_json::from_slice(&out.stdout)?)
    };
    let head = post("/v3/kv/range", r#"{"key":"AA==","limit":1}"#)?;
    let revision: i64 = head["header"]["revision"]
        .as_str()
        .context("etcd's revision")?
        .parse()?;
    post(
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{revision}","physical":true}}"#),
    )?;
    Ok(revision)
}
