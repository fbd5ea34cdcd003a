//! Pipelines and PipelineRuns for Mutex tests, as YAML.
//!
//! The deploy step blocks until the test creates a "gate" ConfigMap, so a test
//! decides exactly when each holder finishes: no timing guesses.

use super::{TestNamespace, secs, wait_until};
use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;
use tekton_mutex::model::mutex::{Mutex, MutexStatus};
use tekton_mutex::model::tekton::Condition;
use tekton_mutex::model::tekton::customrun::CustomRun;
use tekton_mutex::model::tekton::pipelinerun::PipelineRun;

/// Extra settings for [`pipeline`].
#[derive(Default, Clone)]
pub struct Opts<'a> {
    /// Params of the lock task.
    pub lock_params: &'a [(&'a str, &'a str)],
    /// `timeout` of the lock pipeline task (becomes the CustomRun's spec.timeout).
    pub lock_timeout: Option<&'a str>,
    /// `retries` of the lock pipeline task.
    pub lock_retries: Option<u32>,
    /// A finally task that also waits for its own gate (`finally-<pipelinerun>`).
    pub finally: bool,
    /// Reference a Mutex object by name.
    pub mutex_name: Option<&'a str>,
    /// Reference this ClusterMutex instead of a Mutex.
    pub cluster_mutex: Option<&'a str>,
    /// Skip deploy unless the lock result `acquired` is "true" (for `wait: "false"`).
    pub when_acquired: bool,
}

/// A Pipeline: `lock` (the Mutex), then `deploy`, which waits for the gate
/// ConfigMap `release-<pipelinerun>` and exits with param `exit-code`.
pub fn pipeline(name: &str, o: &Opts) -> String {
    let lock_params: Vec<_> = o
        .lock_params
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mut task_ref = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    if let Some(m) = o.mutex_name {
        task_ref["name"] = json!(m);
    }
    if let Some(c) = o.cluster_mutex {
        task_ref =
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": c});
    }
    let mut lock = json!({"name": "lock", "taskRef": task_ref, "params": lock_params});
    if let Some(t) = o.lock_timeout {
        lock["timeout"] = json!(t);
    }
    if let Some(r) = o.lock_retries {
        lock["retries"] = json!(r);
    }
    let gate_step = |gate: &str, extra: &str| {
        json!({
            "name": "run",
            "image": "busybox",
            "script": format!(
                "set -e\nkubectl -n \"$(params.ns)\" wait --for=create \"configmap/{gate}\" --timeout=600s >/dev/null\n{extra}\n"
            ),
        })
    };
    let deploy = json!({
        "name": "deploy",
        "runAfter": ["lock"],
        "params": [
            {"name": "token", "value": "$(tasks.lock.results.token)"},
            {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
            {"name": "pr", "value": "$(context.pipelineRun.name)"},
            {"name": "exit-code", "value": "$(params.exit-code)"},
        ],
        "taskSpec": {
            "params": [{"name": "token"}, {"name": "ns"}, {"name": "pr"}, {"name": "exit-code"}],
            "steps": [gate_step("release-$(params.pr)", "echo \"deployed with token $(params.token)\"\nexit $(params.exit-code)")],
        },
    });
    let mut deploy = deploy;
    if o.when_acquired {
        deploy["when"] = json!([{"input": "$(tasks.lock.results.acquired)", "operator": "in", "values": ["true"]}]);
    }
    let mut spec = json!({
        "params": [{"name": "exit-code", "default": "0"}],
        "tasks": [lock, deploy],
    });
    if o.finally {
        spec["finally"] = json!([{
            "name": "cleanup",
            "params": [
                {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
                {"name": "pr", "value": "$(context.pipelineRun.name)"},
            ],
            "taskSpec": {
                "params": [{"name": "ns"}, {"name": "pr"}],
                "steps": [gate_step("finally-$(params.pr)", "kubectl -n \"$(params.ns)\" create configmap \"finally-ran-$(params.pr)\"")],
            },
        }]);
    }
    json!({"apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name}, "spec": spec}).to_string()
}

/// A PipelineRun of `pipeline` named `name`.
pub fn pipeline_run(name: &str, pipeline: &str, params: &[(&str, &str)]) -> String {
    let params: Vec<_> = params
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    json!({
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name},
        "spec": {"pipelineRef": {"name": pipeline}, "params": params},
    })
    .to_string()
}

/// Let PipelineRun `pr`'s deploy step finish.
pub async fn release(ns: &TestNamespace, pr: &str) -> Result<()> {
    create_gate(ns, &format!("release-{pr}")).await
}

/// Let PipelineRun `pr`'s finally task finish.
pub async fn release_finally(ns: &TestNamespace, pr: &str) -> Result<()> {
    create_gate(ns, &format!("finally-{pr}")).await
}

/// Open gate `name`: create its ConfigMap (one already there is fine).
pub async fn create_gate(ns: &TestNamespace, name: &str) -> Result<()> {
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match ns
        .api::<ConfigMap>()
        .create(&PostParams::default(), &cm)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The lock CustomRun Tekton creates for PipelineRun `pr`.
pub fn lock_run(pr: &str) -> String {
    format!("{pr}-lock")
}

/// Waits until CustomRun `name`'s Succeeded condition has `reason`; returns the condition.
pub async fn wait_reason(
    ns: &TestNamespace,
    name: &str,
    reason: &str,
    timeout: Duration,
) -> Result<Condition> {
    let api = ns.api::<CustomRun>();
    wait_until(&format!("CustomRun {name} to be {reason}"), timeout, || {
        let api = api.clone();
        async move {
            let Some(cr) = api.get_opt(name).await? else {
                return Ok(None);
            };
            let cond = cr.status.and_then(|s| s.succeeded().cloned());
            Ok(cond.filter(|c| c.reason.as_deref() == Some(reason)))
        }
    })
    .await
}

/// Waits until CustomRun `name` has been told anything (its Succeeded condition has a reason);
/// returns the condition. For a test that must fail fast when the first word is the wrong one.
pub async fn wait_told(ns: &TestNamespace, name: &str, timeout: Duration) -> Result<Condition> {
    wait_until(&format!("CustomRun {name} to be told"), timeout, || async {
        Ok(condition_of(ns, name).await?.filter(|c| c.reason.is_some()))
    })
    .await
}

/// Waits until CustomRun `name` ends superseded: `Succeeded=False`, reason
/// `CustomRunCancelled` (so its PipelineRun ends Cancelled), and a message that
/// starts with `Superseded:`. Returns the condition.
pub async fn wait_superseded(ns: &TestNamespace, name: &str) -> Result<Condition> {
    let c = wait_reason(ns, name, "CustomRunCancelled", slow()).await?;
    anyhow::ensure!(
        c.status == "False"
            && c.message
                .as_deref()
                .is_some_and(|m| m.starts_with("Superseded: newer PipelineRun ")),
        "{name} was cancelled, not superseded: {c:?}"
    );
    Ok(c)
}

/// The Succeeded condition of CustomRun `name`, if any.
pub async fn condition_of(ns: &TestNamespace, name: &str) -> Result<Option<Condition>> {
    Ok(ns
        .api::<CustomRun>()
        .get_opt(name)
        .await?
        .and_then(|cr| cr.status)
        .and_then(|s| s.succeeded().cloned()))
}

/// A result of CustomRun `name`.
pub async fn result_of(ns: &TestNamespace, name: &str, result: &str) -> Result<Option<String>> {
    Ok(ns
        .api::<CustomRun>()
        .get_opt(name)
        .await?
        .and_then(|cr| cr.status)
        .and_then(|s| s.result(result).map(String::from)))
}

/// The `token` result of CustomRun `name`, as the integer it is.
pub async fn token_result(ns: &TestNamespace, name: &str) -> Result<i64> {
    let token = result_of(ns, name, "token").await?;
    token
        .as_deref()
        .and_then(|t| t.parse().ok())
        .with_context(|| format!("{name}'s token result: {token:?}"))
}

/// A generous bound for anything that involves Tekton starting pods.
pub fn slow() -> Duration {
    secs(120)
}

/// The status of Mutex `key` (empty while it does not exist yet).
pub async fn mutex_status(ns: &TestNamespace, key: &str) -> Result<MutexStatus> {
    Ok(ns
        .api::<Mutex>()
        .get_opt(key)
        .await?
        .and_then(|m| m.status)
        .unwrap_or_default())
}

/// Lets whichever of `prs` acquires next finish, `n` times; returns the grant order.
pub async fn drive_grants<S: AsRef<str>>(
    ns: &TestNamespace,
    prs: &[S],
    n: usize,
) -> Result<Vec<String>> {
    let mut order: Vec<String> = Vec::new();
    for _ in 0..n {
        let next = wait_until("the next grant", slow(), || {
            let order = &order;
            async move {
                for pr in prs
                    .iter()
                    .map(AsRef::as_ref)
                    .filter(|p| !order.iter().any(|o| o == p))
                {
                    if condition_of(ns, &lock_run(pr))
                        .await?
                        .and_then(|c| c.reason)
                        .as_deref()
                        == Some("Acquired")
                    {
                        return Ok(Some(pr.to_string()));
                    }
                }
                Ok(None)
            }
        })
        .await?;
        release(ns, &next).await?;
        order.push(next);
    }
    Ok(order)
}

/// Asks PipelineRun `pr` to stop with `mode`, as `tkn pipelinerun cancel` does.
pub async fn cancel_pipeline_run(ns: &TestNamespace, pr: &str, mode: &str) -> Result<()> {
    let patch = json!({"spec": {"status": mode}});
    ns.api::<PipelineRun>()
        .patch(pr, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Waits until Tekton has recorded TaskRun `taskrun`'s pod in its status. Tekton deletes a
/// cancelled TaskRun's pod only if its status names the pod; cancelled earlier, the pod is
/// orphaned and runs on, and rightly keeps the slot.
pub async fn wait_pod_recorded(ns: &TestNamespace, taskrun: &str) -> Result<()> {
    let what = format!("Tekton to record {taskrun}'s pod");
    wait_until(&what, slow(), || async {
        let pod = ns.kubectl(&[
            "get",
            "taskrun",
            taskrun,
            "-o",
            "jsonpath={.status.podName}",
        ]);
        Ok(pod.ok().filter(|p| !p.trim().is_empty()))
    })
    .await?;
    Ok(())
}

/// The host-clock time (ns) in mark `what` of PipelineRun `pr` (ConfigMap `<what>-<pr>`, key
/// `at`), once it exists.
pub async fn mark(ns: &TestNamespace, what: &str, pr: &str) -> Result<i128> {
    let name = format!("{what}-{pr}");
    let cm = wait_until(&format!("mark {name}"), slow(), || async {
        Ok(ns.api::<ConfigMap>().get_opt(&name).await?)
    })
    .await?;
    let at = cm
        .data
        .and_then(|d| d.get("at").cloned())
        .unwrap_or_default();
    at.parse()
        .with_context(|| format!("mark {name} has no time: {at:?}"))
}

/// Has PipelineRun `pr` written mark `what` yet?
pub async fn mark_exists(ns: &TestNamespace, what: &str, pr: &str) -> Result<bool> {
    let name = format!("{what}-{pr}");
    Ok(ns.api::<ConfigMap>().get_opt(&name).await?.is_some())
}

/// Waits until PipelineRun `pr` is done, and fails unless it succeeded.
pub async fn succeeded(ns: &TestNamespace, pr: &str) -> Result<()> {
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", pr, slow())
        .await?;
    ensure!(c.status == "True", "{pr} did not succeed: {c:?}");
    Ok(())
}

/// A Pipeline with no lock task: one task that waits for the gate `release-<pipelinerun>`.
pub fn gated_pipeline(name: &str) -> String {
    let gate = "set -e\nkubectl -n \"$(params.ns)\" wait --for=create \"configmap/release-$(params.pr)\" --timeout=600s >/dev/null\n";
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name},
        "spec": {"tasks": [{
            "name": "deploy",
            "params": [
                {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
                {"name": "pr", "value": "$(context.pipelineRun.name)"},
            ],
            "taskSpec": {
                "params": [{"name": "ns"}, {"name": "pr"}],
                "steps": [{"name": "run", "image": "busybox", "script": gate}],
            },
        }]},
    })
    .to_string()
}
