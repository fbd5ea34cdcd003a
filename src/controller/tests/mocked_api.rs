//! The reconcilers' own control flow against a mocked API server (as kube-rs's
//! controller-rs does with `tower-test`): which requests, in which order, and
//! what happens on 404 and 409 answers. This pins our code, not Kubernetes: the
//! live-cluster tests under tests/ stay the evidence of how the API server and
//! Tekton behave.

use crate::controller::apply::events;
use crate::controller::cache::index::{Index, Indexed};
use crate::controller::cache::triggers::run_tags;
use crate::controller::context::{Context, Error};
use crate::controller::reconcile::{finalizer, token_floor};
use crate::controller::reconcile::{intake, lock as sync};
use crate::controller::wiring::{error_policy, intake_when_acting};
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::{Mutex, TOKEN_BLOCK};
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::pipelinerun::PipelineRun;
use ::http::{Request, Response};
use kube::Client;
use kube::Resource;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tower_test::mock;

const NS: &str = "ns";
const MUTEXES: &str = "/apis/tekton-mutex.dev/v1alpha1/namespaces/ns/mutexes";
const CUSTOM_RUNS: &str = "/apis/tekton.dev/v1beta1/namespaces/ns/customruns";
const PIPELINE_RUNS: &str = "/apis/tekton.dev/v1/namespaces/ns/pipelineruns";
const CLUSTER_MUTEXES: &str = "/apis/tekton-mutex.dev/v1alpha1/clustermutexes";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/ns/events";
const LEDGER: &str = "/api/v1/namespaces/ns/configmaps";

/// A token far above the clock's floor (the year 2286 in milliseconds), so that a ledger entry
/// or a `lastToken` of the tests, and not the clock, decides the next token.
fn far(n: i64) -> i64 {
    10_000_000_000_000 + n
}

/// The clock's floor for tokens now: a token granted after this call is at least this.
fn clock_now() -> i64 {
    crate::model::mutex::clock_floor(jiff::Timestamp::now())
}

/// One request the controller made: "METHOD /path", and its JSON body (Null if none).
type Seen = (String, Value);

/// A Context whose caches hold exactly these objects, over a mocked API server.
fn context(
    custom_runs: Vec<CustomRun>,
    pipeline_runs: Vec<PipelineRun>,
    mutexes: Vec<Mutex>,
) -> (Arc<Context>, mock::Handle<Request<Body>, Response<Body>>) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, NS);
    let (runs, prs) = (indexed_of(custom_runs), store_of(pipeline_runs));
    let ctx = Context::over(client, runs, prs, store_of(mutexes), "kube-system");
    (Arc::new(ctx), handle)
}

/// A cache indexed as the controller indexes the runs.
fn indexed_of(objects: Vec<CustomRun>) -> Indexed<CustomRun> {
    let mut writer = Writer::default();
    let index = Index::new(run_tags::<CustomRun>);
    for o in objects {
        index.apply(&mut writer, &watcher::Event::Apply(o));
    }
    Indexed {
        store: writer.as_reader(),
        index,
    }
}

fn store_of<K>(objects: Vec<K>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut writer = Writer::<K>::default();
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(o));
    }
    writer.as_reader()
}

/// Answers every request with `respond` and records it, until the client is dropped.
async fn serve(
    mut handle: mock::Handle<Request<Body>, Response<Body>>,
    mut respond: impl FnMut(&str, &Value) -> (u16, Value),
) -> Vec<Seen> {
    let mut seen = Vec::new();
    while let Some((req, send)) = handle.next_request().await {
        let line = format!("{} {}", req.method(), req.uri().path());
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let (code, answer) = respond(&line, &body);
        let response = Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(&answer).unwrap()))
            .unwrap();
        send.send_response(response);
        seen.push((line, body));
    }
    seen
}

/// Run `reconcile` against the mock and return its result and every request it made.
async fn exchange<F, Fut>(
    ctx: Arc<Context>,
    handle: mock::Handle<Request<Body>, Response<Body>>,
    respond: impl FnMut(&str, &Value) -> (u16, Value) + Send + 'static,
    reconcile: F,
) -> (Result<Action, Error>, Vec<Seen>)
where
    F: FnOnce(Arc<Context>) -> Fut,
    Fut: std::future::Future<Output = Result<Action, Error>>,
{
    let server = tokio::spawn(serve(handle, respond));
    let result = Box::pin(reconcile(ctx)).await;
    // The context held the last clients: the mock sees the end of the stream.
    let seen = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the client was dropped")
        .unwrap();
    (result, seen)
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "reason": reason, "code": code, "message": format!("mocked {code}")})
}

/// A success answer the client can parse: the object as written, or for a
/// patch (which carries only some fields) a minimal object of the kind.
fn ok(line: &str, body: &Value) -> (u16, Value) {
    let minimal = |api_version: &str, kind: &str| json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}, "spec": {}});
    match line {
        l if l.starts_with(&format!("PATCH {CUSTOM_RUNS}")) => {
            (200, minimal("tekton.dev/v1beta1", "CustomRun"))
        }
        l if l.starts_with(&format!("PATCH {PIPELINE_RUNS}")) => {
            (200, minimal("tekton.dev/v1", "PipelineRun"))
        }
        l if l.starts_with(&format!("PATCH {MUTEXES}")) => {
            let mut m = mutex("2", json!({}));
            m["metadata"]["finalizers"] = body["metadata"]["finalizers"].clone();
            (200, m)
        }
        l if l.starts_with(&format!("PATCH {CLUSTER_MUTEXES}")) => (
            200,
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
                   "metadata": {"name": "prod", "resourceVersion": "2",
                                "finalizers": body["metadata"]["finalizers"].clone()},
                   "spec": {"namespaces": [NS]}}),
        ),
        // No token ledger yet: a grant creates it (token_floor.rs).
        l if l.starts_with("GET ")
            && l.ends_with(&format!("/configmaps/{}", token_floor::LEDGER)) =>
        {
            (404, status(404, "NotFound"))
        }
        l if l.starts_with("POST") => (201, body.clone()),
        _ => (200, body.clone()),
    }
}

/// The requests in order, without the transition Events: those are recorded in
/// the background, best effort, so their place in the sequence is not ours to pin.
fn lines(seen: &[Seen]) -> Vec<&str> {
    seen.iter()
        .filter(|(l, body)| !(l.ends_with("/events") && body["reason"] != "Superseded"))
        .map(|(l, _)| l.as_str())
        .collect()
}

/// The requests but the token ledger's: a grant writes the ledger before the lock state
/// (lock.rs), which the tests of something else leave aside.
fn not_ledger(seen: &[Seen]) -> Vec<Seen> {
    let ledger = format!("/configmaps/{}", token_floor::LEDGER);
    seen.iter()
        .filter(|(l, _)| !l.ends_with(&ledger) && !l.ends_with("/configmaps"))
        .cloned()
        .collect()
}

/// A grant's ledger write when there is no ledger yet: read it, then create it.
fn ledger_created(ledger_path: &str) -> [String; 2] {
    let dir = ledger_path.rsplit_once('/').map_or("", |(d, _)| d);
    [format!("GET {ledger_path}"), format!("POST {dir}")]
}

/// A grant's ledger write onto an existing ledger: read it, then replace it.
fn ledger_raised(ledger_path: &str) -> [String; 2] {
    [format!("GET {ledger_path}"), format!("PUT {ledger_path}")]
}

fn pipeline_run(name: &str, created: &str) -> PipelineRun {
    serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "namespace": NS, "uid": format!("{name}-uid"),
                     "creationTimestamp": created, "resourceVersion": "1",
                     "labels": {"tekton.dev/pipeline": "promote"}},
        "spec": {},
        "status": {"childReferences": [{"kind": "CustomRun", "name": format!("{name}-lock")}]},
    }))
    .unwrap()
}

/// The lock run of PipelineRun `pr`, for key `k`.
fn lock_run(pr: &str, supersede: &str, status: Value) -> CustomRun {
    serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
        "metadata": {"name": format!("{pr}-lock"), "namespace": NS, "uid": format!("{pr}-lock-uid"),
                     "creationTimestamp": "2026-11-30T12:00:00Z", "resourceVersion": "5",
                     "ownerReferences": [{"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
                                          "name": pr, "uid": format!("{pr}-uid"), "controller": true}]},
        "spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
                 "params": [{"name": "key", "value": "k"}, {"name": "supersede", "value": supersede}],
                 "timeout": "0s"},
        "status": status,
    }))
    .unwrap()
}

/// Mutex `k`, protected by the finalizer as any Mutex that was ever used.
fn mutex(resource_version: &str, status: Value) -> Value {
    json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
           "metadata": {"name": "k", "namespace": NS, "resourceVersion": resource_version,
                        "uid": LOCK_UID, "finalizers": [finalizer::LOCK_STATE_FINALIZER]},
           "spec": {"capacity": 1}, "status": ledger_read(status)})
}

/// The uid of lock `k`, of either kind.
const LOCK_UID: &str = "k-uid";

/// A lock status that took in the token ledger's floor for lock `k` (as any status the
/// controller wrote for it): the sync reads the ledger only for a new or restored one.
fn ledger_read(mut status: Value) -> Value {
    if let Some(fields) = status.as_object_mut() {
        fields
            .entry("ledgerReadFor")
            .or_insert_with(|| json!(LOCK_UID));
    }
    status
}

fn the_mutex() -> Arc<Mutex> {
    cached(mutex("1", json!({})))
}

/// The Mutex as the sync's cache hands it to the reconcile.
fn cached(m: Value) -> Arc<Mutex> {
    Arc::new(serde_json::from_value(m).unwrap())
}

fn reason(patch: &Value) -> &str {
    patch["status"]["conditions"][0]["reason"].as_str().unwrap()
}

/// The lock kind a test of the engine runs against: one engine serves both,
/// and these tests keep it that way. Lock `k` either way.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Mutex,
    Cluster,
}

impl Kind {
    /// The API path of the lock objects.
    fn locks(self) -> &'static str {
        match self {
            Kind::Mutex => MUTEXES,
            Kind::Cluster => CLUSTER_MUTEXES,
        }
    }

    /// A name of namespace NS (run, PipelineRun or group) as the lock's status writes it.
    fn name(self, n: &str) -> String {
        match self {
            Kind::Mutex => n.into(),
            Kind::Cluster => format!("{NS}/{n}"),
        }
    }

    /// Lock `k`, protected by the finalizer as any lock that was ever used.
    fn lock(self, resource_version: &str, status: Value) -> Value {
        match self {
            Kind::Mutex => mutex(resource_version, status),
            Kind::Cluster => {
                json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
                "metadata": {"name": "k", "resourceVersion": resource_version, "uid": LOCK_UID,
                             "finalizers": [finalizer::LOCK_STATE_FINALIZER]},
                "spec": {"capacity": 1, "namespaces": [NS]}, "status": ledger_read(status)})
            }
        }
    }

    /// The lock run of PipelineRun `pr`, pointed at lock `k` of this kind.
    fn lock_run(self, pr: &str, supersede: &str, status: Value) -> CustomRun {
        let mut r = serde_json::to_value(lock_run(pr, supersede, status)).unwrap();
        if let Kind::Cluster = self {
            r["spec"]["customRef"] = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": "k"});
            r["spec"]["params"] = json!([{"name": "supersede", "value": supersede}]);
        }
        serde_json::from_value(r).unwrap()
    }

    /// Where the token ledger of this kind lives, and lock k's entry in it.
    fn ledger(self) -> (String, String) {
        match self {
            Kind::Mutex => (
                format!("{LEDGER}/{}", token_floor::LEDGER),
                "mutex.k".into(),
            ),
            Kind::Cluster => (
                format!(
                    "/api/v1/namespaces/kube-system/configmaps/{}",
                    token_floor::LEDGER
                ),
                "clustermutex.k".into(),
            ),
        }
    }

    /// The sync of lock `lock` (as the cache hands it over).
    async fn reconcile(self, lock: Value, ctx: Arc<Context>) -> Result<Action, Error> {
        match self {
            Kind::Mutex => sync::reconcile(cached(lock), ctx).await,
            Kind::Cluster => {
                let cm: ClusterMutex = serde_json::from_value(lock).unwrap();
                sync::reconcile(Arc::new(cm), ctx).await
            }
        }
    }
}

/// The engine's tests that hold for both kinds, once for each.
macro_rules! for_both_kinds {
    ($($name:ident => $body:expr;)*) => {
        mod mutex {
            use super::*;
            $( #[tokio::test] async fn $name() { ($body)(Kind::Mutex).await } )*
        }
        mod cluster_mutex {
            use super::*;
            $( #[tokio::test] async fn $name() { ($body)(Kind::Cluster).await } )*
        }
    };
}

for_both_kinds! {
    a_conflict_on_the_cached_lock_is_decided_again_from_a_fresh_read => conflict_case;
    writes_go_lock_state_then_grants_then_cancels_then_runs => write_order_case;
    refused_writes_are_reported_and_the_others_still_happen => refused_writes_case;
    an_idle_lock_records_its_last_token_then_loses_its_finalizer => idle_case;
    a_new_lock_hands_out_tokens_above_the_ledger => above_the_ledger_case;
    an_unreadable_ledger_makes_the_lock_not_ready_and_grants_nothing => unreadable_ledger_case;
}

async fn conflict_case(kind: Kind) {
    let before = clock_now();
    let (ctx, handle) = context(
        vec![kind.lock_run("a", "pending", json!({}))],
        vec![pipeline_run("a", "2026-11-30T11:59:00Z")],
        vec![],
    );
    let locks = kind.locks();
    let mut puts = 0;
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {locks}/k") => (200, kind.lock(&(puts + 1).to_string(), json!({}))),
        l if l == format!("PUT {locks}/k/status") => {
            puts += 1;
            // The first write finds the object changed; the second one succeeds.
            match puts {
                1 => (409, status(409, "Conflict")),
                _ => ok(line, body),
            }
        }
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        kind.reconcile(kind.lock("1", json!({})), ctx)
    })
    .await;
    assert!(result.is_ok(), "{result:?}");
    let seen = not_ledger(&seen);
    assert_eq!(
        lines(&seen),
        [
            format!("PUT {locks}/k/status"),
            format!("GET {locks}/k"),
            format!("PUT {locks}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
        ],
        "the cached lock first, the API server's after a conflict"
    );
    assert_eq!(seen[0].1["metadata"]["resourceVersion"], "1");
    let (_, retried) = &seen[2];
    assert_eq!(
        retried["metadata"]["resourceVersion"], "2",
        "the retry is a CAS on the fresh read"
    );
    let token = &retried["status"]["holders"][0]["token"];
    assert!(
        token.as_i64() >= Some(before),
        "a token from the clock: {token}"
    );
    assert_eq!(reason(&seen[3].1), "Acquired");
}

#[tokio::test]
async fn run_patches_answered_404_or_409_are_left_to_the_next_sync() {
    let (ctx, handle) = context(
        vec![
            lock_run("a", "none", json!({})),
            lock_run("b", "none", json!({})),
        ],
        vec![
            pipeline_run("a", "2026-11-30T11:59:00Z"),
            pipeline_run("b", "2026-11-30T11:59:30Z"),
        ],
        vec![],
    );
    let respond = |line: &str, body: &Value| match line {
        l if l == format!("GET {MUTEXES}/k") => (200, mutex("1", json!({}))),
        l if l == format!("PATCH {CUSTOM_RUNS}/a-lock/status") => (404, status(404, "NotFound")),
        l if l == format!("PATCH {CUSTOM_RUNS}/b-lock/status") => (409, status(409, "Conflict")),
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        sync::reconcile(the_mutex(), ctx)
    })
    .await;
    assert!(result.is_ok(), "{result:?} {seen:?}");
    let seen = not_ledger(&seen);
    let mut patched = lines(&seen)[1..].to_vec();
    patched.sort();
    assert_eq!(
        patched,
        [
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
            format!("PATCH {CUSTOM_RUNS}/b-lock/status"),
        ],
        "both runs are told, neither failure stops the other"
    );
}

/// The lock state where a (token 1) holds and b waits, both of group promote.
fn holder_a_and_waiter_b() -> Value {
    holder_a_and_waiter_b_of(Kind::Mutex)
}

fn holder_a_and_waiter_b_of(kind: Kind) -> Value {
    let n = |x: &str| kind.name(x);
    let age = |pr: &str, at: &str| json!({"created": at, "name": n(pr)});
    let run = |pr: &str| json!({"kind": "CustomRun", "name": n(&format!("{pr}-lock")), "uid": format!("{pr}-lock-uid")});
    json!({
        "holders": [{"run": run("a"), "pipelineRun": n("a"), "token": 1, "since": "2026-11-30T11:58:10Z",
                     "waitedSeconds": 0, "group": n("promote"), "age": age("a", "2026-11-30T11:58:00Z"),
                     "supersede": "pending"}],
        "queue": [{"run": run("b"), "pipelineRun": n("b"), "group": n("promote"),
                   "age": age("b", "2026-11-30T11:59:00Z"), "supersede": "pending"}],
        "lastToken": 1,
    })
}

/// a holds (not yet told), b waits; c (newer, same group) arrives and supersedes b.
fn a_holds_c_supersedes_b(kind: Kind) -> (Vec<CustomRun>, Vec<PipelineRun>, Value) {
    let runs = vec![
        kind.lock_run("a", "pending", json!({})),
        kind.lock_run("b", "pending", json!({})),
        kind.lock_run("c", "pending", json!({})),
    ];
    let prs = vec![
        pipeline_run("a", "2026-11-30T11:58:00Z"),
        pipeline_run("b", "2026-11-30T11:59:00Z"),
        pipeline_run("c", "2026-11-30T11:59:30Z"),
    ];
    (runs, prs, holder_a_and_waiter_b_of(kind))
}

async fn write_order_case(kind: Kind) {
    let (runs, prs, before) = a_holds_c_supersedes_b(kind);
    let locks = kind.locks();
    let (ctx, handle) = context(runs, prs.clone(), vec![]);
    let b = serde_json::to_value(&prs[1]).unwrap();
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {locks}/k") => (200, kind.lock("1", before.clone())),
        l if l == format!("GET {PIPELINE_RUNS}/b") => (200, b.clone()),
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        kind.reconcile(kind.lock("1", holder_a_and_waiter_b_of(kind)), ctx)
    })
    .await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        lines(&seen),
        [
            format!("PUT {locks}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
            format!("GET {PIPELINE_RUNS}/b"),
            format!("PATCH {PIPELINE_RUNS}/b"),
            format!("POST {EVENTS}"),
            format!("PATCH {CUSTOM_RUNS}/b-lock/status"),
            format!("POST {EVENTS}"),
            format!("PATCH {CUSTOM_RUNS}/c-lock/status"),
        ]
    );
    assert_eq!(
        seen[0].1["status"]["queue"][0]["pipelineRun"],
        kind.name("c")
    );
    let body = |line: String| &seen.iter().find(|(l, _)| *l == line).unwrap().1;
    assert_eq!(
        reason(body(format!("PATCH {CUSTOM_RUNS}/a-lock/status"))),
        "Acquired"
    );
    assert_b_superseded_by_c(kind, &seen);
    assert_eq!(
        reason(body(format!("PATCH {CUSTOM_RUNS}/c-lock/status"))),
        "Waiting"
    );
}

/// b's PipelineRun cancelled (annotated in the same patch), its lock run told why, and an
/// Event on each.
fn assert_b_superseded_by_c(kind: Kind, seen: &[(String, Value)]) {
    // By request, not by index: the transition Events land in the background.
    let body = |line: String| &seen.iter().find(|(l, _)| *l == line).unwrap().1;
    let superseded: Vec<&Value> = seen
        .iter()
        .filter(|(_, e)| e["reason"] == "Superseded")
        .map(|(_, e)| e)
        .collect();
    let cancel = body(format!("PATCH {PIPELINE_RUNS}/b"));
    assert_eq!(cancel["spec"]["status"], "CancelledRunFinally");
    assert_eq!(
        cancel["metadata"]["annotations"]["tekton-mutex.dev/superseded-by"],
        kind.name("c"),
        "the annotation rides in the cancel patch"
    );
    assert_eq!(
        cancel["metadata"]["uid"], "b-uid",
        "the uid makes the patch fail on a re-created b"
    );
    assert_eq!(superseded[0]["regarding"]["kind"], "PipelineRun");
    let b_patch = body(format!("PATCH {CUSTOM_RUNS}/b-lock/status"));
    let b = &b_patch["status"];
    assert_eq!(reason(b_patch), "CustomRunCancelled");
    assert_eq!(
        b["conditions"][0]["message"],
        format!(
            "Superseded: newer PipelineRun {} (group {}) holds or waits for k",
            kind.name("c"),
            kind.name("promote")
        )
    );
    assert_eq!(b["extraFields"]["supersededBy"], kind.name("c"));
    assert_eq!(superseded[1]["regarding"]["kind"], "CustomRun");
    assert_eq!(superseded[1]["regarding"]["name"], "b-lock");
}

async fn refused_writes_case(kind: Kind) {
    let (runs, prs, before) = a_holds_c_supersedes_b(kind);
    let locks = kind.locks();
    let (ctx, handle) = context(runs, prs.clone(), vec![]);
    let b = serde_json::to_value(&prs[1]).unwrap();
    // An admission policy denies the cancel and b's status; c's meets throttling.
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {locks}/k") => (200, kind.lock("1", before.clone())),
        l if l == format!("GET {PIPELINE_RUNS}/b") => (200, b.clone()),
        l if l == format!("PATCH {PIPELINE_RUNS}/b") => (403, status(403, "Forbidden")),
        l if l == format!("PATCH {CUSTOM_RUNS}/b-lock/status") => (403, status(403, "Forbidden")),
        l if l == format!("PATCH {CUSTOM_RUNS}/c-lock/status") => {
            (429, status(429, "TooManyRequests"))
        }
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        kind.reconcile(kind.lock("1", holder_a_and_waiter_b_of(kind)), ctx)
    })
    .await;
    assert!(
        matches!(&result, Err(Error::Kube(kube::Error::Api(e))) if e.code == 403),
        "the first failure is returned, so the key is retried: {result:?}"
    );
    assert_eq!(
        lines(&seen),
        [
            format!("PUT {locks}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
            format!("GET {PIPELINE_RUNS}/b"),
            format!("PATCH {PIPELINE_RUNS}/b"),
            format!("PATCH {CUSTOM_RUNS}/b-lock/status"),
            format!("PATCH {CUSTOM_RUNS}/c-lock/status"),
        ],
        "every write is tried, the grant first"
    );
    let mut failed: Vec<String> = seen
        .iter()
        .filter(|(_, e)| e["reason"] == events::WRITE_FAILED)
        .map(|(_, e)| {
            format!("{}/{}", e["regarding"]["kind"], e["regarding"]["name"]).replace('"', "")
        })
        .collect();
    failed.sort();
    assert_eq!(
        failed,
        ["CustomRun/b-lock", "CustomRun/c-lock", "PipelineRun/b"],
        "each refused write is said on its object"
    );
}

#[tokio::test]
async fn a_run_its_pipelinerun_does_not_list_is_left_alone() {
    // "a" holds; a forged run claims b, which does not list it, and looks stale.
    let mut forged = lock_run("b", "pending", json!({}));
    forged.metadata.name = Some("forged".into());
    forged.metadata.uid = Some("forged-uid".into());
    let (ctx, handle) = context(
        vec![lock_run("a", "pending", json!({})), forged],
        vec![
            pipeline_run("a", "2026-11-30T11:59:00Z"),
            pipeline_run("b", "2026-11-30T11:58:00Z"),
        ],
        vec![],
    );
    let respond = |line: &str, body: &Value| match line {
        l if l == format!("GET {MUTEXES}/k") => (200, mutex("1", json!({}))),
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        sync::reconcile(the_mutex(), ctx)
    })
    .await;
    assert!(result.is_ok(), "{result:?}");
    let seen = not_ledger(&seen);
    assert_eq!(
        lines(&seen),
        [
            format!("PUT {MUTEXES}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
        ],
        "the forged run is neither told, queued nor a reason to cancel b"
    );
    assert_eq!(seen[0].1["status"]["queue"], json!([]));
}

#[tokio::test]
async fn a_supersede_is_counted_once_when_its_write_lands() {
    // a holds, b waits; c arrives and supersedes b. b's first patch meets a 409,
    // so the next sync redoes it: one supersede, one cancel, counted once each.
    let (ctx, handle) = context(
        ["a", "b", "c"]
            .map(|pr| lock_run(pr, "pending", json!({})))
            .to_vec(),
        vec![
            pipeline_run("a", "2026-11-30T11:58:00Z"),
            pipeline_run("b", "2026-11-30T11:59:00Z"),
            pipeline_run("c", "2026-11-30T11:59:30Z"),
        ],
        vec![],
    );
    let metrics = ctx.metrics.clone();
    let lock_state = Arc::new(std::sync::Mutex::new(holder_a_and_waiter_b()));
    let cache = lock_state.clone();
    let b_running = serde_json::to_value(pipeline_run("b", "2026-11-30T11:59:00Z")).unwrap();
    let mut b_cancelled = false;
    let mut b_patches = 0;
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {MUTEXES}/k") => {
            (200, mutex("1", lock_state.lock().unwrap().clone()))
        }
        l if l == format!("PUT {MUTEXES}/k/status") => {
            *lock_state.lock().unwrap() = body["status"].clone();
            ok(line, body)
        }
        l if l == format!("GET {PIPELINE_RUNS}/b") => {
            let mut pr = b_running.clone();
            if b_cancelled {
                pr["spec"]["status"] = json!("CancelledRunFinally");
            }
            (200, pr)
        }
        l if l == format!("PATCH {PIPELINE_RUNS}/b") => {
            b_cancelled = true;
            ok(line, body)
        }
        l if l == format!("PATCH {CUSTOM_RUNS}/b-lock/status") => {
            b_patches += 1;
            match b_patches {
                1 => (409, status(409, "Conflict")),
                _ => ok(line, body),
            }
        }
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| async move {
        let now = || cached(mutex("1", cache.lock().unwrap().clone()));
        sync::reconcile(now(), ctx.clone()).await?;
        sync::reconcile(now(), ctx).await
    })
    .await;
    assert!(result.is_ok(), "{result:?}");
    let b_lock = format!("PATCH {CUSTOM_RUNS}/b-lock/status");
    assert_eq!(lines(&seen).iter().filter(|l| **l == b_lock).count(), 2);
    let ns = crate::metrics::Ns {
        namespace: NS.into(),
    };
    assert_eq!(metrics.supersedes.get_or_create(&ns).get(), 1);
    assert_eq!(metrics.cancels.get_or_create(&ns).get(), 1);
}

#[tokio::test]
async fn intake_creates_the_mutex_of_a_new_key_once() {
    for (answer, code) in [("created", 201), ("already there", 409)] {
        let run = lock_run("a", "pending", json!({}));
        let (ctx, handle) = context(vec![], vec![], vec![]);
        let respond = move |line: &str, body: &Value| match (line.starts_with("POST"), code) {
            (true, 201) => ok(line, body),
            (true, _) => (409, status(409, "AlreadyExists")),
            (false, _) => (200, mutex("1", json!({}))),
        };
        let (result, seen) = exchange(ctx, handle, respond, |ctx| {
            intake::reconcile(Arc::new(run), ctx)
        })
        .await;
        assert!(result.is_ok(), "{answer}: {result:?}");
        let mut expected = vec![format!("POST {MUTEXES}")];
        if code == 409 {
            // Someone else created it: read its spec, to check the run agrees with it.
            expected.push(format!("GET {MUTEXES}/k"));
        }
        assert_eq!(lines(&seen), expected, "{answer}");
        let created = &seen[0].1;
        assert_eq!(created["metadata"]["name"], "k");
        assert_eq!(created["spec"]["capacity"], 1);
        assert_eq!(
            created["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "tekton-mutex"
        );
    }
}

#[tokio::test]
async fn intake_leaves_an_existing_mutex_alone_and_fails_bad_params() {
    let good = lock_run("a", "pending", json!({}));
    let existing: Mutex = serde_json::from_value(mutex("1", json!({}))).unwrap();
    let (ctx, handle) = context(vec![], vec![], vec![existing]);
    let (result, seen) = exchange(ctx, handle, ok, |ctx| {
        intake::reconcile(Arc::new(good), ctx)
    })
    .await;
    assert!(result.is_ok() && seen.is_empty(), "{result:?} {seen:?}");

    let bad = lock_run("a", "sometimes", json!({}));
    let (ctx, handle) = context(vec![], vec![], vec![]);
    let (result, seen) =
        exchange(ctx, handle, ok, |ctx| intake::reconcile(Arc::new(bad), ctx)).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(lines(&seen), [format!("PATCH {CUSTOM_RUNS}/a-lock/status")]);
    assert_eq!(reason(&seen[0].1), "InvalidParams");
}

#[tokio::test]
async fn an_embedded_spec_that_disagrees_with_the_mutex_is_invalid_params() {
    let mut run = lock_run("a", "pending", json!({}));
    run.spec.custom_ref = None;
    run.spec.custom_spec = serde_json::from_value(json!({
        "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex", "spec": {"capacity": 3}
    }))
    .unwrap();
    let existing: Mutex = serde_json::from_value(mutex("1", json!({}))).unwrap();
    let (ctx, handle) = context(vec![], vec![], vec![existing]);
    let (result, seen) =
        exchange(ctx, handle, ok, |ctx| intake::reconcile(Arc::new(run), ctx)).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(lines(&seen), [format!("PATCH {CUSTOM_RUNS}/a-lock/status")]);
    assert_eq!(reason(&seen[0].1), "InvalidParams");
    let message = seen[0].1["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(
        message.contains("sets capacity 3, but Mutex k already has capacity 1"),
        "{message}"
    );
}

/// A grant whose token the ledger already covers (a block reserved by an earlier grant) writes
/// no ledger: the lock's status and the run's, 2 writes.
#[tokio::test]
async fn a_grant_inside_the_reserved_block_writes_no_ledger() {
    let (ctx, handle) = context(
        vec![lock_run("a", "none", json!({}))],
        vec![pipeline_run("a", "2026-11-30T11:59:00Z")],
        vec![],
    );
    let m = mutex(
        "1",
        json!({"lastToken": far(1), "ledgerCovers": far(TOKEN_BLOCK)}),
    );
    let (result, seen) = exchange(ctx, handle, ok, |ctx| sync::reconcile(cached(m), ctx)).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        lines(&seen),
        [
            format!("PUT {MUTEXES}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
        ]
    );
    let status = &seen[0].1["status"];
    assert_eq!(
        (&status["lastToken"], &status["ledgerCovers"]),
        (&json!(far(2)), &json!(far(TOKEN_BLOCK)))
    );
}

#[tokio::test]
async fn the_finalizer_goes_on_before_anyone_is_written_into_the_mutex() {
    let before = clock_now();
    let (ctx, handle) = context(
        vec![lock_run("a", "none", json!({}))],
        vec![pipeline_run("a", "2026-11-30T11:59:00Z")],
        vec![],
    );
    let mut m = mutex("1", json!({}));
    m["metadata"]["finalizers"] = json!(["someone-else"]);
    let (result, seen) = exchange(ctx, handle, ok, |ctx| sync::reconcile(cached(m), ctx)).await;
    assert!(result.is_ok(), "{result:?}");
    let [read, create] = ledger_created(&format!("{LEDGER}/{}", token_floor::LEDGER));
    assert_eq!(
        lines(&seen),
        [
            format!("PATCH {MUTEXES}/k"),
            read,
            create,
            format!("PUT {MUTEXES}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
        ],
        "the token is in the ledger before the lock state that hands it out"
    );
    let patch = &seen[0].1["metadata"];
    assert_eq!(
        patch["finalizers"],
        json!(["someone-else", finalizer::LOCK_STATE_FINALIZER])
    );
    assert_eq!(patch["resourceVersion"], "1", "a compare-and-swap");
    let token = seen[3].1["status"]["lastToken"]
        .as_i64()
        .unwrap_or_default();
    assert!(token >= before, "a token from the clock: {token}");
    let block_end = token + TOKEN_BLOCK - 1;
    assert_eq!(
        seen[2].1["data"]["mutex.k"],
        block_end.to_string(),
        "the token's block, reserved"
    );
    assert_eq!(seen[3].1["status"]["ledgerCovers"], block_end);
    assert_eq!(
        seen[3].1["metadata"]["resourceVersion"], "2",
        "the status write follows the finalizer's resourceVersion"
    );
}

/// The same engine serves a ClusterMutex: its finalizer goes on first too,
/// then its status (a compare-and-swap on the version the finalizer patch
/// returned), then the grant on the run, in the run's own namespace.
#[tokio::test]
async fn the_finalizer_goes_on_before_anyone_is_written_into_a_cluster_mutex() {
    let before = clock_now();
    let run: CustomRun = serde_json::from_value({
        let mut r = serde_json::to_value(lock_run("a", "none", json!({}))).unwrap();
        r["spec"]["customRef"] =
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": "prod"});
        r["spec"]["params"] = json!([{"name": "supersede", "value": "none"}]);
        r
    })
    .unwrap();
    let (ctx, handle) = context(
        vec![run],
        vec![pipeline_run("a", "2026-11-30T11:59:00Z")],
        vec![],
    );
    let cm: ClusterMutex = serde_json::from_value(json!({
        "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
        "metadata": {"name": "prod", "resourceVersion": "1", "uid": LOCK_UID},
        "spec": {"namespaces": [NS]}, "status": ledger_read(json!({}))}))
    .unwrap();
    let (result, seen) = exchange(ctx, handle, ok, |ctx| sync::reconcile(Arc::new(cm), ctx)).await;
    assert!(result.is_ok(), "{result:?}");
    let cluster_ledger = format!(
        "/api/v1/namespaces/kube-system/configmaps/{}",
        token_floor::LEDGER
    );
    let [read, create] = ledger_created(&cluster_ledger);
    assert_eq!(
        lines(&seen),
        [
            format!("PATCH {CLUSTER_MUTEXES}/prod"),
            read,
            create,
            format!("PUT {CLUSTER_MUTEXES}/prod/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
        ]
    );
    let token = seen[3].1["status"]["lastToken"]
        .as_i64()
        .unwrap_or_default();
    assert!(token >= before, "a token from the clock: {token}");
    assert_eq!(
        seen[2].1["data"]["clustermutex.prod"],
        (token + TOKEN_BLOCK - 1).to_string()
    );
    assert_eq!(
        seen[0].1["metadata"]["finalizers"],
        json!([finalizer::LOCK_STATE_FINALIZER])
    );
    let status = &seen[3].1["status"];
    assert_eq!(
        status["holders"][0]["run"]["name"],
        format!("{NS}/a-lock"),
        "names qualified by namespace"
    );
    assert_eq!(seen[3].1["metadata"]["resourceVersion"], "2");
}

#[tokio::test]
async fn an_empty_mutex_marked_for_deletion_loses_only_its_finalizer_and_comes_back_for_newcomers()
{
    let (ctx, handle) = a_done_and_b_arrived();
    let deleting = |status: Value| {
        let mut m = mutex("1", status);
        m["metadata"]["deletionTimestamp"] = json!("2026-11-30T12:00:00Z");
        m["metadata"]["finalizers"] = json!([finalizer::LOCK_STATE_FINALIZER, "someone-else"]);
        m
    };
    // The sync starts from the cached Mutex; the release reads it fresh.
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {MUTEXES}/k") => (200, deleting(json!({"lastToken": 1}))),
        l if l == format!("GET {LEDGER}/{}", token_floor::LEDGER) => (404, status(404, "NotFound")),
        l if l.starts_with("GET /api/v1/namespaces/ns/pods") => (
            200,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "items": []}),
        ),
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        sync::reconcile(cached(deleting(holder_of_a(Kind::Mutex))), ctx)
    })
    .await;
    assert!(result.is_ok(), "{result:?} {seen:?}");
    let writes: Vec<&str> = lines(&seen)
        .into_iter()
        .filter(|l| !l.starts_with("GET"))
        .collect();
    assert_eq!(
        writes,
        [
            format!("PUT {MUTEXES}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/b-lock/status"),
            format!("POST {LEDGER}"),
            format!("PATCH {MUTEXES}/k"),
            format!("POST {MUTEXES}"),
        ],
        "the last token is in the ledger before the finalizer comes off"
    );
    let ledger = seen.iter().find(|(l, _)| *l == format!("POST {LEDGER}"));
    assert_eq!(ledger.unwrap().1["data"], json!({"mutex.k": "1"}));
    let told = seen
        .iter()
        .find(|(l, _)| l.ends_with("b-lock/status"))
        .unwrap();
    assert_eq!(reason(&told.1), "Waiting");
    let message = told.1["status"]["conditions"][0]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("is being deleted"), "{message}");
    let release = seen
        .iter()
        .find(|(l, _)| *l == format!("PATCH {MUTEXES}/k"))
        .unwrap();
    assert_eq!(release.1["metadata"]["finalizers"], json!(["someone-else"]));
}

/// a's PipelineRun is done (its lock run holds token 1), so the Mutex empties; b arrived after
/// the delete.
fn a_done_and_b_arrived() -> (Arc<Context>, mock::Handle<Request<Body>, Response<Body>>) {
    let mut done = pipeline_run("a", "2026-11-30T11:58:00Z");
    done.status = Some(
        serde_json::from_value(json!({"conditions": [
            {"type": "Succeeded", "status": "True", "reason": "Succeeded"}]}))
        .unwrap(),
    );
    let acquired = json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
                          "results": [{"name": "token", "value": "1"}]});
    context(
        vec![
            lock_run("a", "none", acquired),
            lock_run("b", "none", json!({})),
        ],
        vec![done, pipeline_run("b", "2026-11-30T11:59:00Z")],
        vec![],
    )
}

/// The lock state where a (token 1) holds.
fn holder_of_a(kind: Kind) -> Value {
    let mut st = holder_a_and_waiter_b_of(kind);
    st["queue"] = json!([]);
    st
}

#[tokio::test]
async fn a_run_in_a_namespace_being_deleted_is_left_alone_other_failures_back_off() {
    let terminating = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "Forbidden", "code": 403,
        "message": "mutexes.tekton-mutex.dev \"k\" is forbidden: unable to create new content in namespace ns because it is being terminated"});
    for (answer, left_alone) in [(terminating, true), (status(403, "Forbidden"), false)] {
        let run = Arc::new(lock_run("a", "pending", json!({})));
        let (ctx, handle) = context(vec![], vec![], vec![]);
        let respond = move |_: &str, _: &Value| (403, answer.clone());
        let (result, seen) = exchange(ctx, handle, respond, |ctx| {
            intake_when_acting(run.clone(), ctx)
        })
        .await;
        assert_eq!(lines(&seen), [format!("POST {MUTEXES}")]);
        if left_alone {
            assert!(result.is_ok(), "not an error, so never retried: {result:?}");
            continue;
        }
        let err = result.unwrap_err();
        let (ctx, _) = context(vec![], vec![], vec![]);
        // Each further failure of the same object waits twice as long.
        let first = error_policy(run.clone(), &err, ctx.clone());
        let second = error_policy(run.clone(), &err, ctx.clone());
        let other = error_policy(Arc::new(lock_run("b", "pending", json!({}))), &err, ctx);
        assert_eq!(first, Action::requeue(Duration::from_millis(500)));
        assert_eq!(second, Action::requeue(Duration::from_secs(1)));
        assert_eq!(other, first, "another object is not slowed down");
    }
}

/// A decision that only tells runs (the lock state stays as it is) checks that
/// the cached Mutex is still the API server's, and decides again if not.
#[tokio::test]
async fn runs_are_told_only_what_the_current_lock_state_backs() {
    let runs = || {
        vec![
            lock_run("a", "pending", json!({})),
            lock_run("b", "pending", json!({})),
        ]
    };
    let prs = vec![
        pipeline_run("a", "2026-11-30T11:58:00Z"),
        pipeline_run("b", "2026-11-30T11:59:00Z"),
    ];
    // The lock state as the controller writes it for a holding and b waiting.
    let (ctx, handle) = context(runs(), prs, vec![]);
    let (_, seen) = exchange(ctx, handle, ok, |ctx| {
        sync::reconcile(cached(mutex("1", holder_a_and_waiter_b())), ctx)
    })
    .await;
    let settled = seen[0].1["status"].clone();
    assert_eq!(settled["holders"][0]["pipelineRun"], "a");
    for (server_version, expected) in [
        ("1", vec!["GET", "PATCH a-lock", "PATCH b-lock"]),
        ("2", vec!["GET", "GET", "PATCH a-lock", "PATCH b-lock"]),
    ] {
        let state = settled.clone();
        let (ctx, handle) = context(
            vec![
                lock_run("a", "pending", json!({})),
                lock_run("b", "pending", json!({})),
            ],
            vec![
                pipeline_run("a", "2026-11-30T11:58:00Z"),
                pipeline_run("b", "2026-11-30T11:59:00Z"),
            ],
            vec![],
        );
        let respond = move |line: &str, body: &Value| match line {
            l if l == format!("GET {MUTEXES}/k") => (200, mutex(server_version, state.clone())),
            _ => ok(line, body),
        };
        let cache = cached(mutex("1", settled.clone()));
        let (result, seen) =
            exchange(ctx, handle, respond, |ctx| sync::reconcile(cache, ctx)).await;
        assert!(result.is_ok(), "{result:?}");
        let short: Vec<String> = lines(&seen)
            .iter()
            .map(|l| {
                l.replace(&format!("{MUTEXES}/k"), "")
                    .replace(&format!("{CUSTOM_RUNS}/"), "")
                    .replace("/status", "")
                    .trim()
                    .to_string()
            })
            .collect();
        assert_eq!(
            short, expected,
            "server at resourceVersion {server_version}"
        );
    }
}

/// The token ledger as the API server holds it: `data`, at resourceVersion 9.
fn ledger(data: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "data": data,
           "metadata": {"name": token_floor::LEDGER, "namespace": NS, "resourceVersion": "9"}})
}

/// a is done: the Mutex is idle, so it records its last token, then lets go of its finalizer
/// (an idle Mutex may then be deleted with no controller running). Nothing is created again.
async fn idle_case(kind: Kind) {
    let (locks, (ledger_path, entry)) = (kind.locks(), kind.ledger());
    let mut done = pipeline_run("a", "2026-11-30T11:58:00Z");
    done.status = Some(
        serde_json::from_value(json!({"conditions": [
            {"type": "Succeeded", "status": "True", "reason": "Succeeded"}]}))
        .unwrap(),
    );
    let acquired = json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
                          "results": [{"name": "token", "value": "1"}]});
    let (ctx, handle) = context(
        vec![kind.lock_run("a", "none", acquired)],
        vec![done],
        vec![],
    );
    let served = ledger_path.clone();
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {locks}/k") => (200, kind.lock("2", json!({"lastToken": 1}))),
        l if l == format!("GET {served}") => (200, ledger(json!({"mutex.other": "4"}))),
        l if l.starts_with("GET /api/v1/namespaces/ns/pods") => (
            200,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "items": []}),
        ),
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        kind.reconcile(kind.lock("1", holder_of_a(kind)), ctx)
    })
    .await;
    assert!(result.is_ok(), "{result:?} {seen:?}");
    let writes: Vec<&str> = lines(&seen)
        .into_iter()
        .filter(|l| !l.starts_with("GET"))
        .collect();
    let put = format!("PUT {ledger_path}");
    assert_eq!(
        writes,
        [
            format!("PUT {locks}/k/status"),
            put.clone(),
            format!("PATCH {locks}/k")
        ]
    );
    let body = |line: &str| &seen.iter().find(|(l, _)| l == line).unwrap().1;
    let recorded = body(&put);
    assert_eq!(recorded["data"], json!({"mutex.other": "4", entry: "1"}));
    assert_eq!(
        recorded["metadata"]["resourceVersion"], "9",
        "a compare-and-swap"
    );
    let unprotected = body(&format!("PATCH {locks}/k"));
    assert_eq!(unprotected["metadata"]["finalizers"], json!([]));
    assert_eq!(
        unprotected["metadata"]["resourceVersion"], "2",
        "on the fresh read"
    );
}

/// A Mutex of a key whose earlier Mutex went (and whose runs are gone): its first grant is
/// above the ledger's floor, not token 1.
async fn above_the_ledger_case(kind: Kind) {
    let (locks, (ledger_path, entry)) = (kind.locks(), kind.ledger());
    let (ctx, handle) = context(
        vec![kind.lock_run("a", "none", json!({}))],
        vec![pipeline_run("a", "2026-11-30T11:59:00Z")],
        vec![],
    );
    let (served, served_entry) = (ledger_path.clone(), entry.clone());
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {served}") => (
            200,
            ledger(json!({served_entry.clone(): far(7).to_string(), "mutex.other": "40"})),
        ),
        _ => ok(line, body),
    };
    let mut fresh = kind.lock("1", json!({}));
    fresh.as_object_mut().unwrap().remove("status");
    fresh["metadata"]["finalizers"] = json!([]);
    let (result, seen) = exchange(ctx, handle, respond, |ctx| kind.reconcile(fresh, ctx)).await;
    assert!(result.is_ok(), "{result:?}");
    let [read, raise] = ledger_raised(&ledger_path);
    assert_eq!(
        lines(&seen),
        [
            format!("GET {ledger_path}"),
            format!("PATCH {locks}/k"),
            read,
            raise,
            format!("PUT {locks}/k/status"),
            format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
        ]
    );
    let block_end = far(8) + TOKEN_BLOCK - 1;
    assert_eq!(
        seen[3].1["data"][&entry],
        block_end.to_string(),
        "token 8's block, reserved first"
    );
    assert_eq!(seen[4].1["status"]["ledgerCovers"], block_end);
    let st = &seen[4].1["status"];
    assert_eq!(
        (&st["lastToken"], &st["holders"][0]["token"]),
        (&json!(far(8)), &json!(far(8)))
    );
}

async fn unreadable_ledger_case(kind: Kind) {
    let (locks, (ledger_path, _)) = (kind.locks(), kind.ledger());
    let (ctx, handle) = context(
        vec![kind.lock_run("a", "none", json!({}))],
        vec![pipeline_run("a", "2026-11-30T11:59:00Z")],
        vec![],
    );
    let served = ledger_path.clone();
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {served}") => (403, status(403, "Forbidden")),
        _ => ok(line, body),
    };
    let mut fresh = kind.lock("1", json!({}));
    fresh.as_object_mut().unwrap().remove("status");
    let (result, seen) = exchange(ctx, handle, respond, |ctx| kind.reconcile(fresh, ctx)).await;
    assert!(matches!(result, Err(Error::Ledger(_))), "{result:?}");
    let writes: Vec<_> = seen
        .iter()
        .filter(|(l, _)| !l.starts_with("GET ") && !l.contains("/events"))
        .collect();
    assert_eq!(writes.len(), 1, "only the condition is written: {seen:?}");
    assert_eq!(writes[0].0, format!("PUT {locks}/k/status"));
    let st = &writes[0].1["status"];
    let ready = &st["conditions"][0];
    assert_eq!(
        (&ready["type"], &ready["status"], &ready["reason"]),
        (
            &json!("Ready"),
            &json!("False"),
            &json!("TokenLedgerFailed")
        )
    );
    assert!(
        st["holders"].as_array().is_none_or(|h| h.is_empty()),
        "{st}"
    );
}

/// Issue 37 item 11, upgrading: the ClusterMutexes' ledger moved from the controller's namespace
/// to kube-system. While the old one still has entries, a new ClusterMutex starts above the
/// higher of the two; a missing old ledger (or namespace: both answer 404) is no floor, never an
/// error. A Mutex's floor is its own namespace's alone.
#[tokio::test]
async fn a_cluster_mutex_floor_is_the_higher_of_the_new_and_the_old_ledger() {
    const OLD: &str = "/api/v1/namespaces/tekton-mutex/configmaps/tekton-mutex-token-floors";
    // Floors far above the clock, so that they decide; with none, the clock does.
    let cases = [
        (Kind::Cluster, Some(far(3)), Some(far(7)), Some(far(8))),
        (Kind::Cluster, Some(far(9)), Some(far(3)), Some(far(10))),
        (Kind::Cluster, Some(far(3)), None, Some(far(4))),
        (Kind::Cluster, None, Some(far(5)), Some(far(6))),
        (Kind::Cluster, None, None, None),
        (Kind::Mutex, Some(far(3)), Some(far(7)), Some(far(4))),
    ];
    for (kind, new, old, first) in cases {
        let before = clock_now();
        let (locks, (ledger_path, entry)) = (kind.locks(), kind.ledger());
        let (mut ctx, handle) = context(
            vec![kind.lock_run("a", "none", json!({}))],
            vec![pipeline_run("a", "2026-11-30T11:59:00Z")],
            vec![],
        );
        Arc::get_mut(&mut ctx).unwrap().previous_cluster_ledger = Some("tekton-mutex".into());
        let (served, e) = (ledger_path.clone(), entry.clone());
        let respond = move |line: &str, body: &Value| {
            let answer = |v: Option<i64>| match v {
                Some(v) => (200, ledger(json!({e.clone(): v.to_string()}))),
                None => (404, status(404, "NotFound")),
            };
            match line {
                l if l == format!("GET {served}") => answer(new),
                l if l == format!("GET {OLD}") => answer(old),
                _ => ok(line, body),
            }
        };
        let mut fresh = kind.lock("1", json!({}));
        fresh.as_object_mut().unwrap().remove("status");
        fresh["metadata"]["finalizers"] = json!([]);
        let (result, seen) = exchange(ctx, handle, respond, |ctx| kind.reconcile(fresh, ctx)).await;
        let case = format!("{kind:?}, new {new:?}, old {old:?}");
        assert!(result.is_ok(), "{case}: {result:?}");
        let mut reads = vec![format!("GET {ledger_path}")];
        if let Kind::Cluster = kind {
            reads.push(format!("GET {OLD}"));
        }
        let write = match new {
            Some(_) => ledger_raised(&ledger_path),
            None => ledger_created(&ledger_path),
        };
        let expected: Vec<String> = reads
            .into_iter()
            .chain([format!("PATCH {locks}/k")])
            .chain(write)
            .chain([
                format!("PUT {locks}/k/status"),
                format!("PATCH {CUSTOM_RUNS}/a-lock/status"),
            ])
            .collect();
        assert_eq!(
            lines(&seen),
            expected,
            "{case}: only the new ledger is written"
        );
        let st = &seen[expected.len() - 2].1["status"];
        match first {
            Some(first) => assert_eq!(st["lastToken"], json!(first), "{case}"),
            None => assert!(st["lastToken"].as_i64() >= Some(before), "{case}: {st}"),
        }
    }
}

/// Upgrading, the ClusterMutexes' entries of the old ledger are copied into the new one (only
/// ever raising it), so that an uninstall, which deletes the old one with the controller's
/// namespace, keeps them. Mutexes' entries and entries that are no token stay where they are.
#[tokio::test]
async fn an_upgrade_carries_the_cluster_mutexes_floors_over_to_their_new_ledger() {
    const OLD: &str = "/api/v1/namespaces/tekton-mutex/configmaps/tekton-mutex-token-floors";
    let (new, _) = Kind::Cluster.ledger();
    for old_ledger in [true, false] {
        let (mut ctx, handle) = context(vec![], vec![], vec![]);
        Arc::get_mut(&mut ctx).unwrap().previous_cluster_ledger = Some("tekton-mutex".into());
        let served = new.clone();
        let respond = move |line: &str, body: &Value| match line {
            l if l == format!("GET {OLD}") && old_ledger => (
                200,
                ledger(json!({"clustermutex.a": "5", "clustermutex.b": "2",
                              "clustermutex.bad": "x", "mutex.m": "9"})),
            ),
            l if l == format!("GET {OLD}") => (404, status(404, "NotFound")),
            l if l == format!("GET {served}") => (200, ledger(json!({"clustermutex.b": "4"}))),
            _ => ok(line, body),
        };
        let (result, seen) = exchange(ctx, handle, respond, |ctx| async move {
            let carried = token_floor::carry_over(&ctx).await?;
            assert_eq!(carried, if old_ledger { 2 } else { 0 });
            Ok(Action::await_change())
        })
        .await;
        assert!(result.is_ok(), "{result:?}");
        if !old_ledger {
            assert_eq!(lines(&seen), [format!("GET {OLD}")], "nothing to carry");
            continue;
        }
        assert_eq!(
            lines(&seen),
            [
                format!("GET {OLD}"),
                format!("GET {new}"),
                format!("PUT {new}")
            ],
            "written to the new ledger only"
        );
        assert_eq!(
            seen[2].1["data"],
            json!({"clustermutex.a": "5", "clustermutex.b": "4"}),
            "raised, never lowered"
        );
    }
}

/// Issue 37 item 7: an idle ClusterMutex whose last token cannot be recorded (here: the
/// ledger's namespace does not exist) keeps its finalizer, as it must, and says why on itself:
/// an Event naming the ConfigMap, its namespace and the fix, not only a retry in the log.
#[tokio::test]
async fn a_ledger_that_cannot_be_written_is_said_on_the_lock_that_waits_for_it() {
    let kind = Kind::Cluster;
    let locks = kind.locks();
    let mut done = pipeline_run("a", "2026-11-30T11:58:00Z");
    done.status = Some(
        serde_json::from_value(json!({"conditions": [
            {"type": "Succeeded", "status": "True", "reason": "Succeeded"}]}))
        .unwrap(),
    );
    let acquired = json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
                          "results": [{"name": "token", "value": "1"}]});
    let (mut ctx, handle) = context(
        vec![kind.lock_run("a", "none", acquired)],
        vec![done],
        vec![],
    );
    Arc::get_mut(&mut ctx).unwrap().cluster_ledger_namespace = "gone".into();
    let missing = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "reason": "NotFound", "code": 404, "message": "namespaces \"gone\" not found",
        "details": {"name": "gone", "kind": "namespaces"}});
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("GET {locks}/k") => (200, kind.lock("2", json!({"lastToken": 1}))),
        "GET /api/v1/namespaces/gone/configmaps/tekton-mutex-token-floors" => {
            (404, status(404, "NotFound"))
        }
        "POST /api/v1/namespaces/gone/configmaps" => (404, missing.clone()),
        l if l.starts_with("GET /api/v1/namespaces/ns/pods") => (
            200,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": {}, "items": []}),
        ),
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        kind.reconcile(kind.lock("1", holder_of_a(kind)), ctx)
    })
    .await;
    let Err(Error::Ledger(why)) = &result else {
        panic!("a ledger error: {result:?}");
    };
    for says in [
        "ConfigMap gone/tekton-mutex-token-floors",
        "namespaces \"gone\" not found",
        "namespace gone does not exist: create it",
        "--cluster-ledger-namespace",
    ] {
        assert!(why.contains(says), "{says:?} in {why}");
    }
    assert!(
        !seen.iter().any(|(l, _)| *l == format!("PATCH {locks}/k")),
        "the finalizer stays on: {seen:?}"
    );
    let event = seen
        .iter()
        .find(|(l, b)| {
            l == "POST /apis/events.k8s.io/v1/namespaces/default/events"
                && b["reason"] == events::LEDGER_FAILED
        })
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("a TokenLedgerFailed Event: {seen:?}"));
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["regarding"]["kind"], "ClusterMutex");
    assert_eq!(event["regarding"]["uid"], LOCK_UID);
    let note = event["note"].as_str().unwrap();
    assert!(
        note.starts_with("tekton-mutex could not record the last token (1) in the token ledger of this ClusterMutex; its finalizer stays on"),
        "{note}"
    );
    assert!(note.contains(why.as_str()), "{note}");
}

/// Issue 23 item 11: a run with `release-after` whose PipelineRun never records
/// its pipeline (created Pending, or a forged owner) is looked at ever more
/// rarely, by the per-object backoff, not every second with a live read each.
#[tokio::test]
async fn a_run_waiting_for_its_pipeline_to_be_recorded_is_rechecked_ever_more_rarely() {
    let mut run = serde_json::to_value(lock_run("a", "none", json!({}))).unwrap();
    run["spec"]["params"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "release-after", "value": "deploy"}));
    let run: Arc<CustomRun> = Arc::new(serde_json::from_value(run).unwrap());
    let pending = pipeline_run("a", "2026-11-30T11:59:00Z");
    let answer = serde_json::to_value(&pending).unwrap();
    let (ctx, handle) = context(vec![], vec![pending], vec![]);
    let server = tokio::spawn(serve(handle, move |line, body| match line {
        l if l == format!("GET {PIPELINE_RUNS}/a") => (200, answer.clone()),
        _ => ok(line, body),
    }));
    let mut delays = Vec::new();
    for _ in 0..4 {
        let action = intake_when_acting(run.clone(), ctx.clone()).await.unwrap();
        delays.push(action);
    }
    drop(ctx);
    let seen = tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .unwrap()
        .unwrap();
    let expected: Vec<Action> = [0.5, 1.0, 2.0, 4.0]
        .map(|s| Action::requeue(Duration::from_secs_f64(s)))
        .into();
    assert_eq!(delays, expected);
    assert_eq!(seen.len(), 4, "one read per look: {seen:?}");
}

/// Issue 49 item 1: a lock status write the API server refuses for good (too large, a policy)
/// is said where people look: a Warning on the lock object, `Ready` False with the API's
/// message in the status as it stood, and the failed-writes metric; the error is returned,
/// so the key is retried with backoff.
#[tokio::test]
async fn a_lock_status_the_api_refuses_is_said_on_the_lock() {
    let runs = vec![
        lock_run("a", "pending", json!({})),
        lock_run("b", "pending", json!({})),
    ];
    let prs = vec![
        pipeline_run("a", "2026-11-30T11:58:00Z"),
        pipeline_run("b", "2026-11-30T11:59:00Z"),
    ];
    let (ctx, handle) = context(runs, prs, vec![]);
    let metrics = ctx.metrics.clone();
    let mut puts = 0;
    let respond = move |line: &str, body: &Value| match line {
        l if l == format!("PUT {MUTEXES}/k/status") => {
            puts += 1;
            match puts {
                1 => (413, status(413, "RequestEntityTooLarge")),
                _ => ok(line, body),
            }
        }
        _ => ok(line, body),
    };
    let (result, seen) = exchange(ctx, handle, respond, |ctx| {
        sync::reconcile(cached(mutex("1", ledger_read(json!({})))), ctx)
    })
    .await;
    assert!(
        matches!(&result, Err(Error::Kube(kube::Error::Api(e))) if e.code == 413),
        "{result:?}"
    );
    let puts: Vec<&Value> = seen
        .iter()
        .filter(|(l, _)| *l == format!("PUT {MUTEXES}/k/status"))
        .map(|(_, b)| b)
        .collect();
    assert_eq!(puts.len(), 2, "{:?}", lines(&seen));
    let conditions = puts[1]["status"]["conditions"].as_array().unwrap();
    let ready = conditions.iter().find(|c| c["type"] == "Ready").unwrap();
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], events::STATUS_WRITE_FAILED);
    assert!(
        ready["message"].as_str().unwrap().contains("mocked 413"),
        "{ready}"
    );
    assert!(
        puts[1]["status"]["holders"]
            .as_array()
            .is_none_or(Vec::is_empty),
        "only Ready changes: {}",
        puts[1]["status"]
    );
    let event = seen
        .iter()
        .find(|(_, b)| b["reason"] == events::STATUS_WRITE_FAILED)
        .map(|(_, b)| b)
        .unwrap_or_else(|| panic!("a StatusWriteFailed Event: {seen:?}"));
    assert_eq!(
        (event["type"].as_str(), event["regarding"]["kind"].as_str()),
        (Some("Warning"), Some("Mutex"))
    );
    let failed = crate::metrics::Write {
        verb: "update".into(),
        resource: "mutexes/status".into(),
    };
    assert_eq!(metrics.api_write_failures.get_or_create(&failed).get(), 1);
    assert!(
        !seen.iter().any(|(l, _)| l.contains("customruns")),
        "no run is told what the lock could not record"
    );
}
