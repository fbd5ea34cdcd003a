//! config/ is what platform teams apply. The API server must accept every
//! manifest, and the controller must work with exactly the RBAC it grants:
//! cluster-wide (config/) and namespace-scoped (config/namespaced/), each
//! with leader election on, so the Lease rules are exercised too. Which
//! objects each install holds is checked without a cluster in src/manifests.rs.

mod support;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use std::path::{Path, PathBuf};
use support::controller::ControllerProcess;
use support::ops::service_account_kubeconfig;
use support::pipelines::*;
use support::*;
use tekton_mutex::model::mutex::Mutex;

/// Every kind of write: create the Mutex, write its status, patch run statuses,
/// cancel a superseded PipelineRun, record Events, hold a Lease.
async fn exercise_every_write(ns: &TestNamespace, c: &ControllerProcess) -> Result<()> {
    wait_until("the controller to lead", slow(), || async {
        Ok(c.log_text().contains("became the leader").then_some(()))
    })
    .await?;
    ns.apply(&pipeline("promote", &Opts::default())).await?;
    ns.apply(&pipeline_run("a", "promote", &[])).await?;
    wait_reason(ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "promote", &[])).await?;
    wait_reason(ns, &lock_run("b"), "Waiting", slow()).await?;
    ns.apply(&pipeline_run("c", "promote", &[])).await?;
    wait_superseded(ns, &lock_run("b")).await?;
    wait_until("the Superseded event on b", slow(), || async {
        let events = ns.kubectl(&[
            "get",
            "events",
            "--field-selector",
            "reason=Superseded",
            "-o",
            "name",
        ])?;
        Ok((!events.trim().is_empty()).then_some(()))
    })
    .await?;
    let log = c.log_text();
    ensure!(
        !log.contains("forbidden"),
        "the controller hit a permission error:\n{log}"
    );
    release(ns, "a").await?;
    wait_reason(ns, &lock_run("c"), "Acquired", slow()).await?;
    // Idle again: the ledger ConfigMap covers the last token, the finalizer comes off.
    release(ns, "c").await?;
    let (mutexes, key) = (ns.api::<Mutex>(), ns.name());
    wait_until("the idle Mutex to lose its finalizer", slow(), || async {
        let m = mutexes.get(key).await?;
        Ok(m.metadata
            .finalizers
            .unwrap_or_default()
            .is_empty()
            .then_some(()))
    })
    .await?;
    let ledger = ns
        .api::<ConfigMap>()
        .get("tekton-mutex-token-floors")
        .await?;
    let entry = ledger
        .data
        .unwrap_or_default()
        .remove(&format!("mutex.{key}"));
    // c's token 2, inside the block of tokens the first grant reserved.
    let held: Option<i64> = entry.as_deref().and_then(|e| e.parse().ok());
    ensure!(
        held.is_some_and(|t| t >= 2),
        "the ledger does not cover c's token 2: {entry:?}"
    );
    let log = c.log_text();
    ensure!(
        !log.contains("forbidden"),
        "the controller hit a permission error:\n{log}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn controller_works_with_exactly_the_rbac_in_config() -> Result<()> {
    let client = client().await?;
    // As `kubectl apply -f config/`, but without the admission policies: they are
    // cluster-wide, and would judge other tests' requests and grants (queue_control and
    // queued_pipeline_runs install them, each bound to its own namespace).
    for file in config_files("config")? {
        let name = file.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with("40") && name.contains("admission") {
            continue;
        }
        let yaml = std::fs::read_to_string(&file)?;
        apply_yaml(&client, None, &yaml)
            .await
            .with_context(|| format!("applying {}", file.display()))?;
    }
    wait_aggregated(&client, "edit", "mutexes").await?;
    wait_aggregated(&client, "view", "clustermutexes").await?;
    let ns = TestNamespace::create("rbac").await?;
    let kubeconfig = service_account_kubeconfig("tekton-mutex", "tekton-mutex")?;
    // The Lease lives in the controller's own namespace, as in the Deployment.
    let lease = format!("rbac-{}", ns.name());
    let c = ControllerProcess::start_with(
        ns.name(),
        &[
            "--leader-elect",
            "--lease-namespace",
            "tekton-mutex",
            "--lease-name",
            &lease,
        ],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )
    .await?;
    exercise_every_write(&ns, &c).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn controller_works_with_exactly_the_namespaced_rbac() -> Result<()> {
    let client = client().await?;
    let crd = std::fs::read_to_string(repo_root().join("config/300-crd.yaml"))?;
    apply_yaml(&client, None, &crd).await?;
    let ns = TestNamespace::create("rbac-ns").await?;
    // As the README says: the manifests name the namespace `pipelines`; use yours.
    for file in config_files("config/namespaced")? {
        let yaml = in_namespace(&std::fs::read_to_string(&file)?, ns.name());
        apply_yaml(&client, None, &yaml)
            .await
            .with_context(|| format!("applying {}", file.display()))?;
    }
    let kubeconfig = service_account_kubeconfig(ns.name(), "tekton-mutex")?;
    let c = ControllerProcess::start_with(
        ns.name(),
        &["--leader-elect"],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )
    .await?;
    exercise_every_write(&ns, &c).await
}

/// The YAML files of a config directory, in the order `kubectl apply -f DIR` applies them.
fn config_files(dir: &str) -> Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join(dir))?
        .map(|e| Ok(e?.path()))
        .collect::<Result<_>>()?;
    files.retain(|f| f.extension().is_some_and(|e| e == "yaml"));
    files.sort();
    Ok(files)
}

/// The README's `sed 's/namespace: pipelines$/namespace: my-ns/'`.
fn in_namespace(yaml: &str, namespace: &str) -> String {
    yaml.replace(
        "namespace: pipelines\n",
        &format!("namespace: {namespace}\n"),
    )
}

#[test]
fn the_readme_sed_moves_every_namespaced_object() -> Result<()> {
    for file in config_files("config/namespaced")? {
        let yaml = in_namespace(&std::fs::read_to_string(&file)?, "my-ns");
        let missed = yaml
            .lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains("namespace: pipelines"));
        ensure!(
            !missed,
            "{} names a namespace the sed misses",
            file.display()
        );
    }
    Ok(())
}

#[test]
fn the_namespace_is_written_once_and_first() -> Result<()> {
    let files = config_files("config")?;
    let first = files.first().and_then(|f| f.file_name());
    ensure!(first == Some("100-namespace.yaml".as_ref()), "{files:?}");
    let count = |f: &Path| -> Result<usize> {
        Ok(std::fs::read_to_string(f)?
            .matches("kind: Namespace\n")
            .count())
    };
    let written = files.iter().map(|f| count(f)).sum::<Result<usize>>()?;
    ensure!(written == 1, "config/ writes the Namespace {written} times");
    Ok(())
}

/// The built-in ClusterRole `role` (edit, view) takes in `resource` by its aggregation label.
async fn wait_aggregated(client: &kube::Client, role: &str, resource: &str) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(client.clone());
    wait_until(
        &format!("{role} to aggregate {resource}"),
        slow(),
        || async {
            let rules = roles.get(role).await?.rules.unwrap_or_default();
            let found = rules.iter().any(|r| {
                r.resources.iter().flatten().any(|x| x == resource)
                    && r.api_groups
                        .iter()
                        .flatten()
                        .any(|g| g == "tekton-mutex.dev")
            });
            Ok(found.then_some(()))
        },
    )
    .await
}
