//! `/healthz`, `/readyz` and `/metrics` over hyper's HTTP/1 server, with
//! timeouts so a slow or idle client cannot hold a connection.

use crate::metrics::Metrics;
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

/// A client must send its request headers within this time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// No connection lives longer than this, whatever the client does.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after a failed accept (e.g. out of file descriptors) instead of spinning.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(200);

/// What the probes report.
#[derive(Default)]
pub struct Health {
    /// Every watch cache has synced (set on the leader and on warm standbys).
    pub ready: AtomicBool,
    /// The controller loops have stopped: the process is on its way out.
    pub stopped: AtomicBool,
}

pub struct State {
    pub health: Health,
    pub metrics: Arc<Metrics>,
}

/// Binds the address and logs where it serves (port 0 picks a free port).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    info!(addr = %listener.local_addr()?, "serving /healthz, /readyz and /metrics");
    Ok(listener)
}

/// Serves until the process ends.
pub async fn serve(listener: TcpListener, state: Arc<State>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                warn!(error = %e, "http accept failed");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        tokio::spawn(serve_connection(stream, state.clone()));
    }
}

async fn serve_connection(stream: tokio::net::TcpStream, state: Arc<State>) {
    let service = service_fn(move |req: Request<Incoming>| {
        let state = state.clone();
        async move { Ok::<_, Infallible>(respond(&state, &req)) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => debug!(error = %e, "http connection failed"),
        Err(_) => debug!("http connection timed out"),
    }
}

fn respond(state: &State, req: &Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n".into());
    }
    let health = &state.health;
    match req.uri().path() {
        "/healthz" if health.stopped.load(Ordering::Relaxed) => {
            text(StatusCode::SERVICE_UNAVAILABLE, "stopped\n".into())
        }
        "/healthz" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" if health.ready.load(Ordering::Relaxed) => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced yet\n".into(),
        ),
        "/metrics" => {
            let mut r = text(StatusCode::OK, state.metrics.render());
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
