//! The PipelineRuns of a round: the Mutex first (unless unguarded), then a deploy step that
//! records its own start and end as ConfigMaps, the checker's evidence.

use super::plan::{RoundPlan, RunPlan, SELECTED_GROUP, Shape};
use serde_json::{Value, json};

/// Label on every mark ConfigMap; its value is `start` or `end`.
pub const MARK_LABEL: &str = "chaos.tekton-mutex.dev/mark";
/// Annotation a campaign "user" sets with its cancel, so the admission fault lets it through.
pub const USER_ANNOTATION: &str = "chaos.tekton-mutex.dev/user";

/// The deploy: marks its start, works, marks its end. On SIGTERM (a kubelet stopping its pod)
/// it keeps working `term-s` seconds, like a deploy finishing its apply, then marks its end.
/// Each mark carries the step's own clock and is retried while the API server is away.
const DEPLOY_SCRIPT: &str = r#"#!/bin/sh
NS="$(params.ns)"; PR="$(params.pr)"; KEY="$(params.key)"
# A multi-key run passes the lock's `tokens` (a JSON object): this key's token is in it.
TOKEN='$(params.token)'
case "$TOKEN" in
  "{"*) TOKEN=$(echo "$TOKEN" | sed -n "s/.*\"$KEY\":\([0-9]*\).*/\1/p") ;;
esac
# A PipelineRun queued as a whole: the token is its annotation (retried while the API server
# restarts). A copy started unguarded (not Pending) is told so (`tekton-mutex.dev/error`) and may
# have no token: it marks 0. So does a selected run that runs with no key (no lock took it).
i=0
while [ "$TOKEN" = queued ] && [ "$i" -lt 200 ]; do
  t=$(kubectl -n "$NS" get pipelinerun "$PR" -o jsonpath='{.metadata.annotations.tekton-mutex\.dev/token}/{.metadata.annotations.tekton-mutex\.dev/error}/{.metadata.annotations.tekton-mutex\.dev/key}' 2>/dev/null) || t=retry
  case "$t" in
    retry|//?*) ;;
    /*) TOKEN=0 ;;
    *) TOKEN=${t%%/*} ;;
  esac
  i=$((i+1)); [ "$TOKEN" = queued ] && sleep 0.3
done
# A matrixed lock task: this key's token is the result of the lock run whose key is this one.
i=0
while [ "$TOKEN" = matrix ] && [ "$i" -lt 200 ]; do
  t=$(kubectl -n "$NS" get customruns -l "tekton.dev/pipelineRun=$PR,tekton.dev/pipelineTask=lock" -o jsonpath='{range .items[*]}{.spec.params[?(@.name=="key")].value}={.status.results[?(@.name=="token")].value}{" "}{end}' 2>/dev/null) || t=""
  t=$(echo " $t" | sed -n "s/.* $KEY=\([0-9][0-9]*\) .*/\1/p")
  [ -n "$t" ] && TOKEN=$t
  i=$((i+1)); [ "$TOKEN" = matrix ] && sleep 0.3
done
mark() {
  now=$(date +%s%3N)
  body=$(printf '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"mark-%s-%s-%s","labels":{"chaos.tekton-mutex.dev/mark":"%s"}},"data":{"pr":"%s","task":"%s","key":"%s","group":"%s","seq":"%s","token":"%s","ms":"%s","how":"%s"}}' \
    "$PR" "$KEY" "$1" "$1" "$PR" "$(params.task)" "$KEY" "$(params.group)" "$(params.seq)" "$TOKEN" "$now" "$2")
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
echo "deploying $KEY with token $TOKEN"
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

/// The lock params every lock task of `run` shares: its key (or keys), group and policy.
fn lock_params(plan: &RoundPlan, run: &RunPlan) -> Vec<Value> {
    let group = &plan.groups[run.group];
    let keys: Vec<&str> = plan
        .keys_of(run)
        .into_iter()
        .map(|k| plan.keys[k].name.as_str())
        .collect();
    let mut params = match run.shape {
        Shape::MultiKey(_) => vec![param("keys", keys.join(","))],
        // The matrix gives each lock run its key.
        Shape::Matrix(..) => vec![],
        Shape::Plain | Shape::Sibling | Shape::Queued | Shape::Selected | Shape::Opposite(..) => {
            vec![param("key", keys[0])]
        }
    };
    params.extend([
        param("group", &group.name),
        param("supersede", group.supersede.as_str()),
        param("cancel-mode", run.cancel_mode),
    ]);
    if let Some(s) = run.sequence {
        params.push(param("sequence", s.to_string()));
    }
    if run.priority != 0 {
        params.push(param("priority", run.priority.to_string()));
    }
    if !run.wait {
        params.push(param("wait", "false"));
    }
    params
}

fn lock_task(name: &str, mut params: Vec<Value>, run: &RunPlan) -> Value {
    if name == EARLY_LOCK {
        params.push(param("release-after", QUICK));
    }
    let mut lock = json!({
        "name": name,
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

/// The token param of a queued run's deploy: the step reads the real one from the annotation.
const QUEUED_TOKEN: &str = "queued";
/// The token param of a matrixed lock task's deploy: the step reads its key's lock run result
/// (a matrixed custom task's results are not one string).
const MATRIX_TOKEN: &str = "matrix";

/// The lock task every deploy is guarded by; its lock run is the one the checker reads.
pub const LOCK: &str = "lock";
/// The opposite-orders shape's second lock task (on its second key), after the first.
pub const SECOND_LOCK: &str = "lock-2";
/// The sibling shape's second lock task, and the quick task its `release-after` names.
const EARLY_LOCK: &str = "lock-early";
const QUICK: &str = "quick";

/// The sibling shape's quick task: over at once, after its own lock task, while the deploy still runs.
fn quick_task() -> Value {
    json!({
        "name": QUICK,
        "runAfter": [EARLY_LOCK],
        "taskSpec": {"steps": [{"name": "quick", "image": "busybox", "script": "true"}]},
    })
}

/// The deploy task of `key` (the `i`th key of the run): marks its start and end.
fn deploy_task(plan: &RoundPlan, run: &RunPlan, key: usize, i: usize) -> Value {
    let task = if i == 0 {
        "deploy".to_string()
    } else {
        format!("deploy-{}", i + 1)
    };
    let token = match (plan.unguarded, run.shape) {
        (true, _) => "0",
        (false, Shape::MultiKey(_)) => "$(tasks.lock.results.tokens)",
        (false, Shape::Queued | Shape::Selected) => QUEUED_TOKEN,
        (false, Shape::Matrix(..)) => MATRIX_TOKEN,
        (false, Shape::Opposite(..)) if i > 0 => "$(tasks.lock-2.results.token)",
        (false, _) => "$(tasks.lock.results.token)",
    };
    let names = [
        "token", "ns", "pr", "task", "key", "group", "seq", "work-s", "term-s",
    ];
    let mut deploy = json!({
        "name": task,
        "params": [
            param("token", token),
            param("ns", "$(context.pipelineRun.namespace)"),
            param("pr", "$(context.pipelineRun.name)"),
            param("task", &task),
            param("key", &plan.keys[key].name),
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
        let after = match run.shape {
            Shape::Sibling => json!([LOCK, QUICK]),
            Shape::Plain | Shape::MultiKey(_) | Shape::Matrix(..) => json!([LOCK]),
            Shape::Opposite(..) => json!([LOCK, SECOND_LOCK]),
            Shape::Queued | Shape::Selected => json!([]),
        };
        deploy["runAfter"] = after;
        if !run.wait {
            deploy["when"] = json!([{
                "input": "$(tasks.lock.results.acquired)", "operator": "in", "values": ["true"],
            }]);
        }
    }
    deploy
}

/// The PipelineRun of `run`, with an embedded pipeline (a selected run's refers to the round's
/// selected Pipeline).
pub fn pipeline_run(plan: &RoundPlan, run: &RunPlan) -> Value {
    if !plan.unguarded && run.shape == Shape::Selected {
        return selected_run(plan, run);
    }
    let mut tasks = vec![];
    let queued = !plan.unguarded && run.shape == Shape::Queued;
    if !plan.unguarded && !queued {
        tasks.push(lock_task(LOCK, lock_params(plan, run), run));
        if run.shape == Shape::Sibling {
            tasks.push(lock_task(EARLY_LOCK, lock_params(plan, run), run));
            tasks.push(quick_task());
        }
        match run.shape {
            Shape::Matrix(a, b) => {
                let keys = [&plan.keys[a].name, &plan.keys[b].name];
                tasks[0]["matrix"] = json!({"params": [{"name": "key", "value": keys}]});
            }
            Shape::Opposite(_, second) => {
                let mut params = lock_params(plan, run);
                params[0] = param("key", &plan.keys[second].name);
                let mut lock = lock_task(SECOND_LOCK, params, run);
                lock["runAfter"] = json!([LOCK]);
                tasks.push(lock);
            }
            _ => {}
        }
    }
    for (i, key) in plan.keys_of(run).into_iter().enumerate() {
        tasks.push(deploy_task(plan, run, key, i));
    }
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
    if queued {
        pr["metadata"]["annotations"] = queued_annotations(plan, run);
        pr["spec"]["status"] = json!("PipelineRunPending");
    }
    pr
}

/// A queued run's lock params, as annotations (one parser reads both); its lock timeout is
/// its queue timeout.
fn queued_annotations(plan: &RoundPlan, run: &RunPlan) -> Value {
    let mut annotations = serde_json::Map::new();
    for p in lock_params(plan, run) {
        let name = format!(
            "tekton-mutex.dev/{}",
            p["name"].as_str().unwrap_or_default()
        );
        annotations.insert(name, p["value"].clone());
    }
    if let Some(t) = run.lock_timeout_s {
        annotations.insert(
            "tekton-mutex.dev/queue-timeout".into(),
            json!(format!("{t}s")),
        );
    }
    Value::Object(annotations)
}

/// The Pipeline of the selected runs, also their default supersede group.
pub const SELECTED_PIPELINE: &str = SELECTED_GROUP;

/// The selecting Mutex's selector: the selected Pipeline's runs.
pub fn selector() -> Value {
    json!({"pipelines": [SELECTED_PIPELINE]})
}

/// What a `selector-edit` sets instead: a Pipeline no run of the round refers to.
pub fn selector_taking_none() -> Value {
    json!({"pipelines": [format!("{SELECTED_PIPELINE}-no-more")]})
}

/// The selected Pipeline: the deploy of the selecting key, its length the run's params.
pub fn selected_pipeline(plan: &RoundPlan) -> Option<Value> {
    let run = plan.runs.iter().find(|r| r.shape == Shape::Selected)?;
    let key = plan.groups[run.group].key;
    let mut deploy = deploy_task(plan, run, key, 0);
    for p in deploy["params"].as_array_mut().into_iter().flatten() {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        if name == "work-s" || name == "term-s" {
            p["value"] = json!(format!("$(params.{name})"));
        }
    }
    Some(json!({
        "apiVersion": "tekton.dev/v1",
        "kind": "Pipeline",
        "metadata": {"name": SELECTED_PIPELINE},
        "spec": {
            "params": [{"name": "work-s", "type": "string"}, {"name": "term-s", "type": "string"}],
            "tasks": [deploy],
        },
    }))
}

/// A selected run as a Trigger creates it: a `pipelineRef`, params and labels; no status, no
/// annotation.
fn selected_run(plan: &RoundPlan, run: &RunPlan) -> Value {
    let mut pr = json!({
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {
            "name": run.name,
            "labels": {"chaos.tekton-mutex.dev/seed": plan.seed.to_string()},
        },
        "spec": {
            "pipelineRef": {"name": SELECTED_PIPELINE},
            "params": [
                param("work-s", secs(run.deploy_ms)),
                param("term-s", secs(run.term_extra_ms)),
            ],
        },
    });
    if let Some(t) = run.pipeline_timeout_s {
        pr["spec"]["timeouts"] = json!({"pipeline": format!("{t}s")});
    }
    pr
}

/// The Mutex objects of a round, made ahead with their capacity (and the selecting one's
/// selector).
pub fn mutexes(plan: &RoundPlan) -> Vec<Value> {
    plan.keys
        .iter()
        .map(|k| {
            let mut spec = json!({"capacity": k.capacity});
            if let Some(order) = k.order {
                spec["order"] = json!(order);
            }
            if k.selecting {
                spec["selector"] = selector();
            }
            json!({
                "apiVersion": "tekton-mutex.dev/v1alpha1",
                "kind": "Mutex",
                "metadata": {"name": k.name},
                "spec": spec,
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
