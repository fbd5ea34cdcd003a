//! Test support for integration tests against the local control plane (`hack/cluster.sh up`).
//!
//! Use it from a test file with `mod support;`. Every test gets its own namespace:
//!
//! ```ignore
//! mod support;
//! use support::*;
//!
//! #[tokio::test]
//! async fn my_test() -> anyhow::Result<()> {
//!     let ns = TestNamespace::create("my-test").await?;
//!     ns.apply(r#"{apiVersion: v1, kind: ConfigMap, metadata: {name: x}}"#).await?;
//!     let cond = ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "run", secs(60)).await?;
//!     Ok(())
//! }
//! ```
//!
//! The cluster is found through `KUBECONFIG`, else `<repo>/.cluster/kubeconfig`. The built `tkn`
//! and `kubectl` are found through `TEKTON_MUTEX_TKN` / `TEKTON_MUTEX_KUBECTL` (exported by
//! hack/test.sh), else through hack/lib.sh's `component_bin`.
#![allow(dead_code)]

pub mod cli;
pub mod components;
pub mod controller;
pub mod locks;
pub mod ops;
pub mod pipelines;
pub mod policies;
pub mod timeline;

use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{self, ApiCapabilities, ApiResource, Scope};
use kube::{Client, Config};
use serde::Deserialize;
use serde_json::{Value, json};

/// Field manager used for server-side apply from tests.
pub const FIELD_MANAGER: &str = "tekton-mutex-tests";
/// Poll interval of `wait_until` (a bounded condition poll, never a synchronization sleep).
pub const POLL: Duration = Duration::from_millis(200);

/// `Duration::from_secs`, for brevity in tests.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kubeconfig of the local cluster: `KUBECONFIG`, else `<repo>/.cluster/kubeconfig`.
pub fn kubeconfig_path() -> PathBuf {
    match std::env::var_os("KUBECONFIG") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => repo_root().join(".cluster/kubeconfig"),
    }
}

/// A client for the local cluster. Fails with a hint when no cluster is up.
pub async fn client() -> Result<Client> {
    let path = kubeconfig_path();
    let kubeconfig = Kubeconfig::read_from(&path).with_context(|| {
        format!(
            "no cluster: cannot read {} (start one with hack/cluster.sh up, or run hack/test.sh)",
            path.display()
        )
    })?;
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(Client::try_from(config)?)
}

/// Polls `condition` every [`POLL`] until it returns `Ok(Some(value))`, fails, or `timeout`
/// passes. `Ok(None)` means "not yet". The error names `desc` and the last "not yet" reason is
/// not known, so make `desc` say what was awaited.
pub async fn wait_until<T, F, Fut>(desc: &str, timeout: Duration, mut condition: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = condition()
            .await
            .with_context(|| format!("while waiting for {desc}"))?
        {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {desc}");
        }
        tokio::time::sleep(POLL).await; // poll interval of a bounded condition wait
    }
}

/// A `status.conditions[]` entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Condition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// The condition of type `type_` in an object's `status.conditions`, if any.
pub fn condition(obj: &DynamicObject, type_: &str) -> Option<Condition> {
    obj.data
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .filter_map(|c| serde_json::from_value::<Condition>(c.clone()).ok())
        .find(|c| c.type_ == type_)
}

/// Resolves `apiVersion` + `kind` to an API resource through discovery.
pub async fn resolve(
    client: &Client,
    api_version: &str,
    kind: &str,
) -> Result<(ApiResource, ApiCapabilities)> {
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let gvk = GroupVersionKind::gvk(group, version, kind);
    discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("the cluster does not serve {api_version} {kind}"))
}

/// A dynamic API for `apiVersion` + `kind`, scoped to `namespace` when the kind is namespaced.
pub async fn dynamic_api(
    client: &Client,
    namespace: Option<&str>,
    api_version: &str,
    kind: &str,
) -> Result<Api<DynamicObject>> {
    let (ar, caps) = resolve(client, api_version, kind).await?;
    Ok(match (caps.scope, namespace) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &ar),
        (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
    })
}

/// Applies every document of a (multi-document) YAML text. Namespaced objects go to `namespace`
/// (overriding what the YAML says). Objects with a `metadata.name` are server-side applied
/// (create or update); objects with only `metadata.generateName` are created. Returns the
/// objects as the server stored them, in order.
pub async fn apply_yaml(
    client: &Client,
    namespace: Option<&str>,
    yaml: &str,
) -> Result<Vec<DynamicObject>> {
    let mut out = Vec::new();
    let docs: Vec<Value> = serde_saphyr::from_str_multiple(yaml).context("parsing YAML")?;
    for mut value in docs {
        if value.is_null() {
            continue;
        }
        let api_version = value["apiVersion"]
            .as_str()
            .context("a document has no apiVersion")?
            .to_string();
        let kind = value["kind"]
            .as_str()
            .context("a document has no kind")?
            .to_string();
        let (ar, caps) = resolve(client, &api_version, &kind).await?;
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = namespace
                    .map(str::to_string)
                    .or_else(|| {
                        value
                            .pointer("/metadata/namespace")
                            .and_then(Value::as_str)
                            .map(String::from)
                    })
                    .unwrap_or_else(|| "default".into());
                value["metadata"]["namespace"] = json!(ns);
                Api::namespaced_with(client.clone(), &ns, &ar)
            }
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        let obj: DynamicObject =
            serde_json::from_value(value.clone()).context("not a Kubernetes object")?;
        let stored = match value.pointer("/metadata/name").and_then(Value::as_str) {
            Some(name) => api
                .patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&obj),
                )
                .await
                .with_context(|| format!("applying {kind} {name}"))?,
            None => api
                .create(&PostParams::default(), &obj)
                .await
                .with_context(|| format!("creating {kind} (generateName)"))?,
        };
        out.push(stored);
    }
    Ok(out)
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A namespace of its own for one test, with its `default` ServiceAccount in place at once.
/// Dropping it deletes the Tekton runs and pods in it, then the namespace itself (the
/// controller-manager's namespace controller removes it). Set `TEKTON_MUTEX_KEEP_NAMESPACES=1`
/// to keep them for debugging.
pub struct TestNamespace {
    name: String,
    client: Client,
}

impl TestNamespace {
    /// Creates `<prefix>-<pid>-<n>-<random>` (trimmed to a valid name).
    pub async fn create(prefix: &str) -> Result<Self> {
        let client = client().await?;
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .subsec_nanos();
        let prefix: String = prefix
            .to_lowercase()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .take(40)
            .collect();
        let name = format!(
            "{}-{}-{n}-{:x}",
            prefix.trim_matches('-'),
            std::process::id(),
            nanos & 0xfffff
        );
        let namespaces: Api<Namespace> = Api::all(client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}}))?,
            )
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        // The controller-manager creates it too; whoever comes first wins.
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
        match sas
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => {
                return Err(e).with_context(|| format!("creating ServiceAccount {name}/default"));
            }
        }
        Ok(Self { name, client })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A typed API in this namespace, e.g. `ns.api::<ConfigMap>()`.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// A dynamic API for `apiVersion` + `kind` in this namespace.
    pub async fn dynamic(&self, api_version: &str, kind: &str) -> Result<Api<DynamicObject>> {
        dynamic_api(&self.client, Some(&self.name), api_version, kind).await
    }

    /// [`apply_yaml`] into this namespace.
    pub async fn apply(&self, yaml: &str) -> Result<Vec<DynamicObject>> {
        apply_yaml(&self.client, Some(&self.name), yaml).await
    }

    /// Gets one object, `None` if it does not exist.
    pub async fn get_opt(
        &self,
        api_version: &str,
        kind: &str,
        name: &str,
    ) -> Result<Option<DynamicObject>> {
        Ok(self.dynamic(api_version, kind).await?.get_opt(name).await?)
    }

    /// Waits until the object's `Succeeded` condition is `True` or `False` and returns it.
    /// Works for PipelineRuns, TaskRuns and CustomRuns.
    pub async fn wait_for_succeeded(
        &self,
        api_version: &str,
        kind: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Condition> {
        let api = self.dynamic(api_version, kind).await?;
        let desc = format!("{kind} {}/{name} to finish", self.name);
        let result = wait_until(&desc, timeout, || {
            let api = api.clone();
            async move {
                let Some(obj) = api.get_opt(name).await? else {
                    return Ok(None);
                };
                Ok(condition(&obj, "Succeeded")
                    .filter(|c| c.status == "True" || c.status == "False"))
            }
        })
        .await;
        if result.is_err() {
            // Say where things stood.
            if let Ok(Some(obj)) = api.get_opt(name).await {
                let cond = condition(&obj, "Succeeded");
                return result.with_context(|| format!("last Succeeded condition: {cond:?}"));
            }
        }
        result
    }

    /// Runs the built `tkn` with `args` plus `-n <this namespace>`; returns stdout.
    pub fn tkn(&self, args: &[&str]) -> Result<String> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-n", &self.name]);
        tkn(&all)
    }

    /// Runs the built `kubectl` with `args` plus `-n <this namespace>`; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-n", &self.name]);
        kubectl(&all)
    }

    /// Puts lock `object` (`mutex/k`, or `clustermutex/k` for a ClusterMutex) back without its
    /// status, as a hand-wipe or a restore without status does: `kubectl replace
    /// --subresource=status`.
    pub fn wipe_status(&self, object: &str) -> Result<()> {
        let mut wiped: serde_json::Value =
            serde_json::from_str(&self.kubectl(&["get", object, "-o", "json"])?)?;
        wiped
            .as_object_mut()
            .context("a lock object")?
            .remove("status");
        self.replace_status(&wiped).map(|_| ())
    }

    /// `kubectl replace --subresource=status` with `object`; returns stdout.
    pub fn replace_status(&self, object: &serde_json::Value) -> Result<String> {
        let file = repo_root().join(format!("target/{}-status.json", self.name));
        std::fs::write(&file, object.to_string())?;
        let out = self.kubectl(&[
            "replace",
            "--subresource=status",
            "-f",
            &file.to_string_lossy(),
        ]);
        std::fs::remove_file(&file)?;
        out
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("TEKTON_MUTEX_KEEP_NAMESPACES").is_some() {
            eprintln!(
                "keeping namespace {} (TEKTON_MUTEX_KEEP_NAMESPACES)",
                self.name
            );
            return;
        }
        let name = self.name.clone();
        // Drop cannot await; clean up on a thread with its own runtime and client.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(delete_namespace(&name))
        });
        match cleanup.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: cleaning up namespace {}: {e:#}", self.name),
            Err(_) => eprintln!("warning: cleaning up namespace {} panicked", self.name),
        }
    }
}

/// Deletes the Tekton runs and pods of a namespace (there is no garbage collector here), then
/// the namespace.
pub async fn delete_namespace(name: &str) -> Result<()> {
    let client = client().await?;
    for (api_version, kind) in [
        ("tekton.dev/v1", "PipelineRun"),
        ("tekton.dev/v1", "TaskRun"),
        ("tekton.dev/v1beta1", "CustomRun"),
        ("v1", "Pod"),
    ] {
        if let Ok(api) = dynamic_api(&client, Some(name), api_version, kind).await {
            let _ = api
                .delete_collection(&DeleteParams::background(), &ListParams::default())
                .await;
        }
    }
    release_mutexes(&client, name).await;
    let namespaces: Api<Namespace> = Api::all(client);
    match namespaces.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the namespace's Mutexes and takes off their finalizer. The controller that would take
/// it off is often gone by now, and the namespace would stay Terminating: the API server retried
/// its contents for as long as the cluster ran (112% CPU with several 10,000-run namespaces).
async fn release_mutexes(client: &Client, namespace: &str) {
    let Ok(api) = dynamic_api(
        client,
        Some(namespace),
        "tekton-mutex.dev/v1alpha1",
        "Mutex",
    )
    .await
    else {
        return;
    };
    let _ = api
        .delete_collection(&DeleteParams::background(), &ListParams::default())
        .await;
    let Ok(left) = api.list(&ListParams::default()).await else {
        return;
    };
    let no_finalizers = json!({"metadata": {"finalizers": null}});
    for m in left {
        if let Some(m) = m.metadata.name {
            let _ = api
                .patch(&m, &PatchParams::default(), &Patch::Merge(&no_finalizers))
                .await;
        }
    }
}

/// Path of a built tool (`tkn` or `kubectl`): `TEKTON_MUTEX_<NAME>`, else hack/lib.sh's
/// `component_bin`.
pub fn tool_path(name: &str) -> Result<PathBuf> {
    let var = format!("TEKTON_MUTEX_{}", name.to_uppercase());
    if let Some(p) = std::env::var_os(&var).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let lib = repo_root().join("hack/lib.sh");
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("source {:?} && component_bin {name}", lib))
        .output()
        .context("running bash to locate the built tools")?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !path.is_file() {
        bail!(
            "{name} is not built (looked at {}; set {var} or run hack/build.sh): {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(path)
}

/// Runs a built tool against the local cluster (KUBECONFIG set); returns stdout, or an error
/// with stderr when it exits non-zero.
pub fn run_tool(name: &str, args: &[&str]) -> Result<String> {
    let path = tool_path(name)?;
    let out = Command::new(&path)
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    if !out.status.success() {
        return Err(anyhow!(
            "{name} {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Takes out of `cmd`'s environment what cargo sets for a test binary (`CARGO_MANIFEST_DIR`,
/// `CARGO_PKG_*`, ...), for a test that starts a script which runs cargo (hack/release.sh,
/// hack/demo.sh). Build scripts such as ring's rerun when these change, so a cargo build started
/// from a test would otherwise compile ring and everything above it again, and the next build from
/// a shell once more.
pub fn without_cargo_test_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let set_by_cargo_test = k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_BIN_EXE_")
            || matches!(
                k.as_str(),
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "CARGO_RUSTC_CURRENT_DIR"
                    | "OUT_DIR"
            );
        if set_by_cargo_test {
            cmd.env_remove(&k);
        }
    }
    cmd
}

/// Runs the built `tkn`.
pub fn tkn(args: &[&str]) -> Result<String> {
    run_tool("tkn", args)
}

/// Runs the built `kubectl`.
pub fn kubectl(args: &[&str]) -> Result<String> {
    run_tool("kubectl", args)
}

/// Where the pod-runner keeps a step's output: `<repo>/.cluster/pods/<ns>/<pod>/<step>.log`.
pub fn step_log_path(namespace: &str, pod: &str, step_container: &str) -> PathBuf {
    let cluster = std::env::var_os("TEKTON_MUTEX_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cluster"));
    cluster
        .join("pods")
        .join(namespace)
        .join(pod)
        .join(format!("{step_container}.log"))
}
