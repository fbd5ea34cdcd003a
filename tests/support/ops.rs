//! Helpers for the operations tests: a ServiceAccount's kubeconfig, the
//! controller's HTTP endpoints, and Prometheus samples.

use super::controller::ControllerProcess;
use super::{kubectl, repo_root, secs, wait_until};
use anyhow::{Context, Result, bail};

/// A kubeconfig for ServiceAccount `namespace/name`, with a token from the TokenRequest API.
pub fn service_account_kubeconfig(namespace: &str, name: &str) -> Result<std::path::PathBuf> {
    let token = kubectl(&["-n", namespace, "create", "token", name, "--duration=1h"])?;
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
    let cluster = if ca.trim().is_empty() {
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
    let path = dir.join(format!(
        "sa-kubeconfig-{namespace}-{name}-{}",
        std::process::id()
    ));
    std::fs::write(&path, yaml)?;
    Ok(path)
}

/// A response from the controller's HTTP server.
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// GET a path from the controller's HTTP server (HTTP/1.1, connection closed by the server).
pub fn http_get(addr: &str, path: &str) -> Result<Response> {
    use std::io::{Read, Write};
    let mut conn =
        std::net::TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(secs(10)))?;
    conn.write_all(format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    conn.read_to_string(&mut out)?;
    let status = out
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("not an HTTP response: {out:?}"))?;
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    Ok(Response {
        status,
        body: body.to_string(),
    })
}

/// Where the controller serves, from its log line (it is started with `--http-addr 127.0.0.1:0`).
pub async fn http_addr(c: &ControllerProcess) -> Result<String> {
    wait_until(
        "the controller to say where it serves",
        secs(30),
        || async {
            Ok(c.log_text()
                .lines()
                .find(|l| l.contains("serving /healthz"))
                .and_then(|l| l.split("addr=").nth(1))
                .map(|a| a.split_whitespace().next().unwrap_or_default().to_string()))
        },
    )
    .await
}

/// The value of one sample, e.g. `sample(text, "tekton_mutex_grants_total", &[("namespace", ns)])`.
/// None when the series is absent.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Result<Option<f64>> {
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = match line.rsplit_once(' ') {
            Some(x) => x,
            None => continue,
        };
        let (metric, label_text) = match series.split_once('{') {
            Some((m, rest)) => (m, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if metric != name {
            continue;
        }
        let matches = labels
            .iter()
            .all(|(k, v)| label_text.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        if matches {
            return match value.parse() {
                Ok(v) => Ok(Some(v)),
                Err(_) => bail!("sample {line:?} has no number"),
            };
        }
    }
    Ok(None)
}
