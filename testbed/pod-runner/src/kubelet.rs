//! The kubelet's log endpoint, so that `kubectl logs` and `tkn ... logs` work: the API server
//! proxies `pods/log` to `https://<node InternalIP>:<kubeletEndpoint port>/containerLogs/...`.
//!
//! Served on loopback with TLS (hyper + rustls); only clients with a certificate from the
//! cluster's CA (the API server's kubelet client certificate) get through the handshake.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig, crypto};
use tracing::{debug, warn};

use crate::logs::{LogOptions, LogTail, render, tail};

/// How often a follower looks for new output (a file tail, as the kubelet's own fallback).
const FOLLOW_POLL: Duration = Duration::from_millis(100);

type Body = BoxBody<Bytes, Infallible>;

/// TLS settings: our serving certificate and the CA that signs the API server's client cert.
pub fn tls_config(cert: &Path, key: &Path, client_ca: &Path) -> Result<Arc<ServerConfig>> {
    let provider = Arc::new(crypto::ring::default_provider());
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading {}", cert.display()))?;
    let key =
        PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(client_ca)
        .with_context(|| format!("reading {}", client_ca.display()))?
    {
        roots.add(ca?)?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .context("client certificate verifier")?;
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .context("serving certificate")?;
    Ok(Arc::new(config))
}

/// Serves until the process ends. `work_dir` holds `<namespace>/<pod>/<container>.log`.
pub async fn serve(listener: TcpListener, tls: Arc<ServerConfig>, work_dir: PathBuf) {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                warn!("kubelet endpoint: accept failed: {e}");
                continue;
            }
        };
        let (acceptor, work_dir) = (acceptor.clone(), work_dir.clone());
        tokio::spawn(async move {
            let stream = match acceptor.accept(tcp).await {
                Ok(s) => s,
                Err(e) => return debug!("kubelet endpoint: TLS handshake with {peer}: {e}"),
            };
            let service = service_fn(move |req| {
                let work_dir = work_dir.clone();
                async move { Ok::<_, Infallible>(handle(&work_dir, req)) }
            });
            if let Err(e) = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!("kubelet endpoint: connection with {peer}: {e}");
            }
        });
    }
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed());
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert("content-type", "text/plain".parse().expect("static header"));
    resp
}

/// A namespace, pod or container name as Kubernetes allows them: nothing that walks paths.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('.')
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

fn handle(work_dir: &Path, req: Request<Incoming>) -> Response<Body> {
    if req.method() != Method::GET {
        return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
    }
    let path = req.uri().path();
    if path == "/healthz" {
        return text(StatusCode::OK, "ok");
    }
    let parts: Vec<&str> = match path.strip_prefix("/containerLogs/") {
        Some(rest) => rest.split('/').collect(),
        None => {
            return text(
                StatusCode::NOT_FOUND,
                "the pod-runner serves only containerLogs\n",
            );
        }
    };
    let [ns, pod, container] = parts[..] else {
        return text(
            StatusCode::NOT_FOUND,
            "expected /containerLogs/{namespace}/{pod}/{container}\n",
        );
    };
    if ![ns, pod, container].into_iter().all(valid_name) {
        return text(
            StatusCode::BAD_REQUEST,
            "invalid namespace, pod or container name\n",
        );
    }
    let opts = match LogOptions::from_query(req.uri().query().unwrap_or("")) {
        Ok(o) => o,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    container_logs(&work_dir.join(ns).join(pod), pod, container, opts)
}

fn container_logs(pod_dir: &Path, pod: &str, container: &str, opts: LogOptions) -> Response<Body> {
    if !pod_dir.is_dir() {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod:?} has not run on this node\n"),
        );
    }
    let mut log = LogTail::new(pod_dir, container);
    // Ended is checked before reading: the marker is written after the last output.
    let ended = log.ended();
    if !log.started() && !ended && !opts.follow {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "container {container:?} in pod {pod:?} is waiting to start: PodInitializing\n"
            ),
        );
    }
    let first = match log.read_lines(ended) {
        Ok(lines) => render(&tail(lines, opts.tail_lines), &opts),
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("reading the log: {e}\n"),
            );
        }
    };
    let mut limit = Limit(opts.limit_bytes);
    if !opts.follow || ended {
        return text(StatusCode::OK, limit.take(first));
    }
    // Follow: the lines so far, then each new batch, until the container has ended and
    // everything is sent (or the client goes away, which drops this stream).
    let first = limit.take(first);
    let rest = futures::stream::unfold(
        (log, opts, limit, false),
        |(mut log, opts, mut limit, done)| async move {
            loop {
                if done || limit.exhausted() {
                    return None;
                }
                let ended = log.ended();
                let lines = log.read_lines(ended).unwrap_or_default();
                if !lines.is_empty() {
                    let chunk = limit.take(render(&lines, &opts));
                    return Some((chunk, (log, opts, limit, ended)));
                }
                if ended {
                    return None;
                }
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        },
    );
    let chunks = futures::stream::once(async { first })
        .chain(rest)
        .filter(|c| futures::future::ready(!c.is_empty()))
        .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c))));
    let mut resp = Response::new(BodyExt::boxed(StreamBody::new(chunks)));
    resp.headers_mut()
        .insert("content-type", "text/plain".parse().expect("static header"));
    resp
}

/// What is left of `limitBytes`.
struct Limit(Option<u64>);

impl Limit {
    fn take(&mut self, mut chunk: Vec<u8>) -> Vec<u8> {
        if let Some(left) = self.0.as_mut() {
            chunk.truncate(usize::try_from(*left).unwrap_or(usize::MAX));
            *left -= chunk.len() as u64;
        }
        chunk
    }

    fn exhausted(&self) -> bool {
        self.0 == Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_walk_paths_are_refused() {
        assert!(valid_name("step-deploy"));
        assert!(valid_name("run-1.x"));
        for bad in ["", "..", ".hidden", "a/b", "a b"] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn limit_bytes_truncates_and_then_stops() {
        let mut limit = Limit(Some(5));
        assert_eq!(limit.take(b"abc".to_vec()), b"abc");
        assert_eq!(limit.take(b"defg".to_vec()), b"de");
        assert!(limit.exhausted());
        let mut none = Limit(None);
        assert_eq!(none.take(b"abc".to_vec()), b"abc");
        assert!(!none.exhausted());
    }
}
