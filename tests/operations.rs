//! Operating tekton-mutex on the local control plane: the metrics after a small
//! scenario, readiness before and after the caches sync, the Events a run
//! collects, and leader failover between two replicas.

mod support;

use anyhow::{Result, ensure};
use std::time::Instant;
use support::controller::ControllerProcess;
use support::ops::*;
use support::pipelines::*;
use support::*;

const ONE_AT_A_TIME: Opts = Opts {
    lock_params: &[("supersede", "none")],
    lock_timeout: None,
    lock_retries: None,
    finally: false,
    mutex_name: None,
    cluster_mutex: None,
    when_acquired: false,
};

async fn scrape(addr: &str) -> Result<String> {
    let r = http_get(addr, "/metrics")?;
    ensure!(r.status == 200, "/metrics answered {}", r.status);
    Ok(r.body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn metrics_count_a_small_scenario() -> Result<()> {
    let ns = TestNamespace::create("metrics").await?;
    let c = ControllerProcess::start_with(ns.name(), &["--http-addr", "127.0.0.1:0"], &[]).await?;
    let addr = http_addr(&c).await?;
    let labels = [("namespace", ns.name())];
    ns.apply(&pipeline("promote", &ONE_AT_A_TIME)).await?;
    let prs = ["a", "b", "c"];
    for pr in prs {
        ns.apply(&pipeline_run(pr, "promote", &[])).await?;
    }
    wait_until(
        "one holder and two waiters in the gauges",
        slow(),
        || async {
            let text = scrape(&addr).await?;
            let holders = sample(&text, "tekton_mutex_holders", &labels)?;
            let waiters = sample(&text, "tekton_mutex_waiters", &labels)?;
            let oldest = sample(&text, OLDEST_WAITER, &[("namespace", ns.name())])?;
            let queued = holders == Some(1.0) && waiters == Some(2.0);
            Ok((queued && oldest.is_some_and(|age| age >= 0.0)).then_some(()))
        },
    )
    .await?;
    drive_grants(&ns, &prs, 3).await?;
    let text = wait_until("the gauges back to 0", slow(), || async {
        let text = scrape(&addr).await?;
        let holders = sample(&text, "tekton_mutex_holders", &labels)?;
        let waiters = sample(&text, "tekton_mutex_waiters", &labels)?;
        Ok((holders == Some(0.0) && waiters == Some(0.0)).then_some(text))
    })
    .await?;
    let value = |name: &str| sample(&text, name, &labels);
    ensure!(
        value("tekton_mutex_grants_total")? == Some(3.0),
        "grants:\n{text}"
    );
    ensure!(
        value("tekton_mutex_wait_seconds_count")? == Some(3.0),
        "one wait observed per grant:\n{text}"
    );
    ensure!(
        value("tekton_mutex_handover_seconds_count")? == Some(2.0),
        "two handovers (a to the next, then to the last):\n{text}"
    );
    ensure!(
        sample(
            &text,
            "tekton_mutex_api_writes_total",
            &[("verb", "update"), ("resource", "mutexes/status")]
        )?
        .is_some_and(|n| n >= 3.0),
        "each grant writes the Mutex status:\n{text}"
    );
    ensure!(value("tekton_mutex_supersedes_total")?.is_none(), "{text}");
    ensure!(
        sample(&text, OLDEST_WAITER, &[("namespace", ns.name())])?.is_none(),
        "no waiter, no oldest-waiter series:\n{text}"
    );
    Ok(())
}

const OLDEST_WAITER: &str = "tekton_mutex_oldest_waiter_age_seconds";

/// The `Ready` condition of Mutex `name`: (status, reason), once it has one.
async fn ready_of(ns: &TestNamespace, name: &str) -> Result<Option<(String, String)>> {
    let st = mutex_status(ns, name).await?;
    Ok(st
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_served_lock_is_ready_and_a_frozen_one_says_so() -> Result<()> {
    let ns = TestNamespace::create("ready").await?;
    ns.apply(MUTEX_DEPLOY).await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    let is = |want: (&'static str, &'static str)| {
        let ns = &ns;
        move || async move {
            let got = ready_of(ns, "deploy").await?;
            Ok((got == Some((want.0.into(), want.1.into()))).then_some(()))
        }
    };
    wait_until("Ready True (Serving)", slow(), is(("True", "Serving"))).await?;
    // As `kubectl wait` reads it: the condition is where tools look for it.
    ns.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "--timeout=30s",
        "mutex/deploy",
    ])?;
    let freeze = r#"{"spec":{"frozen":true}}"#;
    ns.kubectl(&["patch", "mutex", "deploy", "--type=merge", "-p", freeze])?;
    wait_until("Ready True (Frozen)", slow(), is(("True", "Frozen"))).await?;
    Ok(())
}

const MUTEX_DEPLOY: &str = "apiVersion: tekton-mutex.dev/v1alpha1
kind: Mutex
metadata: {name: deploy}
spec: {capacity: 1}
";

/// A Role that lets the controller do everything but list and watch PipelineRuns.
const WITHOUT_PIPELINERUN_WATCH: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: limited}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: limited}
rules:
  - apiGroups: ["tekton-mutex.dev"]
    resources: ["mutexes", "mutexes/status"]
    verbs: ["get", "list", "watch", "create", "update"]
  - apiGroups: ["tekton.dev"]
    resources: ["customruns", "runs", "customruns/status", "runs/status"]
    verbs: ["get", "list", "watch", "patch"]
  - apiGroups: ["tekton.dev"]
    resources: ["pipelineruns"]
    verbs: ["get"]
  - apiGroups: [""]
    resources: ["pods"]
    verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: limited}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: limited}
subjects:
  - {kind: ServiceAccount, name: limited}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn ready_only_once_every_cache_has_synced() -> Result<()> {
    let ns = TestNamespace::create("readyz").await?;
    ns.apply(WITHOUT_PIPELINERUN_WATCH).await?;
    let kubeconfig = service_account_kubeconfig(ns.name(), "limited")?;
    let c = ControllerProcess::start_with(
        ns.name(),
        &["--http-addr", "127.0.0.1:0"],
        &[("KUBECONFIG", kubeconfig.to_str().unwrap())],
    )
    .await?;
    let addr = http_addr(&c).await?;
    // The PipelineRun watch cannot list: it retries, and the process stays alive but unready.
    wait_until("the PipelineRun watch to be refused", slow(), || async {
        let log = c.log_text();
        Ok(log
            .lines()
            .any(|l| l.contains("pipelineruns") && l.contains("forbidden"))
            .then_some(()))
    })
    .await?;
    ensure!(http_get(&addr, "/healthz")?.status == 200, "alive");
    let r = http_get(&addr, "/readyz")?;
    ensure!(
        r.status == 503,
        "ready before the PipelineRun cache synced: {}",
        r.body
    );

    ns.kubectl(&[
        "patch",
        "role",
        "limited",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/rules/2/verbs","value":["get","list","watch"]}]"#,
    ])?;
    wait_until("readyz once the watch may list", slow(), || async {
        Ok((http_get(&addr, "/readyz")?.status == 200).then_some(()))
    })
    .await?;
    Ok(())
}

/// The reasons of the Events about one object, oldest first.
fn event_reasons(ns: &TestNamespace, name: &str) -> Result<Vec<String>> {
    let out = ns.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name}"),
        "--sort-by=.metadata.creationTimestamp",
        "-o",
        r#"jsonpath={range .items[*]}{.reason}{"\n"}{end}"#,
    ])?;
    Ok(out.lines().map(String::from).collect())
}

async fn wait_events(ns: &TestNamespace, name: &str, want: &[&str]) -> Result<Vec<String>> {
    wait_until(&format!("Events {want:?} on {name}"), slow(), || async {
        let got = event_reasons(ns, name)?;
        Ok(want
            .iter()
            .all(|w| got.iter().any(|g| g == w))
            .then_some(got))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn events_tell_each_run_its_story() -> Result<()> {
    let ns = TestNamespace::create("events").await?;
    let _c = ControllerProcess::start(ns.name()).await?;
    ns.apply(&pipeline("promote", &ONE_AT_A_TIME)).await?;
    ns.apply(&pipeline_run("a", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "promote", &[])).await?;
    ns.apply(&pipeline_run("c", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("c"), "Waiting", slow()).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    // b moves up from the head to holder; c moves up to the head: Waiting stays one Event.
    drive_grants(&ns, &["a", "b", "c"], 3).await?;

    // Listed by time, with ties in any order: compare as sets, and count Waiting.
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let a = wait_events(&ns, &lock_run("a"), &["Acquired", "Released"]).await?;
    ensure!(sorted(a.clone()) == ["Acquired", "Released"], "a: {a:?}");
    let c = wait_events(&ns, &lock_run("c"), &["Waiting", "Acquired", "Released"]).await?;
    ensure!(
        sorted(c.clone()) == ["Acquired", "Released", "Waiting"],
        "c waits once, whatever its position: {c:?}"
    );
    let token = token_result(&ns, &lock_run("c")).await?;
    let note = ns.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={},reason=Acquired", lock_run("c")),
        "-o",
        "jsonpath={.items[0].message}",
    ])?;
    ensure!(
        note.contains(&format!("token {token}")) && note.contains("after waiting"),
        "Acquired note: {note}"
    );

    ns.apply(&pipeline(
        "broken",
        &Opts {
            lock_params: &[("wait", "maybe")],
            ..Default::default()
        },
    ))
    .await?;
    ns.apply(&pipeline_run("x", "broken", &[])).await?;
    wait_events(&ns, &lock_run("x"), &["InvalidParams"]).await?;
    Ok(())
}

/// Starts a replica that campaigns for a Lease in the test namespace.
async fn replica(ns: &TestNamespace) -> Result<ControllerProcess> {
    // A short Lease keeps the test quick: takeover after a crash waits for its expiry.
    ControllerProcess::start_with(
        ns.name(),
        &[
            "--http-addr",
            "127.0.0.1:0",
            "--leader-elect",
            "--lease-duration",
            "6",
            "--lease-renew-margin",
            "2",
        ],
        &[],
    )
    .await
}

async fn wait_leading(c: &ControllerProcess, which: &str) -> Result<()> {
    wait_until(&format!("{which} to lead"), slow(), || async {
        Ok(c.log_text().contains("became the leader").then_some(()))
    })
    .await
}

async fn wait_ready(c: &ControllerProcess, which: &str) -> Result<()> {
    let addr = http_addr(c).await?;
    wait_until(&format!("{which} to be ready"), slow(), || async {
        Ok((http_get(&addr, "/readyz")?.status == 200).then_some(()))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_standby_takes_over_when_the_leader_dies() -> Result<()> {
    let ns = TestNamespace::create("failover").await?;
    let mut first = replica(&ns).await?;
    wait_leading(&first, "the first replica").await?;
    let second = replica(&ns).await?;
    wait_ready(&second, "the standby").await?;
    ensure!(
        !second.log_text().contains("became the leader"),
        "two leaders"
    );

    ns.apply(&pipeline("promote", &ONE_AT_A_TIME)).await?;
    ns.apply(&pipeline_run("a", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    ensure!(!second.log_text().contains("granted"), "the standby acted");

    // Kill the leader mid-queue; then a finishes while nobody leads.
    first.kill();
    let killed = Instant::now();
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    println!(
        "takeover after the leader was killed (6 s Lease): b granted {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    let log = second.log_text();
    ensure!(
        log.contains("became the leader")
            && log
                .lines()
                .any(|l| l.contains("granted") && l.contains("holder=\"b\"")),
        "the standby did not grant b:\n{log}"
    );

    // A clean shutdown hands the Lease over at once, not at its expiry.
    let third = replica(&ns).await?;
    wait_ready(&third, "the new standby").await?;
    second.terminate()?;
    let terminated = Instant::now();
    wait_leading(&third, "the new standby").await?;
    println!(
        "takeover after a clean shutdown: {:.1} s",
        terminated.elapsed().as_secs_f64()
    );
    ensure!(
        second.log_text().contains("released the Lease"),
        "{}",
        second.log_text()
    );
    release(&ns, "b").await?;
    Ok(())
}
