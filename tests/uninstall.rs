//! The README's uninstall while a producer keeps creating runs (issue 46): the lock CRDs are
//! deleted with the controller still running. Every lock drains its holders and goes, nothing is
//! left Terminating, and every run that arrives meanwhile ends with a clear reason (or, queued
//! as a whole, is told so and stays unstarted), never a wait for a lock that cannot come back.
//! It deletes the cluster's lock CRDs, so it is a test binary of its own (cargo runs one binary
//! at a time), and it puts them back when it ends, whatever happens.

mod support;

use anyhow::{Result, ensure};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::*;

const CRDS: [&str; 2] = [
    "clustermutexes.tekton-mutex.dev",
    "mutexes.tekton-mutex.dev",
];
const KEY: &str = "env";

/// Puts the lock CRDs back when the test ends: a lock left with a finalizer (the test failed)
/// loses it, so the deletion can finish, then config/300-crd.yaml is applied again.
struct CrdsBack;

impl Drop for CrdsBack {
    fn drop(&mut self) {
        for kind in ["mutexes", "clustermutexes"] {
            let each = "jsonpath={range .items[*]}{.metadata.namespace}/{.metadata.name} {end}";
            let names = kubectl(&["get", kind, "-A", "-o", each]).unwrap_or_default();
            for id in names.split_whitespace() {
                let (ns, name) = id.split_once('/').unwrap_or(("", id));
                let unfinalized = r#"{"metadata":{"finalizers":null}}"#;
                let mut args = vec!["patch", kind, name, "--type=merge", "-p", unfinalized];
                if !ns.is_empty() {
                    args.extend(["-n", ns]);
                }
                let _ = kubectl(&args);
            }
        }
        let gone: Vec<String> = CRDS.iter().map(|c| format!("crd/{c}")).collect();
        let mut wait = vec!["wait", "--for=delete", "--timeout=120s"];
        wait.extend(gone.iter().map(String::as_str));
        let _ = kubectl(&wait);
        let crd = repo_root().join("config/300-crd.yaml");
        let established = ["wait", "--for=condition=Established", "--timeout=60s"];
        let mut wait = established.to_vec();
        wait.extend(gone.iter().map(String::as_str));
        let back = kubectl(&["apply", "-f", &crd.to_string_lossy()]).and_then(|_| kubectl(&wait));
        if let Err(e) = back {
            eprintln!("could not put the lock CRDs back: {e:#}");
        }
    }
}

/// A producer as a Trigger is: a run every half second, each released as soon as it holds
/// (its gate is created with it), every third one a PipelineRun queued as a whole. `made`
/// counts the runs created so far.
fn produce(
    ns: Arc<TestNamespace>,
    made: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<()>> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
        while !stop.load(Ordering::SeqCst) {
            tick.tick().await;
            let n = made.load(Ordering::SeqCst);
            let name = format!("t{n}");
            release(&ns, &name).await?;
            let run = match n % 3 {
                2 => queued(&name),
                _ => pipeline_run(&name, "deploy", &[]),
            };
            ns.apply(&run).await?;
            made.store(n + 1, Ordering::SeqCst);
        }
        Ok(())
    })
}

/// A PipelineRun of `deploy`, created Pending with the key annotation (its lock task re-enters).
fn queued(name: &str) -> String {
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "annotations":
            {"tekton-mutex.dev/key": KEY, "tekton-mutex.dev/supersede": "none"}},
        "spec": {"status": "PipelineRunPending", "pipelineRef": {"name": "deploy"}},
    })
    .to_string()
}

fn crds_gone() -> Result<bool> {
    let mut args = vec!["get", "crd", "--ignore-not-found", "-o", "name"];
    args.extend(CRDS);
    Ok(kubectl(&args)?.trim().is_empty())
}

/// How PipelineRun `name` ended: its condition and its lock run's reason, or, unstarted, what
/// it was told; `None` while it still runs or waits unsaid.
async fn ending(ns: &TestNamespace, name: &str) -> Result<Option<String>> {
    let pr = ns
        .dynamic("tekton.dev/v1", "PipelineRun")
        .await?
        .get(name)
        .await?;
    if let Some(c) = condition(&pr, "Succeeded").filter(|c| c.status != "Unknown") {
        let lock = ns
            .get_opt("tekton.dev/v1beta1", "CustomRun", &lock_run(name))
            .await?;
        let said = lock
            .and_then(|l| condition(&l, "Succeeded"))
            .map(|l| l.reason);
        return Ok(Some(format!("{} {}, lock {said:?}", c.status, c.reason)));
    }
    let error = pr
        .metadata
        .annotations
        .unwrap_or_default()
        .remove("tekton-mutex.dev/error");
    Ok(error
        .filter(|e| e.contains("being uninstalled"))
        .map(|e| format!("Pending, said: {e}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn the_uninstall_ends_with_nothing_terminating_while_runs_keep_arriving() -> Result<()> {
    let ns = Arc::new(TestNamespace::create("uninstall-busy").await?);
    let controller = ControllerProcess::start(ns.name()).await?;
    let _back = CrdsBack;
    let opts = Opts {
        lock_params: &[("key", KEY), ("supersede", "none")],
        ..Default::default()
    };
    ns.apply(&pipeline("deploy", &opts)).await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    let (made, stop) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let producer = produce(ns.clone(), made.clone(), stop.clone());
    wait_reason(&ns, &lock_run("t0"), "Waiting", slow()).await?;
    // The README's uninstall, step 2 (no selector policy is installed here): the lock CRDs go
    // while the controller runs; the holder ends meanwhile, and runs keep arriving.
    let mut delete = vec!["delete", "crd", "--wait=false"];
    delete.extend(CRDS);
    kubectl(&delete)?;
    release(&ns, "a").await?;
    let gone = || async { Ok(crds_gone()?.then_some(())) };
    wait_until("the lock CRDs to be gone", slow(), gone).await?;
    // A few more arrive after; then every run made while the controller ran has ended or been
    // told (the README's step 3 then removes the controller).
    let after = made.load(Ordering::SeqCst) + 3;
    wait_until("three more runs", slow(), || async {
        Ok((made.load(Ordering::SeqCst) >= after).then_some(()))
    })
    .await?;
    stop.store(true, Ordering::SeqCst);
    producer.await??;
    let mut endings = vec![ending_of(&ns, "a").await?];
    for n in 0..made.load(Ordering::SeqCst) {
        endings.push(ending_of(&ns, &format!("t{n}")).await?);
    }
    drop(controller);
    let uninstalled = endings
        .iter()
        .filter(|e| e.contains("LockDeleted") || e.contains("uninstalled"));
    ensure!(
        uninstalled.count() >= 3,
        "too few runs told of the uninstall: {endings:#?}"
    );
    Ok(())
}

async fn ending_of(ns: &TestNamespace, name: &str) -> Result<String> {
    let said = wait_until(&format!("{name} to end or be told"), slow(), || {
        ending(ns, name)
    })
    .await;
    Ok(format!("{name}: {}", said?))
}
