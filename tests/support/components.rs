//! The local control plane's own processes (hack/cluster.sh): restart its kube-apiserver or
//! etcd with the same command line, wait for the API to serve again, compact etcd, and take and
//! restore an etcd snapshot (`etcd_snapshot`, `restore_etcd`: the token floor that follows the
//! clock is proven by them), for the faults of the chaos campaign and of cluster tests that
//! need the infrastructure to fail.

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

/// A running component of this cluster: its pid, where that is recorded, its command line and
/// its environment (Tekton's controller takes its namespace from it).
struct Running {
    name: String,
    pid: u32,
    pid_file: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// The component `name` of this cluster, as running now: refused if its command line does not
/// name this cluster's directory (a pid file left from another cluster).
fn running(name: &str) -> Result<Running> {
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
    let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
    let env = environ
        .split(|b| *b == 0)
        .filter_map(|v| {
            String::from_utf8_lossy(v)
                .split_once('=')
                .map(|(k, v)| (k.into(), v.into()))
        })
        .collect();
    let name = name.to_string();
    Ok(Running {
        name,
        pid,
        pid_file,
        args,
        env,
    })
}

/// SIGTERM, then SIGKILL after a grace period (a kube-apiserver with open watches may take long
/// to drain); returns once the process is gone.
async fn stop(c: &Running) -> Result<()> {
    let (name, pid) = (&c.name, c.pid);
    let gone = || async move { Ok(gone_or_zombie(pid).then_some(())) };
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    if wait_until(&format!("{name} to exit"), secs(15), gone)
        .await
        .is_err()
    {
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()?;
        wait_until(&format!("{name} to die"), secs(15), gone).await?;
    }
    Ok(())
}

/// Starts `c` again with the same command line, in its own session, logging to the same file,
/// and records the new pid where `cluster.sh down` finds it.
fn start(c: &Running) -> Result<()> {
    let log = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(cluster_dir().join("logs").join(format!("{}.log", c.name)))?;
    // Through bash, to close fd 9: the per-checkout lock hack/chaos.sh holds (flock) must not
    // be inherited by a component that outlives the campaign.
    let child = Command::new("bash")
        .args(["-c", "exec 9>&-; exec setsid \"$@\"", "restart"])
        .args(&c.args)
        .env_clear()
        .envs(c.env.iter().cloned())
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("restarting {}", c.name))?;
    std::fs::write(&c.pid_file, format!("{}\n", child.id()))?;
    // The child is reaped by `cluster.sh down` (or by init once this process exits).
    std::mem::forget(child);
    Ok(())
}

/// Restarts a component of hack/cluster.sh (`etcd`, `kube-apiserver`, `tekton-controller`,
/// `pod-runner`, ...) with the same command line and environment: stopped, down for `down`,
/// started again.
pub async fn restart_component(name: &str, down: Duration) -> Result<()> {
    let c = running(name)?;
    stop(&c).await?;
    tokio::time::sleep(down).await; // the fault's downtime, not a synchronization
    start(&c)
}

/// The value of flag `flag` in a command line (`--flag value`).
fn flag<'a>(args: &'a [String], flag: &str) -> Result<&'a str> {
    let at = args.iter().position(|a| a == flag);
    at.and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .with_context(|| format!("{flag} in {args:?}"))
}

/// A snapshot of the cluster's etcd, taken while it serves, as `etcdctl snapshot save` takes
/// one (the Snapshot RPC, here through etcd's JSON gateway): the database and its SHA-256,
/// written to `to`.
pub fn etcd_snapshot(to: &std::path::Path) -> Result<()> {
    use base64::Engine;
    let url = etcd_url()?;
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "60", "-X", "POST"])
        .arg(format!("{url}/v3/maintenance/snapshot"))
        .args(["-d", "{}"])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "the snapshot: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut db = Vec::new();
    for chunk in serde_json::Deserializer::from_slice(&out.stdout).into_iter::<serde_json::Value>()
    {
        let chunk = chunk?;
        let blob = chunk["result"]["blob"].as_str().unwrap_or_default();
        db.extend(base64::engine::general_purpose::STANDARD.decode(blob)?);
    }
    anyhow::ensure!(!db.is_empty(), "an empty snapshot");
    std::fs::write(to, db)?;
    Ok(())
}

/// Restores the cluster's etcd from `snapshot` as Kubernetes documents it: the API server
/// stopped, then etcd; `etcdutl snapshot restore` into a fresh data directory, with the
/// revision bumped and marked compacted (so that every watch ends with 410 Gone and lists
/// again, instead of waiting for a revision from before the restore); etcd started on it, then
/// the API server. The restored member keeps the name, peer URLs and data directory.
pub async fn restore_etcd(snapshot: &std::path::Path) -> Result<()> {
    let (api, etcd) = (running("kube-apiserver")?, running("etcd")?);
    stop(&api).await?;
    stop(&etcd).await?;
    let data = PathBuf::from(flag(&etcd.args, "--data-dir")?);
    let restored = data.with_extension("restored");
    let _ = std::fs::remove_dir_all(&restored);
    let etcdutl = Command::new("bash")
        .arg("-c")
        .arg("source \"$1/hack/lib.sh\"; component_bin etcdutl")
        .arg("etcdutl")
        .arg(repo_root())
        .output()?;
    let etcdutl = String::from_utf8(etcdutl.stdout)?.trim().to_string();
    let out = Command::new(&etcdutl)
        .args(["snapshot", "restore"])
        .arg(snapshot)
        .arg("--data-dir")
        .arg(&restored)
        .args(["--name", flag(&etcd.args, "--name")?])
        .args(["--initial-cluster", flag(&etcd.args, "--initial-cluster")?])
        .args([
            "--initial-advertise-peer-urls",
            flag(&etcd.args, "--initial-advertise-peer-urls")?,
        ])
        .args(["--bump-revision", "1000000000", "--mark-compacted"])
        .output()
        .with_context(|| format!("running {etcdutl}"))?;
    anyhow::ensure!(
        out.status.success(),
        "etcdutl snapshot restore: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&data)?;
    std::fs::rename(&restored, &data)?;
    start(&etcd)?;
    start(&api)
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
