//! The controller's connection to the API server: kube's client, assembled as kube's own
//! `Client::try_from(Config)` assembles it, with one change: its connection pool lets idle
//! connections go.
//!
//! kube builds its hyper pool without a timer, and with no timer hyper never closes an idle
//! connection. A burst (a thousand arrivals, each with Events published in the background) opens
//! hundreds of connections at once, and every one of them then stayed open for the life of the
//! process, with its TLS state and buffers in the controller and a connection in the API server
//! (at 1,000 keys: 411 connections, a third of the controller's heap once the burst was over).

use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use kube::{Client, Config};
use std::time::Duration;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A connection idle this long is closed (client-go's transport keeps one 90 s).
const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Idle connections kept at most: the controller's steady state needs a handful.
const MAX_IDLE: usize = 16;

/// A client from the kubeconfig or the in-cluster config, as `kube::Client::try_default`.
pub async fn connect() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    pooled_client(config, IDLE_TIMEOUT, MAX_IDLE)
}

/// kube's client stack (base URI, retries, credentials, extra headers, timeouts) over a pool
/// that closes idle connections.
fn pooled_client(
    config: Config,
    idle_timeout: Duration,
    max_idle: usize,
) -> Result<Client, kube::Error> {
    let mut connector = hyper_timeout::TimeoutConnector::new(config.rustls_https_connector()?);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = HttpClient::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .pool_idle_timeout(idle_timeout)
        .pool_max_idle_per_host(max_idle)
        .build(connector);
    let retry = config
        .default_retry
        .then(|| RetryLayer::new(RetryPolicy::server_retry()));
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(retry)
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Barrier;

    /// Counts of a plain-HTTP server that answers `{}` once `burst` requests are in flight
    /// (so each came on its own connection).
    #[derive(Default)]
    struct Counts {
        opened: AtomicUsize,
        closed: AtomicUsize,
    }

    async fn serve(listener: TcpListener, burst: usize, counts: Arc<Counts>) {
        let all_in = Arc::new(Barrier::new(burst));
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            counts.opened.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(answer(conn, all_in.clone(), counts.clone()));
        }
    }

    async fn answer(mut conn: TcpStream, all_in: Arc<Barrier>, counts: Arc<Counts>) {
        let mut buf = vec![0u8; 4096];
        let mut first = true;
        // One request per read is enough for a GET with no body.
        while let Ok(n) = conn.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if std::mem::take(&mut first) {
                all_in.wait().await;
            }
            let reply =
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
            if conn.write_all(reply.as_bytes()).await.is_err() {
                break;
            }
        }
        counts.closed.fetch_add(1, Ordering::SeqCst);
    }

    async fn wait_closed(counts: &Counts, n: usize) -> usize {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while counts.closed.load(Ordering::SeqCst) < n && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await; // poll interval of a bounded wait
        }
        counts.closed.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_burst_leaves_at_most_max_idle_connections_and_those_close_when_idle() {
        let burst = 12;
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let counts = Arc::new(Counts::default());
        tokio::spawn(serve(listener, burst, counts.clone()));
        let config = Config::new(url.parse().unwrap());
        let client = pooled_client(config, Duration::from_millis(300), 3).unwrap();

        let requests = (0..burst).map(|_| {
            let client = client.clone();
            async move {
                let req = http::Request::get("/version").body(Vec::new()).unwrap();
                client.request_text(req).await.unwrap()
            }
        });
        futures::future::join_all(requests).await;
        assert_eq!(counts.opened.load(Ordering::SeqCst), burst);
        assert_eq!(
            wait_closed(&counts, burst - 3).await,
            burst - 3,
            "beyond max idle, closed"
        );
        assert_eq!(
            wait_closed(&counts, burst).await,
            burst,
            "the idle ones close after the timeout"
        );
    }
}
