//! Proves the local control plane is real: the real Tekton controller turns a PipelineRun into a
//! TaskRun and a pod, the pod-runner runs the step script on the host with KUBECONFIG pointing at
//! the local API server, and the built `tkn` sees the results.
//!
//! Needs a running cluster: `hack/test.sh` (or `hack/cluster.sh up` first).

mod support;

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::ConfigMap;
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
