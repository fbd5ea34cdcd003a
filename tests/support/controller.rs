//! The tekton-mutex controller as a real process, scoped to one test namespace.

use super::{apply_yaml, client, kubeconfig_path, repo_root, secs, wait_until};
use anyhow::{Context, Result, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// A running `tekton-mutex run --namespace NS`; killed when dropped.
pub struct ControllerProcess {
    child: Child,
    pub log: PathBuf,
}

impl ControllerProcess {
    pub async fn start(namespace: &str) -> Result<Self> {
        Self::start_with_env(namespace, &[]).await
    }

    /// Starts the controller with extra environment (e.g. fault injection).
    /// Installs the Mutex CRD first, as `kubectl apply -f config/300-crd.yaml` would.
    pub async fn start_with_env(namespace: &str, env: &[(&str, &str)]) -> Result<Self> {
        Self::start_with(namespace, &[], env).await
    }

    /// Starts the controller with extra arguments and environment.
    pub async fn start_with(namespace: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        let args: Vec<&str> = ["--namespace", namespace]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        Self::spawn(namespace, &args, env).await
    }

    /// Starts a controller that serves every namespace (ClusterMutexes need one);
    /// `label` names its log file. Its token ledger for ClusterMutexes lives in namespace
    /// kube-system, as in the release install; it needs no namespace of its own.
    pub async fn start_cluster_wide(label: &str) -> Result<Self> {
        Self::spawn(label, &[], &[]).await
    }

    async fn spawn(namespace: &str, args: &[&str], env: &[(&str, &str)]) -> Result<Self> {
        install_crd(&repo_root().join("config/300-crd.yaml")).await?;
        let dir = repo_root().join("target/test-logs");
        std::fs::create_dir_all(&dir)?;
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let log = dir.join(format!("controller-{namespace}-{n}.log"));
        let out = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_tekton-mutex"))
            .arg("run")
            .args(args)
            .env("KUBECONFIG", kubeconfig_path())
            .env("RUST_LOG", "info,tekton_mutex=debug,kube=warn")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .context("starting tekton-mutex")?;
        Ok(Self { child, log })
    }

    /// The process id (for reading its memory and CPU from /proc).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Ask it to stop (SIGTERM), as Kubernetes does on a rolling update.
    pub fn terminate(&self) -> Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        anyhow::ensure!(status.success(), "kill -TERM failed: {status}");
        Ok(())
    }

    /// Kill it hard, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits (bounded) for the process to exit by itself.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let child = &mut self.child;
        let mut status = None;
        wait_until("the controller to exit", timeout, || {
            let s = child.try_wait();
            status = s.as_ref().ok().cloned().flatten();
            async move { Ok(s?.map(|_| ())) }
        })
        .await?;
        status.context("exit status")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Applies a CRD file and waits until the API server serves it.
pub async fn install_crd(path: &std::path::Path) -> Result<()> {
    let client = client().await?;
    let yaml =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let objs = apply_yaml(&client, None, &yaml).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    for o in objs {
        let name = o.metadata.name.clone().unwrap_or_default();
        wait_until(&format!("CRD {name} to be established"), secs(30), || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let crd = crds.get(&name).await?;
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            }
        })
        .await?;
    }
    Ok(())
}

/// The Run (v1alpha1) CRD from an older Tekton module, via hack/run-crd.sh.
pub async fn install_run_crd() -> Result<()> {
    let out = Command::new(repo_root().join("hack/run-crd.sh"))
        .output()
        .context("running hack/run-crd.sh")?;
    if !out.status.success() {
        bail!(
            "hack/run-crd.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let path = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    install_crd(&path).await
}
