//! What the benchmark creates: the Mutex pipeline, the polling-lease pipeline, standalone Mutex
//! CustomRuns, and finished history (PipelineRuns and CustomRuns with a final status).

use serde_json::{Value, json};

/// The deploy step: it only appends its start and end times (ns since the epoch) to `marks`, a
/// file on this host (the pod-runner runs steps here), so the idle gap is measured at the step.
fn deploy_task(run_after: &str, marks: &str) -> Value {
    json!({
        "name": "deploy",
        "runAfter": [run_after],
        "params": [{"name": "pr", "value": "$(context.pipelineRun.name)"}],
        "taskSpec": {
            "params": [{"name": "pr"}],
            "steps": [{
                "name": "deploy",
                "image": "busybox",
                "script": format!(
                    "echo \"$(params.pr) start `date +%s%N`\" >> {marks}\n\
                     echo \"$(params.pr) end `date +%s%N`\" >> {marks}\n"
                ),
            }],
        },
    })
}

/// `lock` (a Mutex on `key`, a plain queue), then `deploy`.
pub fn mutex_pipeline(name: &str, key: &str, marks: &str) -> String {
    let lock = json!({
        "name": "lock",
        "taskRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
        "params": [{"name": "key", "value": key}, {"name": "supersede", "value": "none"}],
    });
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name},
        "spec": {"tasks": [lock, deploy_task("lock", marks)]},
    })
    .to_string()
}

/// Name of the Lease the polling pattern takes.
pub const LEASE: &str = "bench-deploy-lock";

/// The polling-lease pattern: `acquire` loops "create the Lease, or wait until it is deleted",
/// `deploy`, then a finally task `release` deletes the Lease. Waiters each hold a pod.
pub fn lease_pipeline(name: &str, marks: &str) -> String {
    let acquire_script = format!(
        "until kubectl -n \"$(params.ns)\" create -f - >/dev/null 2>&1 <<EOF\n\
         apiVersion: coordination.k8s.io/v1\n\
         kind: Lease\n\
         metadata:\n  name: {LEASE}\n\
         spec:\n  holderIdentity: $(params.pr)\n\
         EOF\n\
         do\n  kubectl -n \"$(params.ns)\" wait --for=delete lease/{LEASE} --timeout=3600s >/dev/null 2>&1 || true\n\
         done\n"
    );
    let ns_pr = json!([
        {"name": "ns", "value": "$(context.pipelineRun.namespace)"},
        {"name": "pr", "value": "$(context.pipelineRun.name)"},
    ]);
    let step = |name: &str, script: String| {
        json!({
            "params": [{"name": "ns"}, {"name": "pr"}],
            "steps": [{"name": name, "image": "bitnami/kubectl", "script": script}],
        })
    };
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "Pipeline", "metadata": {"name": name},
        "spec": {
            "tasks": [
                {"name": "acquire", "params": ns_pr, "taskSpec": step("acquire", acquire_script)},
                deploy_task("acquire", marks),
            ],
            "finally": [{
                "name": "release", "params": ns_pr,
                "taskSpec": step("release", format!(
                    "kubectl -n \"$(params.ns)\" delete lease {LEASE} --ignore-not-found >/dev/null\n"
                )),
            }],
        },
    })
    .to_string()
}

/// A PipelineRun of `pipeline`.
pub fn pipeline_run(name: &str, pipeline: &str) -> Value {
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "metadata": {"name": name},
        "spec": {"pipelineRef": {"name": pipeline}},
    })
}

/// A standalone Mutex CustomRun on `key` (holds until deleted), a plain queue.
pub fn standalone_run(name: &str, key: &str) -> Value {
    json!({
        "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun", "metadata": {"name": name},
        "spec": {
            "customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
            "params": [{"name": "key", "value": key}, {"name": "supersede", "value": "none"}],
        },
    })
}

/// A pipeline spec of a realistic size, as Tekton copies it into a PipelineRun's status.
fn history_pipeline_spec() -> Value {
    let task = |i: usize| {
        json!({
            "name": format!("step-{i}"),
            "runAfter": if i == 0 { json!(["lock"]) } else { json!([format!("step-{}", i - 1)]) },
            "params": [{"name": "version", "value": "$(params.version)"}],
            "taskSpec": {
                "params": [{"name": "version", "type": "string"}],
                "steps": [{
                    "name": "run", "image": "registry.example/deployer:1.2.3",
                    "script": "#!/bin/sh\nset -e\necho deploying $(params.version)\nkubectl apply -f manifests/ --prune -l app=demo\n",
                    "resources": {}, "env": [{"name": "ENV", "value": "staging"}],
                }],
            },
        })
    };
    let mut tasks = vec![json!({
        "name": "lock",
        "taskRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
        "params": [{"name": "key", "value": "$(params.key)"}, {"name": "sequence", "value": "$(params.version)"}],
    })];
    tasks.extend((0..3).map(task));
    json!({"params": [{"name": "version", "type": "string"}, {"name": "key", "type": "string"}], "tasks": tasks})
}

/// A finished PipelineRun, created Pending (so Tekton does not start it); `history_status`
/// then makes it done.
pub fn history_pipeline_run(name: &str, key: &str, version: usize) -> Value {
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "labels": {"tekton.dev/pipeline": "promote", "app": "demo"}},
        "spec": {
            "status": "PipelineRunPending",
            "params": [{"name": "version", "value": version.to_string()}, {"name": "key", "value": key}],
            "pipelineSpec": history_pipeline_spec(),
            "taskRunTemplate": {"serviceAccountName": "default"},
            "timeouts": {"pipeline": "1h0m0s"},
        },
    })
}

/// The status of a PipelineRun that succeeded a while ago.
pub fn history_pipeline_run_status(name: &str) -> Value {
    let child = |task: &str| json!({"apiVersion": "tekton.dev/v1", "kind": "TaskRun", "name": format!("{name}-{task}"), "pipelineTaskName": task});
    json!({"status": {
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Succeeded",
            "message": "Tasks Completed: 4 (Failed: 0, Cancelled 0), Skipped: 0",
            "lastTransitionTime": "2026-01-01T00:05:00Z"}],
        "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:05:00Z",
        "pipelineSpec": history_pipeline_spec(),
        "childReferences": [
            {"apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun", "name": format!("{name}-lock"), "pipelineTaskName": "lock"},
            child("step-0"), child("step-1"), child("step-2"),
        ],
        "provenance": {"featureFlags": {"enableAPIFields": "beta", "resultExtractionMethod": "termination-message"}},
    }})
}

/// A finished lock CustomRun of PipelineRun `pr` (labelled as Tekton labels its children).
pub fn history_custom_run(pr: &str, key: &str, version: usize) -> Value {
    json!({
        "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
        "metadata": {"name": format!("{pr}-lock"), "labels": {
            "tekton.dev/pipelineRun": pr, "tekton.dev/pipelineTask": "lock",
            "tekton.dev/pipeline": "promote", "app": "demo",
        }},
        "spec": {
            "customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
            "params": [{"name": "key", "value": key}, {"name": "sequence", "value": version.to_string()}],
            "serviceAccountName": "default", "timeout": "1h0m0s",
        },
    })
}

pub fn history_custom_run_status(key: &str, token: usize) -> Value {
    json!({"status": {
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired",
            "message": format!("acquired {key} with token {token}"),
            "lastTransitionTime": "2026-01-01T00:00:01Z"}],
        "startTime": "2026-01-01T00:00:00Z", "completionTime": "2026-01-01T00:00:01Z",
        "results": [
            {"name": "acquired", "value": "true"}, {"name": "key", "value": key},
            {"name": "token", "value": token.to_string()}, {"name": "waited-seconds", "value": "0"},
        ],
    }})
}
