//! config/ is what platform teams apply. The API server must accept every
//! manifest, and the controller must work with exactly the RBAC it grants:
//! cluster-wide (config/) and namespace-scoped (config/namespaced/), each
//! with leader election on, so the Lease rules are exercised too.

mod support;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
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
    // Idle again: the last token goes into the ledger ConfigMap, the finalizer comes off.
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
    ensure!(
        entry.as_deref() == Some("2"),
        "the ledger holds c's token: {entry:?}"
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
    for file in ["crd.yaml", "rbac.yaml", "deployment.yaml"] {
        let yaml = std::fs::read_to_string(repo_root().join("config").join(file))?;
        apply_yaml(&client, None, &yaml)
            .await
            .with_context(|| format!("applying config/{file}"))?;
    }
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
    let crd = std::fs::read_to_string(repo_root().join("config/crd.yaml"))?;
    apply_yaml(&client, None, &crd).await?;
    let ns = TestNamespace::create("rbac-ns").await?;
    // As the README says: the manifests name the namespace `pipelines`; use yours.
    for file in ["rbac.yaml", "deployment.yaml"] {
        let yaml = std::fs::read_to_string(repo_root().join("config/namespaced").join(file))?
            .replace(
                "namespace: pipelines\n",
                &format!("namespace: {}\n", ns.name()),
            );
        ensure!(
            !yaml
                .lines()
                .any(|l| !l.trim_start().starts_with('#') && l.contains("namespace: pipelines")),
            "config/namespaced/{file} names a namespace the README's sed misses"
        );
        apply_yaml(&client, None, &yaml)
            .await
            .with_context(|| format!("applying config/namespaced/{file}"))?;
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
