//! Proves the local control plane is real: the real Tekton controller turns a PipelineRun into a
//! TaskRun and a pod, the pod-runner runs the step script on the host with KUBECONFIG pointing at
//! the local API server, and the built `tkn` sees the results. It deletes like a cluster too: a
//! deleted pod's step gets SIGTERM and its grace period before the pod object goes (as a kubelet
//! does), and kube-controller-manager garbage-collects the children of a deleted PipelineRun and
//! removes a deleted namespace.
//!
//! Needs a running cluster: `hack/test.sh` (or `hack/cluster.sh up` first).

mod support;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use support::*;

const PIPELINE: &str = r#"
apiVersion: tekton.dev/v1
kind: Pipeline
metadata:
  name: scripted
spec:
  params:
  - name: configmap
    type: string
  - name: exit-code
    type: string
    default: "0"
  tasks:
  - name: run
    params:
    - name: configmap
      value: $(params.configmap)
    - name: exit-code
      value: $(params.exit-code)
    taskSpec:
      params:
      - name: configmap
      - name: exit-code
      steps:
      - name: create-configmap
        image: registry.invalid/kubectl
        script: |
          set -e
          kubectl create configmap "$(params.configmap)" --from-literal=made-by=pod-runner
          exit $(params.exit-code)
"#;

fn pipelinerun(name: &str, configmap: &str, exit_code: u8) -> String {
    format!(
        r#"
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata:
  name: {name}
spec:
  pipelineRef:
    name: scripted
  params:
  - name: configmap
    value: {configmap}
  - name: exit-code
    value: "{exit_code}"
"#
    )
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn pipelinerun_scripts_act_on_the_real_api_server() -> Result<()> {
    let ns = TestNamespace::create("control-plane").await?;
    ns.apply(PIPELINE).await?;
    ns.apply(&pipelinerun("good", "made-by-good", 0)).await?;
    ns.apply(&pipelinerun("bad", "made-by-bad", 1)).await?;

    let good = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "good", secs(120))
        .await?;
    ensure!(
        good.status == "True",
        "PipelineRun good did not succeed: {good:?}"
    );
    let cm = ns.api::<ConfigMap>().get("made-by-good").await?;
    ensure!(
        cm.data
            .unwrap_or_default()
            .get("made-by")
            .map(String::as_str)
            == Some("pod-runner"),
        "the step's kubectl did not create the ConfigMap as scripted"
    );

    let bad = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "bad", secs(120))
        .await?;
    ensure!(
        bad.status == "False" && bad.reason == "Failed",
        "PipelineRun bad should fail: {bad:?}"
    );
    // The script ran up to its `exit 1`, so its ConfigMap exists too.
    ns.api::<ConfigMap>().get("made-by-bad").await?;

    // The TaskRun of the failed run reports the script's own exit code.
    let taskruns = ns.dynamic("tekton.dev/v1", "TaskRun").await?;
    let tr = taskruns.get("bad-run").await?;
    let failed = condition(&tr, "Succeeded").unwrap_or_default();
    ensure!(
        failed.status == "False" && failed.message.contains("exited with code 1"),
        "TaskRun bad-run: {failed:?}"
    );
    let step_seconds = tr
        .data
        .pointer("/status/steps/0/terminated/exitCode")
        .and_then(|v| v.as_i64());
    ensure!(
        step_seconds == Some(1),
        "step exit code in TaskRun status: {step_seconds:?}"
    );

    let list = ns.tkn(&["pipelinerun", "list"])?;
    let line = |name: &str| {
        list.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(str::to_string)
    };
    let good_line = line("good").unwrap_or_default();
    let bad_line = line("bad").unwrap_or_default();
    ensure!(
        good_line.contains("Succeeded"),
        "tkn pipelinerun list:\n{list}"
    );
    ensure!(bad_line.contains("Failed"), "tkn pipelinerun list:\n{list}");
    Ok(())
}

/// A TaskRun with one step `work` running `script`.
fn taskrun(name: &str, script: &str) -> String {
    serde_json::json!({
        "apiVersion": "tekton.dev/v1",
        "kind": "TaskRun",
        "metadata": {"name": name},
        "spec": {"taskSpec": {"steps": [
            {"name": "work", "image": "registry.invalid/sh", "script": script}
        ]}}
    })
    .to_string()
}

/// Starts a TaskRun and waits until its step has printed `ready`; returns the pod.
async fn started_step(ns: &TestNamespace, name: &str, script: &str) -> Result<Pod> {
    ns.apply(&taskrun(name, script)).await?;
    let taskruns = ns.dynamic("tekton.dev/v1", "TaskRun").await?;
    let pods = ns.api::<Pod>();
    let desc = format!("the step of TaskRun {name} to print `ready`");
    wait_until(&desc, secs(120), || {
        let (taskruns, pods) = (taskruns.clone(), pods.clone());
        async move {
            let tr = taskruns.get(name).await?;
            let Some(pod_name) = tr.data.pointer("/status/podName").and_then(|v| v.as_str()) else {
                return Ok(None);
            };
            let log = std::fs::read_to_string(step_log_path(ns.name(), pod_name, "step-work"));
            if !log.unwrap_or_default().contains("ready") {
                return Ok(None);
            }
            Ok(Some(pods.get(pod_name).await?))
        }
    })
    .await
}

/// What was seen of a pod being deleted, polled until the pod object (by uid) is gone.
struct Deletion {
    /// The step's log each time the pod showed a deletionTimestamp and phase Running.
    terminating_logs: Vec<String>,
    /// The step's log right after the pod object was seen gone.
    log_when_gone: String,
}

async fn delete_and_watch(ns: &TestNamespace, pod: &Pod, grace_seconds: u32) -> Result<Deletion> {
    let pods = ns.api::<Pod>();
    let name = pod.name_any();
    let uid = pod.uid();
    let log_path = step_log_path(ns.name(), &name, "step-work");
    let read_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    pods.delete(&name, &DeleteParams::default().grace_period(grace_seconds))
        .await?;
    let mut terminating_logs = Vec::new();
    let deadline = std::time::Instant::now() + secs(90);
    loop {
        // Read the pod first, then the log: a log read after the pod was seen tells what its
        // processes had done by then at least.
        let current = pods.get_opt(&name).await?.filter(|p| p.uid() == uid);
        let log = read_log();
        let Some(current) = current else {
            return Ok(Deletion {
                terminating_logs,
                log_when_gone: log,
            });
        };
        let phase = current.status.and_then(|s| s.phase).unwrap_or_default();
        if current.metadata.deletion_timestamp.is_some() && phase == "Running" {
            terminating_logs.push(log);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "pod {name} was not removed within 90s of its deletion (phase {phase})"
        );
        tokio::time::sleep(POLL).await; // poll interval of a bounded condition wait
    }
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn a_deleted_pod_stays_terminating_until_its_step_has_handled_sigterm() -> Result<()> {
    let ns = TestNamespace::create("pod-grace").await?;
    let pod = started_step(
        &ns,
        "traps-term",
        "trap 'echo got-term; for i in 1 2 3; do echo after-term-$i; sleep 1; done; \
         echo step-exiting; exit 0' TERM\necho ready\nwhile :; do sleep 0.1; done\n",
    )
    .await?;
    let seen = delete_and_watch(&ns, &pod, 20).await?;
    ensure!(
        seen.terminating_logs
            .iter()
            .any(|log| log.contains("after-term-1") && !log.contains("step-exiting")),
        "the pod never showed deletionTimestamp + Running while its step still worked after \
         SIGTERM; logs seen while terminating: {:?}",
        seen.terminating_logs
    );
    ensure!(
        seen.log_when_gone.contains("step-exiting"),
        "the pod object was removed before its step ended; step log then:\n{}",
        seen.log_when_gone
    );
    Ok(())
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn a_step_ignoring_sigterm_is_killed_when_the_grace_period_ends() -> Result<()> {
    let ns = TestNamespace::create("pod-kill").await?;
    let pod = started_step(
        &ns,
        "ignores-term",
        "trap 'echo term-ignored' TERM\necho \"pid=$$\"\necho ready\n# set -e: a sleep ended by the TERM must not end the script\nwhile :; do sleep 0.1 || true; done\n",
    )
    .await?;
    let seen = delete_and_watch(&ns, &pod, 2).await?;
    ensure!(
        seen.terminating_logs
            .iter()
            .any(|log| log.contains("term-ignored")),
        "the pod never showed deletionTimestamp + Running after its step got SIGTERM; logs: {:?}",
        seen.terminating_logs
    );
    let pid = seen
        .log_when_gone
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .context("the step did not print its pid")?
        .trim()
        .to_string();
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = state
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'));
    ensure!(
        !running,
        "the step (pid {pid}) still runs after its pod object was removed: {state}"
    );
    Ok(())
}

/// A PipelineRun with a long-running task and a custom task (a CustomRun no controller handles,
/// so it stays running too).
fn long_pipelinerun(name: &str) -> String {
    serde_json::json!({
        "apiVersion": "tekton.dev/v1",
        "kind": "PipelineRun",
        "metadata": {"name": name},
        "spec": {"pipelineSpec": {"tasks": [
            {"name": "work", "taskSpec": {"steps": [{
                "name": "work", "image": "registry.invalid/sh",
                "script": "echo ready\nwhile :; do sleep 0.1; done\n"
            }]}},
            {"name": "custom", "taskRef": {"apiVersion": "example.dev/v1", "kind": "Nothing"}}
        ]}}
    })
    .to_string()
}

/// How many TaskRuns, CustomRuns and pods of PipelineRun `name` exist (by their
/// `tekton.dev/pipelineRun` label), and whether the PipelineRun itself does.
async fn children_of(ns: &TestNamespace, name: &str) -> Result<(usize, usize, usize, bool)> {
    let selector = ListParams::default().labels(&format!("tekton.dev/pipelineRun={name}"));
    let taskruns = ns.dynamic("tekton.dev/v1", "TaskRun").await?;
    let customruns = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let pipelineruns = ns.dynamic("tekton.dev/v1", "PipelineRun").await?;
    Ok((
        taskruns.list(&selector).await?.items.len(),
        customruns.list(&selector).await?.items.len(),
        ns.api::<Pod>().list(&selector).await?.items.len(),
        pipelineruns.get_opt(name).await?.is_some(),
    ))
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn deleting_a_pipelinerun_deletes_its_taskruns_customruns_and_pods() -> Result<()> {
    let ns = TestNamespace::create("cascade").await?;
    let ns = &ns;
    let runs = [
        ("foreground", DeleteParams::foreground()),
        ("background", DeleteParams::background()),
    ];
    for (name, _) in &runs {
        ns.apply(&long_pipelinerun(name)).await?;
    }
    for (name, _) in &runs {
        wait_until(
            &format!("PipelineRun {name} to have a TaskRun, a CustomRun and a pod"),
            secs(120),
            || async move {
                let (tr, cr, pods, _) = children_of(ns, name).await?;
                Ok((tr == 1 && cr == 1 && pods == 1).then_some(()))
            },
        )
        .await?;
    }
    let pipelineruns = ns.dynamic("tekton.dev/v1", "PipelineRun").await?;
    for (name, params) in &runs {
        pipelineruns.delete(name, params).await?;
    }
    for (name, _) in &runs {
        let left = wait_until(
            &format!("PipelineRun {name} and its TaskRuns, CustomRuns and pods to be gone"),
            secs(120),
            || async move {
                let left = children_of(ns, name).await?;
                Ok((left == (0, 0, 0, false)).then_some(left))
            },
        )
        .await;
        ensure!(
            left.is_ok(),
            "{name} deletion: (TaskRuns, CustomRuns, pods, PipelineRun) left: {:?}: {left:?}",
            children_of(ns, name).await?
        );
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn a_deleted_namespace_is_really_removed() -> Result<()> {
    let ns = TestNamespace::create("ns-delete").await?;
    let ns = &ns;
    ns.apply(&long_pipelinerun("running")).await?;
    ns.apply(r#"{apiVersion: v1, kind: ConfigMap, metadata: {name: data}, data: {a: b}}"#)
        .await?;
    wait_until("the PipelineRun's pod to exist", secs(120), || async {
        let (_, _, pods, _) = children_of(ns, "running").await?;
        Ok((pods == 1).then_some(()))
    })
    .await?;
    let namespaces: Api<Namespace> = Api::all(ns.client());
    namespaces
        .delete(ns.name(), &DeleteParams::background())
        .await?;
    wait_until(
        &format!("namespace {} to be removed", ns.name()),
        secs(180),
        || async { Ok(namespaces.get_opt(ns.name()).await?.is_none().then_some(())) },
    )
    .await
    .with_context(|| {
        format!(
            "namespace {} stayed (is the namespace controller running?)",
            ns.name()
        )
    })?;
    Ok(())
}

/// The name of the pod of TaskRun `name`, once it has one.
async fn pod_of_taskrun(ns: &TestNamespace, name: &str) -> Result<String> {
    let taskruns = ns.dynamic("tekton.dev/v1", "TaskRun").await?;
    wait_until(&format!("TaskRun {name} to have a pod"), secs(120), || {
        let taskruns = taskruns.clone();
        async move {
            let tr = taskruns.get(name).await?;
            Ok(tr
                .data
                .pointer("/status/podName")
                .and_then(|v| v.as_str())
                .filter(|p| !p.is_empty())
                .map(str::to_string))
        }
    })
    .await
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn kubectl_logs_of_a_finished_step_returns_its_output() -> Result<()> {
    let ns = TestNamespace::create("logs-done").await?;
    ns.apply(&taskrun(
        "prints",
        "echo line-1\necho line-2 >&2\nprintf 'line-3 without newline'\n",
    ))
    .await?;
    let done = ns
        .wait_for_succeeded("tekton.dev/v1", "TaskRun", "prints", secs(120))
        .await?;
    ensure!(done.status == "True", "TaskRun prints: {done:?}");
    let pod = pod_of_taskrun(&ns, "prints").await?;

    let all = ns.kubectl(&["logs", &pod, "-c", "step-work"])?;
    ensure!(
        all == "line-1\nline-2\nline-3 without newline\n",
        "kubectl logs of the finished step:\n{all:?}"
    );
    let last = ns.kubectl(&["logs", &pod, "-c", "step-work", "--tail", "1"])?;
    ensure!(last == "line-3 without newline\n", "--tail 1: {last:?}");
    let stamped = ns.kubectl(&["logs", &pod, "-c", "step-work", "--timestamps"])?;
    for line in stamped.lines() {
        let (time, text) = line.split_once(' ').unwrap_or_default();
        ensure!(
            time.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && text.starts_with("line-"),
            "--timestamps line without an RFC 3339 time: {line:?}"
        );
    }
    Ok(())
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn tkn_pipelinerun_logs_shows_both_tasks_in_order() -> Result<()> {
    let ns = TestNamespace::create("logs-tkn").await?;
    let step = |text: &str| {
        serde_json::json!({"steps": [{"name": "say", "image": "registry.invalid/sh",
            "script": format!("echo {text}\n")}]})
    };
    ns.apply(
        &serde_json::json!({
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": "two"},
            "spec": {"pipelineSpec": {"tasks": [
                {"name": "first", "taskSpec": step("output-of-first")},
                {"name": "second", "runAfter": ["first"], "taskSpec": step("output-of-second")},
            ]}}
        })
        .to_string(),
    )
    .await?;
    let done = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "two", secs(180))
        .await?;
    ensure!(done.status == "True", "PipelineRun two: {done:?}");
    let out = ns.tkn(&["pipelinerun", "logs", "two"])?;
    let first = out.find("[first : say] output-of-first");
    let second = out.find("[second : say] output-of-second");
    ensure!(
        matches!((first, second), (Some(a), Some(b)) if a < b),
        "tkn pipelinerun logs should show first's output, then second's:\n{out}"
    );
    Ok(())
}

/// A `kubectl logs -f` or `tkn ... logs -f` process whose output is read line by line.
struct Follower {
    name: &'static str,
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl Follower {
    fn start(name: &'static str, args: &[&str]) -> Result<Self> {
        use tokio::io::AsyncBufReadExt;
        let mut child = tokio::process::Command::new(tool_path(name)?)
            .args(args)
            .env("KUBECONFIG", kubeconfig_path())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child.stdout.take().context("no stdout")?;
        Ok(Self {
            name,
            child,
            lines: tokio::io::BufReader::new(stdout).lines(),
        })
    }

    /// The next non-empty line (tkn ends each step with an empty one); None at the end.
    async fn next_line(&mut self) -> Result<Option<String>> {
        loop {
            let line = tokio::time::timeout(secs(120), self.lines.next_line())
                .await
                .with_context(|| format!("timed out waiting for a line from {}", self.name))??;
            match line {
                Some(l) if l.trim().is_empty() => continue,
                other => return Ok(other),
            }
        }
    }

    /// Expects the stream to end, and the process to exit successfully.
    async fn expect_end(mut self) -> Result<()> {
        let rest = self.next_line().await?;
        ensure!(
            rest.is_none(),
            "{} -f printed {rest:?} after the last line",
            self.name
        );
        let status = tokio::time::timeout(secs(30), self.child.wait()).await??;
        ensure!(status.success(), "{} -f exited with {status}", self.name);
        Ok(())
    }
}

#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn logs_follow_streams_a_running_step() -> Result<()> {
    let ns = TestNamespace::create("logs-follow").await?;
    // The step prints, then waits for the test's go-ahead (a ConfigMap), then prints again.
    ns.apply(&taskrun(
        "waits",
        "echo before-go\ni=0\nuntil kubectl get configmap go >/dev/null 2>&1; do\n  \
         i=$((i+1)); [ \"$i\" -lt 600 ] || exit 1 # no go-ahead after 600 tries\n  sleep 0.2\ndone\n\
         echo after-go\n",
    ))
    .await?;
    let pod = pod_of_taskrun(&ns, "waits").await?;
    // The API server proxies logs only for a pod bound to a node.
    let pods = ns.api::<Pod>();
    wait_until("the pod to be bound to a node", secs(60), || async {
        let p = pods.get(&pod).await?;
        Ok(p.spec.and_then(|s| s.node_name))
    })
    .await?;
    // Either may be early (the step not started yet): the endpoint waits for its output.
    let mut kubectl = Follower::start(
        "kubectl",
        &["logs", "-f", &pod, "-c", "step-work", "-n", ns.name()],
    )?;
    let mut tkn = Follower::start("tkn", &["taskrun", "logs", "-f", "waits", "-n", ns.name()])?;
    ensure!(kubectl.next_line().await?.as_deref() == Some("before-go"));
    ensure!(tkn.next_line().await?.as_deref() == Some("[work] before-go"));
    let tr = ns.get_opt("tekton.dev/v1", "TaskRun", "waits").await?;
    let running = tr.and_then(|tr| condition(&tr, "Succeeded"));
    ensure!(
        running.as_ref().is_some_and(|c| c.status == "Unknown"),
        "the first line should arrive while the step still runs: {running:?}"
    );
    ns.apply(r#"{apiVersion: v1, kind: ConfigMap, metadata: {name: go}}"#)
        .await?;
    ensure!(kubectl.next_line().await?.as_deref() == Some("after-go"));
    ensure!(tkn.next_line().await?.as_deref() == Some("[work] after-go"));
    // Both end by themselves once the step has ended.
    kubectl.expect_end().await?;
    tkn.expect_end().await?;
    Ok(())
}
