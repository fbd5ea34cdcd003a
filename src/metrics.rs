//! Health and Prometheus metrics over a deliberately tiny HTTP/1.1 server:
//! three GET routes do not justify a web framework in a lock controller.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing::{info, warn};

#[derive(Default)]
pub struct Metrics {
    pub grants: AtomicU64,
    pub superseded: AtomicU64,
    pub pipeline_runs_cancelled: AtomicU64,
    pub timed_out: AtomicU64,
    pub invalid: AtomicU64,
    pub reconcile_errors: AtomicU64,
    /// Set once the controller's watches are running.
    pub ready: AtomicBool,
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        let counters: [(&str, &str, &AtomicU64); 6] = [
            (
                "tekton_mutex_grants_total",
                "Slots granted (fencing tokens handed out).",
                &self.grants,
            ),
            (
                "tekton_mutex_superseded_total",
                "Runs marked Superseded.",
                &self.superseded,
            ),
            (
                "tekton_mutex_pipelineruns_cancelled_total",
                "Superseded PipelineRuns cancelled.",
                &self.pipeline_runs_cancelled,
            ),
            (
                "tekton_mutex_timed_out_total",
                "Runs that timed out waiting.",
                &self.timed_out,
            ),
            (
                "tekton_mutex_invalid_runs_total",
                "Runs failed as InvalidParams.",
                &self.invalid,
            ),
            (
                "tekton_mutex_reconcile_errors_total",
                "Reconciles that failed and were retried.",
                &self.reconcile_errors,
            ),
        ];
        let mut out = String::new();
        for (name, help, v) in counters {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                v.load(Ordering::Relaxed)
            ));
        }
        out
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics` until the process ends.
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]);
            let path = request.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match path {
                "/healthz" => ("200 OK", "ok\n".to_string()),
                "/readyz" if metrics.ready.load(Ordering::Relaxed) => {
                    ("200 OK", "ok\n".to_string())
                }
                "/readyz" => ("503 Service Unavailable", "starting\n".to_string()),
                "/metrics" => ("200 OK", metrics.render()),
                _ => ("404 Not Found", "not found\n".to_string()),
            };
            let response = format!(
                "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            if let Err(e) = conn.write_all(response.as_bytes()).await {
                warn!(error = %e, "http response failed");
            }
        });
    }
}

/// Binds the address and logs where it serves (port 0 picks a free port).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_counter_in_prometheus_text_format() {
        let m = Metrics::default();
        Metrics::inc(&m.grants);
        Metrics::inc(&m.grants);
        let text = m.render();
        assert!(
            text.contains(
                "# TYPE tekton_mutex_grants_total counter\ntekton_mutex_grants_total 2\n"
            ),
            "{text}"
        );
        assert_eq!(text.matches("# TYPE").count(), 6);
    }
}
