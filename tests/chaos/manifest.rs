//! The PipelineRuns of a round: the Mutex first (unless unguarded), then a deploy step that
//! records its own start and end as ConfigMaps, the checker's evidence.

use super::plan::{RoundPlan, RunPlan};
use serde_json::{Value, json};

/// Label on every mark ConfigMap; its value is `start` or `end`.
pub const MARK_LABEL: &str = "chaos.tekton-mutex.dev/mark";
/// Annotation a campaign "user" sets with its cancel, so the admission fault lets it through.
pub const USER_ANNOTATION: &str = "chaos.tekton-mutex.dev/user";

/// The deploy: marks its start, works, marks its end. On SIGTERM (a kubelet stopping its pod)
/// it keeps working `term-s` seconds, like a deploy finishing its apply, then marks its end.
/// Each mark carries the step's own clock and is retried while the API server is away.
const DEPLOY_SCRIPT: &str = r#"#!/bin/sh
NS="$(params.ns)"; PR="$(params.pr)"
mark() {
  now=$(date +%s%3N)
  body=$(printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"mark-%s-%s","labels":{"chaos.tekton-mutex.dev/mark":"%s"}},"data":{"pr":"%s","key":"%s","group":"%s","seq":"%s","token":"%s","ms":"%s","how":"%s"}}' \
    "$PR" "$1" "$1" "$PR" "$(params.key)" "$(params.group)" "$(params.seq)" "$(params.token)" "$now" "$2")
  i=0
  until echo "$body" | kubectl -n "$NS" apply -f - >/dev/null 2>&1; do
    i=$((i+1)); [ "$i" -lt 200 ] || return 0
    sleep 0.3 # retry while the API server restarts
  done
}
on_term() {
  trap '' TERM
  sleep "$(params.term-s)"
  mark end term
  exit 143
}
trap on_term TERM
mark start work
echo "deploying with token $(params.token)"
sleep "$(params.work-s)" &
wait $!
mark end ok
"#;

fn secs(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

fn param(name: &str, value: impl Into<String>) -> Value {
    json!({"name": name, "value": value.into()})
}

fn lock_task(plan: &RoundPlan, run: &RunPlan) -> Value {
    let group = &plan.groups[run.group];
    let mut params = vec![
        param("key", &plan.key_of(run).name),
        param("group", &group.name),
        param("supersede", group.supersede.as_str()),
        param("cancel-mode", run.cancel_mode),
    ];
    if let Some(s) = run.sequence {
        params.push(param("sequence", s.to_string()));
    }
    if run.priority != 0 {
        params.push(param("priority", run.priority.to_string()));
    }
    if !run.wait {
        params.push(param("wait", "false"));
    }
    let mut lock = json!({
        "name": "lock",
        "taskRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
        "params": params,
    });
    if let Some(t) = run.lock_timeout_s {
        lock["timeout"] = json!(format!("{t}s"));
    }
    if run.retries > 0 {
        lock["retries"] = json!(run.retries);
    }
    lock
}

fn deploy_task(plan: &RoundPlan, run: &RunPlan) -> Value {
    let token = if plan.unguarded {
        "0".to_string()
    } else {
        "$(tasks.lock.results.token)".to_string()
    };
    let names = [
        "token", "ns", "pr", "key", "group", "seq", "work-s", "term-s",
    ];
    let mut deploy = json!({
        "name": "deploy",
        "params": [
            param("token", token),
            param("ns", "$(context.pipelineRun.namespace)"),
            param("pr", "$(context.pipelineRun.name)"),
            param("key", &plan.key_of(run).name),
            param("group", &plan.groups[run.group].name),
            param("seq", run.sequence.map(|s| s.to_string()).unwrap_or_default()),
            param("work-s", secs(run.deploy_ms)),
            param("term-s", secs(run.term_extra_ms)),
        ],
        "taskSpec": {
            "params": names.iter().map(|n| json!({"name": n})).collect::<Vec<_>>(),
            "steps": [{"name": "deploy", "image": "busybox", "script": DEPLOY_SCRIPT}],
        },
    });
    if !plan.unguarded {
        deploy["runAfter"] = json!(["lock"]);
        if !run.wait {
            deploy["when"] = json!([{
                "input": "$(tasks.lock.results.acquired)", "operator": "in", "values": ["true"],
            }]);
        }
    }
    deploy
}

/// The PipelineRun of `run`, with an embedded pipeline.
pub fn pipeline_run(plan: &RoundPlan, run: &RunPlan) -> Value {
    let mut tasks = vec![];
    if !plan.unguarded {
        tasks.push(lock_task(plan, run));
    }
    tasks.push(deploy_task(plan, run));
    let mut pr = json!({
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {
            "name": run.name,
            "labels": {"chaos.tekton-mutex.dev/seed": plan.seed.to_string()},
        },
        "spec": {"pipelineSpec": {"tasks": tasks}},
    });
    if let Some(t) = run.pipeline_timeout_s {
        pr["spec"]["timeouts"] = json!({"pipeline": format!("{t}s")});
    }
    pr
}

/// The Mutex objects of a round, made ahead with their capacity.
pub fn mutexes(plan: &RoundPlan) -> Vec<Value> {
    plan.keys
        .iter()
        .map(|k| {
            json!({
                "apiVersion": "tekton-mutex.dev/v1alpha1",
                "kind": "Mutex",
                "metadata": {"name": k.name},
                "spec": {"capacity": k.capacity},
            })
        })
        .collect()
}

/// A ValidatingAdmissionPolicy (and its binding) that denies any change of a PipelineRun's
/// `spec.status` in `ns` (the controller's cancel patches), except a campaign user's.
pub fn deny_policy(ns: &str) -> (Value, Value) {
    let name = format!("chaos-deny-cancel-{ns}");
    let expression = format!(
        "!has(object.spec.status) || (has(oldObject.spec.status) && \
         oldObject.spec.status == object.spec.status) || \
         (has(object.metadata.annotations) && '{USER_ANNOTATION}' in object.metadata.annotations)"
    );
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["tekton.dev"], "apiVersions": ["*"],
                "operations": ["UPDATE"], "resources": ["pipelineruns"],
            }]},
            "validations": [{"expression": expression, "message": "chaos: PipelineRun cancels are denied for a while"}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    });
    (policy, binding)
}
