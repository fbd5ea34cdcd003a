//! config/ is what platform teams apply. The API server must accept every
//! manifest, and the controller must work with exactly the RBAC it grants.

mod support;

use anyhow::{Context, Result, ensure};
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::*;

/// A kubeconfig for the tekton-mutex ServiceAccount, using a token from the TokenRequest API.
fn service_account_kubeconfig() -> Result<std::path::PathBuf> {
    let token = kubectl(&[
        "-n",
        "tekton-mutex",
        "create",
        "token",
        "tekton-mutex",
        "--duration=1h",
    ])?;
    let server = kubectl(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ])?;
    let ca = kubectl(&[
        "config",
        "view",
        "--minify",
        "--raw",
        "-o",
        "jsonpath={.clusters[0].cluster.certificate-authority-data}",
    ])?;
    let insecure = ca.trim().is_empty();
    let cluster = if insecure {
        format!(
            "server: {}\n    insecure-skip-tls-verify: true",
            server.trim()
        )
    } else {
        format!(
            "server: {}\n    certificate-authority-data: {}",
            server.trim(),
            ca.trim()
        )
    };
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    {cluster}\nusers:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: sa\n  context: {{cluster: local, user: sa}}\ncurrent-context: sa\n",
        token.trim()
    );
    let dir = repo_root().join("target/test-logs");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("sa-kubeconfig-{}", std::process::id()));
    std::fs::write(&path, yaml)?;
    Ok(path)
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
    let kubeconfig = service_account_kubeconfig()?;
    let c = ControllerProcess::start_with_env(
        ns.name(),
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )
    .await?;

    // Exercise every kind of write: create the Mutex, write its status, patch run
    // statuses, cancel a superseded PipelineRun and record an Event.
    ns.apply(&pipeline("promote", &Opts::default())).await?;
    ns.apply(&pipeline_run("a", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    ns.apply(&pipeline_run("c", "promote", &[])).await?;
    wait_superseded(&ns, &lock_run("b")).await?;
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
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("c"), "Acquired", slow()).await?;
    Ok(())
}

/// GET a path from the controller's http server.
fn http_get(addr: &str, path: &str) -> Result<String> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr)?;
    conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    conn.read_to_string(&mut out)?;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn health_and_metrics_are_served() -> Result<()> {
    let ns = TestNamespace::create("metrics").await?;
    let c = ControllerProcess::start_with(ns.name(), &["--http-addr", "127.0.0.1:0"], &[]).await?;
    let addr = wait_until(
        "the controller to say where it serves",
        secs(30),
        || async {
            let log = c.log_text();
            let addr = log
                .lines()
                .find(|l| l.contains("serving /healthz"))
                .and_then(|l| l.split("addr=").nth(1))
                .map(|a| a.split_whitespace().next().unwrap_or_default().to_string());
            Ok(addr)
        },
    )
    .await?;
    ensure!(
        http_get(&addr, "/healthz")?.starts_with("HTTP/1.1 200"),
        "healthz"
    );
    wait_until("readyz", secs(30), || async {
        Ok(http_get(&addr, "/readyz")?
            .starts_with("HTTP/1.1 200")
            .then_some(()))
    })
    .await?;
    ns.apply(&pipeline("promote", &Opts::default())).await?;
    ns.apply(&pipeline_run("a", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    let metrics = http_get(&addr, "/metrics")?;
    ensure!(
        metrics.contains("\ntekton_mutex_grants_total 1\n"),
        "one grant counted:\n{metrics}"
    );
    release(&ns, "a").await?;
    Ok(())
}
