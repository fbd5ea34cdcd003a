//! Several keys at once (issue 16), on the local control plane: pipelines taking
//! `keys: a,b` and `keys: b,a` started together, again and again. Taken one key
//! after the other, such pairs deadlock; taken all together, every run ends.
//!
//! Each deploy step records its own marks as ConfigMaps (start, end), with the
//! host's clock in nanoseconds and the lock's results: the steps all run on this
//! host, so the marks say when deploys ran, independent of the controller.

mod support;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use support::controller::ControllerProcess;
use support::locks::{self, ClusterMutexGuard, Kind, Lock};
use support::pipelines::{lock_run, slow, wait_reason};
use support::*;
use tekton_mutex::model::cluster_mutex::{ClusterMutex, ClusterMutexSpec};
use tekton_mutex::model::mutex::MutexStatus;

for_both_kinds! {
    opposite_key_orders_started_together_never_deadlock_nor_overlap => opposite_orders_case;
    a_run_of_two_keys_waits_for_both_and_holds_neither_partly => waits_for_both_case;
}

/// A test's two keys: Mutexes `a` and `b` of its namespace, or two ClusterMutexes
/// that allow it (named after it: they are cluster-wide), and the controller serving them.
struct Keys {
    kind: Kind,
    a: String,
    b: String,
    _lock: Lock,
    _second: Option<ClusterMutexGuard>,
}

impl Keys {
    async fn new(kind: Kind, ns: &TestNamespace) -> Result<Keys> {
        let lock = Lock::new(kind, ns).await?;
        if kind == Kind::Mutex {
            let (a, b) = ("a".into(), "b".into());
            return Ok(Keys {
                kind,
                a,
                b,
                _lock: lock,
                _second: None,
            });
        }
        let b = format!("{}-b", ns.name());
        let api: kube::Api<ClusterMutex> = kube::Api::all(ns.client());
        let spec: ClusterMutexSpec = serde_json::from_value(json!({"namespaces": [ns.name()]}))?;
        api.create(&Default::default(), &ClusterMutex::new(&b, spec))
            .await?;
        let second = Some(ClusterMutexGuard(api, b.clone()));
        let a = ns.name().to_string();
        Ok(Keys {
            kind,
            a,
            b,
            _lock: lock,
            _second: second,
        })
    }

    /// `keys: a,b` (or `b,a`) against this kind.
    fn task_ref(&self) -> serde_json::Value {
        let kind = match self.kind {
            Kind::Mutex => "Mutex",
            Kind::ClusterMutex => "ClusterMutex",
        };
        json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": kind})
    }

    fn both(&self, first: &str) -> String {
        match first == self.a {
            true => format!("{},{}", self.a, self.b),
            false => format!("{},{}", self.b, self.a),
        }
    }

    async fn status(&self, ns: &TestNamespace, key: &str) -> Result<MutexStatus> {
        match self.kind {
            Kind::Mutex => support::pipelines::mutex_status(ns, key).await,
            Kind::ClusterMutex => {
                let api: kube::Api<ClusterMutex> = kube::Api::all(ns.client());
                Ok(api.get(key).await?.status.unwrap_or_default())
            }
        }
    }

    /// A pipeline that takes `b` alone.
    fn b_only(&self) -> String {
        let opts = match self.kind {
            Kind::Mutex => support::pipelines::Opts {
                lock_params: &[("key", "b"), ("supersede", "none")],
                ..Default::default()
            },
            Kind::ClusterMutex => support::pipelines::Opts {
                lock_params: &[("supersede", "none")],
                cluster_mutex: Some(&self.b),
                ..Default::default()
            },
        };
        support::pipelines::pipeline("b-only", &opts)
    }
}

/// Marks its start (with the lock's `token` and `tokens` results), does about a
/// second of API work, and marks its end.
const DEPLOY_STEP: &str = r#"
mark() { kubectl -n "$(params.ns)" create configmap "$1-$(params.pr)" --from-literal=at="$(date +%s%N)" --from-literal=token='$(params.token)' --from-literal=tokens='$(params.tokens)' >/dev/null; }
mark start
kubectl -n "$(params.ns)" wait --for=create "configmap/never" --timeout=1s >/dev/null 2>&1 || true
mark end
"#;

/// `lock` on `keys` (of a Mutex, or of `task_ref`'s kind), then `deploy` (the step above).
fn pipeline(name: &str, keys: &str, task_ref: &serde_json::Value) -> String {
    pipeline_superseding(name, keys, "none", task_ref)
}

fn pipeline_superseding(
    name: &str,
    keys: &str,
    supersede: &str,
    task_ref: &serde_json::Value,
) -> String {
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name},
        "spec": {"tasks": [
            {"name": "lock",
             "params": [{"name": "keys", "value": keys}, {"name": "supersede", "value": supersede}],
             "taskRef": task_ref},
            {"name": "deploy", "runAfter": ["lock"],
             "params": [
                {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
                {"name": "pr", "value": "$(context.pipelineRun.name)"},
                {"name": "token", "value": "$(tasks.lock.results.token)"},
                {"name": "tokens", "value": "$(tasks.lock.results.tokens)"},
             ],
             "taskSpec": {
                "params": [{"name": "ns"}, {"name": "pr"}, {"name": "token"}, {"name": "tokens"}],
                "steps": [{"name": "run", "image": "busybox", "script": DEPLOY_STEP}],
             }},
        ]},
    })
    .to_string()
}

fn pipeline_run(name: &str, pipeline: &str) -> String {
    json!({"apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
           "metadata": {"name": name}, "spec": {"pipelineRef": {"name": pipeline}}})
    .to_string()
}

/// One deploy as its marks tell it.
#[derive(Debug)]
struct Deploy {
    pr: String,
    start: i128,
    end: i128,
    token: i64,
    tokens: BTreeMap<String, i64>,
}

async fn mark(ns: &TestNamespace, what: &str, pr: &str) -> Result<BTreeMap<String, String>> {
    let name = format!("{what}-{pr}");
    let cm = ns
        .api::<ConfigMap>()
        .get_opt(&name)
        .await?
        .with_context(|| format!("mark {name} is missing"))?;
    Ok(cm.data.unwrap_or_default())
}

async fn deploy(ns: &TestNamespace, pr: &str) -> Result<Deploy> {
    let (start, end) = (mark(ns, "start", pr).await?, mark(ns, "end", pr).await?);
    let at = |m: &BTreeMap<String, String>| -> Result<i128> {
        let at = m.get("at").cloned().unwrap_or_default();
        at.parse()
            .with_context(|| format!("{pr}: no time in {m:?}"))
    };
    let tokens = start.get("tokens").cloned().unwrap_or_default();
    Ok(Deploy {
        pr: pr.into(),
        start: at(&start)?,
        end: at(&end)?,
        token: start.get("token").and_then(|t| t.parse().ok()).unwrap_or(0),
        tokens: serde_json::from_str(&tokens)
            .with_context(|| format!("{pr}: the tokens result is not a JSON object: {tokens:?}"))?,
    })
}

/// No two deploys overlapped (every run takes both keys), each run has a token
/// per key with `token` its first key's, and each key's tokens rise in deploy order.
fn check(mut deploys: Vec<Deploy>, keys: &Keys, first_key: impl Fn(&str) -> String) -> Result<()> {
    deploys.sort_by_key(|d| d.start);
    let names = [keys.a.as_str(), keys.b.as_str()];
    for d in &deploys {
        ensure!(
            d.tokens.keys().map(String::as_str).eq(names),
            "{}: tokens {:?} are not one per key",
            d.pr,
            d.tokens
        );
        ensure!(
            d.token == d.tokens[&first_key(&d.pr)],
            "{}: token {} is not its first key's ({:?})",
            d.pr,
            d.token,
            d.tokens
        );
    }
    for pair in deploys.windows(2) {
        let (x, y) = (&pair[0], &pair[1]);
        ensure!(
            y.start > x.end,
            "deploys {} and {} overlapped: {x:?} {y:?}",
            x.pr,
            y.pr
        );
        for k in names {
            ensure!(
                y.tokens[k] > x.tokens[k],
                "key {k}: {} deployed after {} with a lower token",
                y.pr,
                x.pr
            );
        }
    }
    Ok(())
}

async fn opposite_orders_case(kind: Kind) -> Result<()> {
    const BATCH: usize = 5;
    // Fewer for a ClusterMutex: its controller serves the whole cluster, so it runs alone.
    let rounds = if kind == Kind::Mutex { 20 } else { 10 };
    let ns = TestNamespace::create("multi-key").await?;
    let keys = Keys::new(kind, &ns).await?;
    let (a, b) = (keys.a.clone(), keys.b.clone());
    ns.apply(&pipeline("ab", &keys.both(&a), &keys.task_ref()))
        .await?;
    ns.apply(&pipeline("ba", &keys.both(&b), &keys.task_ref()))
        .await?;
    let mut all = Vec::new();
    for batch in 0..rounds / BATCH {
        let prs: Vec<String> = (0..BATCH)
            .flat_map(|i| {
                let n = batch * BATCH + i;
                [format!("ab-{n}"), format!("ba-{n}")]
            })
            .collect();
        let nsr = &ns;
        let started = futures::future::try_join_all(prs.iter().map(|pr| {
            let yaml = pipeline_run(pr, &pr[..2]);
            async move { nsr.apply(&yaml).await }
        }));
        started.await?;
        // One at a time on both keys: each run needs its lock, a pod and a
        // deploy; a deadlock would hold them all until the PipelineRuns time out.
        let bound = slow() * prs.len() as u32;
        for pr in &prs {
            let c = ns
                .wait_for_succeeded("tekton.dev/v1", "PipelineRun", pr, bound)
                .await?;
            ensure!(c.status == "True", "{pr} did not succeed: {c:?}");
        }
        all.extend(prs);
    }
    let mut deploys = Vec::new();
    for pr in &all {
        deploys.push(deploy(&ns, pr).await?);
    }
    let first = |pr: &str| {
        if pr.starts_with("ab") {
            a.clone()
        } else {
            b.clone()
        }
    };
    check(deploys, &keys, first)
}

async fn waits_for_both_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("multi-key-wait").await?;
    let keys = Keys::new(kind, &ns).await?;
    // `b-holder` holds b and stays in its deploy until its gate opens.
    ns.apply(&keys.b_only()).await?;
    ns.apply(&support::pipelines::pipeline_run("b-holder", "b-only", &[]))
        .await?;
    wait_reason(&ns, &lock_run("b-holder"), "Acquired", slow()).await?;
    ns.apply(&pipeline("ab", &keys.both(&keys.a), &keys.task_ref()))
        .await?;
    ns.apply(&pipeline_run("both", "ab")).await?;
    let waiting = wait_reason(&ns, &lock_run("both"), "Waiting", slow()).await?;
    let named = format!("{}, {}", keys.a, keys.b);
    ensure!(
        waiting
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&named)),
        "the waiting message names both keys: {waiting:?}"
    );
    // a is free, yet `both` is not granted it: a keeps a slot for it, no more.
    let a = keys.status(&ns, &keys.a).await?;
    ensure!(a.holders.is_empty(), "a was granted while b is held: {a:?}");
    ensure!(
        mark(&ns, "start", "both").await.is_err(),
        "both deployed while b was held"
    );
    support::pipelines::release(&ns, "b-holder").await?;
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "both", slow())
        .await?;
    ensure!(c.status == "True", "both did not succeed: {c:?}");
    let d = deploy(&ns, "both").await?;
    ensure!(d.tokens.len() == 2 && d.token == d.tokens[&keys.a], "{d:?}");
    wait_until("both keys to be free", Duration::from_secs(60), || async {
        let (a, b) = (
            keys.status(&ns, &keys.a).await?,
            keys.status(&ns, &keys.b).await?,
        );
        let free = |s: &MutexStatus| s.holders.is_empty() && s.reservations.is_empty();
        Ok((free(&a) && free(&b)).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn superseded_on_one_key_a_run_of_two_keys_is_cancelled_and_gives_back_both() -> Result<()> {
    // No cluster-wide controller of another test may serve this namespace too.
    let _shared = locks::shared().await;
    let ns = TestNamespace::create("multi-key-supersede").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    // `b-holder` holds b (a plain queue run of another pipeline) until its gate opens.
    let holder = support::pipelines::pipeline(
        "b-only",
        &support::pipelines::Opts {
            lock_params: &[("key", "b"), ("supersede", "none")],
            ..Default::default()
        },
    );
    ns.apply(&holder).await?;
    ns.apply(&support::pipelines::pipeline_run("b-holder", "b-only", &[]))
        .await?;
    wait_reason(&ns, &lock_run("b-holder"), "Acquired", slow()).await?;
    // Two runs of one pipeline on a,b, `supersede: pending`, the older first (names break a same-second tie the same way).
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    ns.apply(&pipeline_superseding("ab", "a,b", "pending", &mutex))
        .await?;
    ns.apply(&pipeline_run("run-1", "ab")).await?;
    wait_until("a to keep a slot for run-1", slow(), || async {
        let a = support::pipelines::mutex_status(&ns, "a").await?;
        Ok((a.reservations.len() == 1).then_some(()))
    })
    .await?;
    ns.apply(&pipeline_run("run-2", "ab")).await?;
    support::pipelines::wait_superseded(&ns, &lock_run("run-1")).await?;
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "run-1", slow())
        .await?;
    ensure!(c.reason == "Cancelled", "run-1: {c:?}");
    // Its slot on a went to run-2, which still waits for b.
    wait_until("a to keep its slot for run-2", slow(), || async {
        let a = support::pipelines::mutex_status(&ns, "a").await?;
        let kept: Vec<&str> = a
            .reservations
            .iter()
            .map(|r| r.waiter.pipeline_run.as_deref().unwrap_or(""))
            .collect();
        Ok((kept == ["run-2"]).then_some(()))
    })
    .await?;
    support::pipelines::release(&ns, "b-holder").await?;
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "run-2", slow())
        .await?;
    ensure!(c.status == "True", "run-2 did not succeed: {c:?}");
    ensure!(
        mark(&ns, "start", "run-1").await.is_err(),
        "the superseded run deployed"
    );
    Ok(())
}

/// Issue 23 item 5: a multi-key lock run is deleted while a key keeps its slot as a
/// reservation. The slot stays its PipelineRun's (a run of that key alone keeps
/// waiting), the lock run Tekton re-creates re-enters that hold when it commits, and
/// the PipelineRun goes through: nothing is given away, nothing is stuck.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_deleted_reserved_run_keeps_its_slots_and_its_pipelinerun_goes_through() -> Result<()> {
    let _shared = locks::shared().await;
    let ns = TestNamespace::create("multi-key-deleted").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let only = |name: &str, key: &'static str| {
        let opts = support::pipelines::Opts {
            lock_params: &[("key", key), ("supersede", "none")],
            ..Default::default()
        };
        support::pipelines::pipeline(name, &opts)
    };
    ns.apply(&only("b-only", "b")).await?;
    ns.apply(&only("a-only", "a")).await?;
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    ns.apply(&pipeline("ab", "a,b", &mutex)).await?;
    ns.apply(&support::pipelines::pipeline_run("holder", "b-only", &[]))
        .await?;
    wait_reason(&ns, &lock_run("holder"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("both", "ab")).await?;
    wait_until("a to keep a slot for both", slow(), || async {
        let a = support::pipelines::mutex_status(&ns, "a").await?;
        Ok((a.reservations.len() == 1).then_some(()))
    })
    .await?;
    ns.apply(&support::pipelines::pipeline_run("later", "a-only", &[]))
        .await?;
    wait_reason(&ns, &lock_run("later"), "Waiting", slow()).await?;
    let runs = ns.api::<tekton_mutex::model::tekton::customrun::CustomRun>();
    let uid = runs.get(&lock_run("both")).await?.metadata.uid;
    runs.delete(&lock_run("both"), &Default::default()).await?;
    wait_until(
        "both's lock run to be gone or re-created",
        slow(),
        || async {
            let now = runs.get_opt(&lock_run("both")).await?;
            Ok(now.is_none_or(|r| r.metadata.uid != uid).then_some(()))
        },
    )
    .await?;
    wait_until("a to hold for both's PipelineRun", slow(), || async {
        let a = support::pipelines::mutex_status(&ns, "a").await?;
        let held = a
            .holders
            .iter()
            .any(|h| h.pipeline_run.as_deref() == Some("both"));
        Ok(held.then_some(()))
    })
    .await?;
    ensure!(
        mark(&ns, "start", "later").await.is_err()
            && support::pipelines::condition_of(&ns, &lock_run("later"))
                .await?
                .and_then(|c| c.reason)
                .as_deref()
                == Some("Waiting"),
        "later was given both's slot on a"
    );
    support::pipelines::release(&ns, "holder").await?;
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "both", slow() * 2)
        .await?;
    ensure!(c.status == "True", "both went through: {c:?}");
    wait_reason(&ns, &lock_run("later"), "Acquired", slow()).await?;
    support::pipelines::release(&ns, "later").await?;
    Ok(())
}
