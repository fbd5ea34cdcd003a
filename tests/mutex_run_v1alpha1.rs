//! The older protocol: Run (tekton.dev/v1alpha1), as Tekton before v0.47 sent it.
//! Its CRD comes from an older Tekton module; the Runs are created directly.

mod support;

use anyhow::{Result, ensure};
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::controller::{ControllerProcess, install_run_crd};
use support::*;
use tekton_mutex::model::tekton::run::Run;

fn run(name: &str, spec: serde_json::Value) -> String {
    json!({"apiVersion": "tekton.dev/v1alpha1", "kind": "Run", "metadata": {"name": name}, "spec": spec}).to_string()
}

async fn wait_run_reason(
    ns: &TestNamespace,
    name: &str,
    reason: &str,
) -> Result<tekton_mutex::model::tekton::Condition> {
    let api = ns.api::<Run>();
    wait_until(&format!("Run {name} to be {reason}"), secs(30), || {
        let api = api.clone();
        async move {
            let cond = api
                .get_opt(name)
                .await?
                .and_then(|r| r.status)
                .and_then(|s| s.succeeded().cloned());
            Ok(cond.filter(|c| c.reason.as_deref() == Some(reason)))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn runs_get_the_same_semantics() -> Result<()> {
    install_run_crd().await?;
    let ns = TestNamespace::create("run-v1alpha1").await?;
    // Started after the Run CRD exists, so it watches Runs too.
    let _c = ControllerProcess::start(ns.name()).await?;
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    let params = json!([{"name": "key", "value": "env"}]);

    ns.apply(&run("r1", json!({"ref": mutex, "params": params})))
        .await?;
    let c = wait_run_reason(&ns, "r1", "Acquired").await?;
    ensure!(c.status == "True", "{c:?}");
    let r1 = ns.api::<Run>().get("r1").await?.status.unwrap_or_default();
    let t1: Option<i64> = r1.result("token").and_then(|t| t.parse().ok());
    ensure!(
        t1.is_some_and(|t| t >= 1) && r1.result("key") == Some("env"),
        "results: {r1:?}"
    );

    ns.apply(&run("r2", json!({"ref": mutex, "params": params})))
        .await?;
    ns.apply(&run("r3", json!({"ref": mutex, "params": params})))
        .await?;
    ns.apply(&run(
        "r4",
        json!({"ref": mutex, "params": params, "timeout": "1s"}),
    ))
    .await?;
    let c = wait_run_reason(&ns, "r2", "Waiting").await?;
    ensure!(
        c.message
            .as_deref()
            .is_some_and(|m| m == "waiting for env: next in line, held by r1"),
        "{c:?}"
    );

    // Cancel, as Tekton does: spec.status RunCancelled.
    let cancel = json!({"spec": {"status": "RunCancelled"}});
    ns.api::<Run>()
        .patch("r3", &PatchParams::default(), &Patch::Merge(&cancel))
        .await?;
    let c = wait_run_reason(&ns, "r3", "RunCancelled").await?;
    ensure!(c.status == "False", "{c:?}");
    let c = wait_run_reason(&ns, "r4", "RunTimedOut").await?;
    ensure!(c.status == "False", "{c:?}");

    // An embedded spec is read too; bad input is refused the same way.
    ns.apply(&run(
        "bad",
        json!({"ref": mutex, "params": [{"name": "wait", "value": "maybe"}]}),
    ))
    .await?;
    let c = wait_run_reason(&ns, "bad", "InvalidParams").await?;
    ensure!(
        c.message
            .as_deref()
            .is_some_and(|m| m.contains("allowed values are true, false")),
        "{c:?}"
    );

    ns.api::<Run>()
        .delete("r1", &DeleteParams::default())
        .await?;
    wait_run_reason(&ns, "r2", "Acquired").await?;
    let r2 = ns.api::<Run>().get("r2").await?.status.unwrap_or_default();
    let t2: Option<i64> = r2.result("token").and_then(|t| t.parse().ok());
    ensure!(t2 > t1, "the next token, above {t1:?}: {r2:?}");
    Ok(())
}
