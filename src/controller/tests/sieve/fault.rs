//! The fault layer: the `tower::Service` a controller incarnation's kube
//! `Client` sends through. It reads each request, attributes each write to the
//! call site that announced it (`Metrics::api_write`, see [`write_points`]),
//! hands it to the fake API server, and records it. With `crash_after: n`, the
//! n-th write reaches the server (and lands, unless the server refuses it) and
//! then the process is dead: every later request of this incarnation fails at
//! once, as if the process had gone, and nothing more of it reaches the server.
//!
//! [`write_points`]: super::write_points

use super::api_server::{ApiServer, Call};
use super::write_points::{self, WritePoint};
use crate::metrics::write_sites;
use http::{Request, Response};
use kube::client::Body;
use serde_json::Value;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// The error type kube's client takes from the service under it.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One write as it reached the fault layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    /// Which incarnation of the controller made it (0 for the first process).
    pub incarnation: usize,
    pub point: WritePoint,
    /// What it changes (its write point's variant: the reason it writes, say).
    pub variant: String,
    pub line: String,
    /// The API server's answer; 0 if the process was already dead.
    pub code: u16,
}

impl Write {
    pub fn landed(&self) -> bool {
        (200..300).contains(&self.code)
    }

    /// Did it reach the API server (taken or refused)? Not if the process was dead.
    pub fn sent(&self) -> bool {
        self.code != 0
    }
}

/// One incarnation's connection to the API server.
pub struct Line {
    server: Arc<ApiServer>,
    incarnation: usize,
    crash_after: Option<usize>,
    state: Mutex<LineState>,
}

#[derive(Default)]
struct LineState {
    writes: Vec<Write>,
    dead: bool,
}

impl Line {
    pub fn new(
        server: Arc<ApiServer>,
        incarnation: usize,
        crash_after: Option<usize>,
    ) -> Arc<Line> {
        Arc::new(Line {
            server,
            incarnation,
            crash_after,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LineState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Has the process died (its n-th write landed)?
    pub fn dead(&self) -> bool {
        self.state().dead
    }

    pub fn writes(&self) -> Vec<Write> {
        self.state().writes.clone()
    }

    /// Writes that changed something (the API server took them).
    pub fn landed_count(&self) -> usize {
        self.state().writes.iter().filter(|w| w.landed()).count()
    }

    fn exchange(
        &self,
        call: Call,
        announced: Option<write_sites::Announced>,
    ) -> Result<Response<Body>, BoxError> {
        let point = self.point_of(&call, announced)?;
        let mut st = self.state();
        let was_dead = st.dead;
        let answer = (!was_dead).then(|| self.server.serve(&call));
        if let Some(point) = point {
            st.writes.push(Write {
                incarnation: self.incarnation,
                point,
                variant: write_points::variant(&call),
                line: call.line(),
                code: answer.as_ref().map_or(0, |(code, _)| *code),
            });
            let sent = st.writes.iter().filter(|w| w.sent()).count();
            st.dead |= self.crash_after == Some(sent);
        }
        match answer {
            Some((code, body)) => Ok(response(code, &body)),
            None => Err("the controller process is dead (crashed by the fault plan)".into()),
        }
    }

    /// The write point of a write (None for a read); an error if no call announced it.
    fn point_of(
        &self,
        call: &Call,
        announced: Option<write_sites::Announced>,
    ) -> Result<Option<WritePoint>, BoxError> {
        match (call.is_write(), announced) {
            (false, _) => Ok(None),
            (true, Some(a)) => write_points::attribute(&a, call)
                .map(Some)
                .map_err(|why| self.refuse(why)),
            (true, None) => Err(self.refuse(format!(
                "{}: a write no Metrics::api_write announced",
                call.line()
            ))),
        }
    }

    fn refuse(&self, why: String) -> BoxError {
        self.server.refuse(why.clone());
        why.into()
    }
}

fn response(code: u16, body: &Value) -> Response<Body> {
    let bytes = serde_json::to_vec(body).expect("a JSON value serializes");
    Response::builder()
        .status(code)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(bytes))
        .expect("a response of a status and a body")
}

/// The service behind `kube::Client::new`.
#[derive(Clone)]
pub struct Wire(pub Arc<Line>);

impl tower_service::Service<Request<Body>> for Wire {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // Taken here, not in the future: calls arrive in the order the writes were
        // announced (each task announces and sends in one poll; the client's
        // buffer is first in, first out).
        let announced = (req.method() != http::Method::GET)
            .then(write_sites::take_oldest)
            .flatten();
        let line = self.0.clone();
        Box::pin(async move {
            let call = read_call(req).await?;
            line.exchange(call, announced)
        })
    }
}

async fn read_call(req: Request<Body>) -> Result<Call, BoxError> {
    let (parts, body) = req.into_parts();
    let bytes = body.collect_bytes().await?;
    let header = |h: http::header::HeaderName| {
        parts
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let query = parts
        .uri
        .query()
        .map(form_urlencoded_pairs)
        .unwrap_or_default();
    Ok(Call {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        query,
        accept: header(http::header::ACCEPT),
        content_type: header(http::header::CONTENT_TYPE),
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    })
}

/// `a=b&c=d`, percent-decoded.
fn form_urlencoded_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.replace('+', " ").into_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
