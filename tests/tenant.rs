//! What a namespace's `edit` role can do to a lock (issue 46), proven line by line with a
//! ServiceAccount bound to the built-in `edit` ClusterRole, as the cluster install leaves it:
//! the release's aggregated role (config/200-clusterrole-aggregate.yaml) and Tekton's fold
//! Mutexes and PipelineRuns into `edit`, and the release's admission policies (config/400-402)
//! are installed. Each line of the README's list is a constant here, and the test first checks
//! that the README still says it, so neither can change alone.

mod support;

use anyhow::{Context, Result, ensure};
use serde_json::json;
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::policies::NamespacePolicy;
use support::*;

const KEY: &str = "tekton-mutex.dev/key";
const TOKEN: &str = "tekton-mutex.dev/token";
const LEDGER: &str = "tekton-mutex-token-floors";

/// The README's list, a line each, in the order the test proves them.
const MANAGES_MUTEXES: &str = "It can create, change and delete its namespace's Mutexes.";
const NO_STATUS: &str = "It cannot write a lock's status, nor any ClusterMutex.";
const RECORD_GRANTS_NOTHING: &str =
    "It can write any annotation on its PipelineRuns, but a lock record it writes grants nothing.";
const CANNOT_START: &str =
    "It cannot start a queued PipelineRun nor take its key off; it can cancel it.";
const CANNOT_LOWER: &str = "It cannot lower or remove a token ledger entry, nor delete the ledger; raising one only skips tokens.";
const OWN_NAME: &str = "It cannot send a queue-control request in anyone's name but its own.";

/// `kubectl -n <ns> ARGS` as the ServiceAccount `editor`, bound to the built-in `edit` role.
struct Editor {
    config: std::path::PathBuf,
    namespace: String,
}

impl Editor {
    /// Creates the ServiceAccount and its RoleBinding; waits until `edit` covers Mutexes and
    /// PipelineRuns (the aggregation controller folds them in).
    async fn bind(ns: &TestNamespace) -> Result<Editor> {
        for file in ["200-clusterrole-aggregate.yaml"] {
            let text = std::fs::read_to_string(repo_root().join("config").join(file))?;
            apply_yaml(&ns.client(), None, &text).await?;
        }
        ns.kubectl(&["create", "serviceaccount", "editor"])?;
        let sa = format!("--serviceaccount={}:editor", ns.name());
        ns.kubectl(&["create", "rolebinding", "editor", "--clusterrole=edit", &sa])?;
        let editor = Editor {
            config: support::ops::service_account_kubeconfig(ns.name(), "editor")?,
            namespace: ns.name().to_string(),
        };
        wait_until("edit to cover Mutexes and PipelineRuns", slow(), || async {
            let can = |what: &str| editor.run(&["auth", "can-i", "create", what]);
            let both = can("mutexes.tekton-mutex.dev").is_ok_and(|s| s.trim() == "yes")
                && can("pipelineruns.tekton.dev").is_ok_and(|s| s.trim() == "yes");
            Ok(both.then_some(()))
        })
        .await?;
        Ok(editor)
    }

    fn run(&self, args: &[&str]) -> Result<String> {
        let path = self.config.to_string_lossy();
        let mut all = vec!["--kubeconfig", path.as_ref(), "-n", &self.namespace];
        all.extend_from_slice(args);
        kubectl(&all)
    }

    /// Creates the object `json` as the editor.
    fn create(&self, json: &serde_json::Value) -> Result<String> {
        let name = json["metadata"]["name"].as_str().unwrap_or("object");
        let file = std::env::temp_dir().join(format!("{}-{name}.json", self.namespace));
        std::fs::write(&file, json.to_string())?;
        let created = self.run(&["create", "-f", &file.to_string_lossy()]);
        let _ = std::fs::remove_file(&file);
        created
    }

    /// Ok when the editor's `args` are refused by an admission policy with a message containing
    /// `what`, once the policy has taken effect (a server-side dry run is refused first: a new
    /// policy reaches the API server's admission chain a moment after it is created).
    async fn refused(&self, args: &[&str], what: &str) -> Result<()> {
        let dry: Vec<&str> = args.iter().copied().chain(["--dry-run=server"]).collect();
        wait_until(
            &format!("the policy to refuse {args:?}"),
            slow(),
            || async {
                Ok(self
                    .run(&dry)
                    .is_err_and(|e| e.to_string().contains(what))
                    .then_some(()))
            },
        )
        .await?;
        self.forbidden(args, what)
    }

    /// Ok when the editor's `args` are refused with a message containing `what`.
    fn forbidden(&self, args: &[&str], what: &str) -> Result<()> {
        match self.run(args) {
            Err(e) if e.to_string().contains(what) => Ok(()),
            Err(e) => Err(e.context(format!("refused, but not for {what:?}"))),
            Ok(out) => anyhow::bail!("`{}` was allowed: {out}", args.join(" ")),
        }
    }
}

fn readme_says(line: &str) -> Result<()> {
    let readme = std::fs::read_to_string(repo_root().join("README.md"))?;
    ensure!(
        readme.contains(&format!("- {line}")),
        "README.md's tenant list no longer says {line:?}"
    );
    Ok(())
}

/// A PipelineRun of pipeline `gated`, created Pending on key `env`.
fn queued(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "annotations": {KEY: "env", "tekton-mutex.dev/supersede": "none"}},
        "spec": {"status": "PipelineRunPending", "pipelineRef": {"name": "gated"}},
    })
}

async fn annotation(ns: &TestNamespace, pr: &str, name: &str) -> Result<Option<String>> {
    let pr = ns
        .dynamic("tekton.dev/v1", "PipelineRun")
        .await?
        .get(pr)
        .await?;
    Ok(pr
        .metadata
        .annotations
        .unwrap_or_default()
        .get(name)
        .cloned())
}

async fn wait_annotation(ns: &TestNamespace, pr: &str, name: &str) -> Result<String> {
    wait_until(&format!("{pr} to carry {name}"), slow(), || {
        annotation(ns, pr, name)
    })
    .await
}

/// The policies of the cluster install, with this test's controller as the controller.
async fn policies(ns: &TestNamespace) -> Result<Vec<NamespacePolicy>> {
    let mut installed = Vec::new();
    for file in [
        "400-admission-policy.yaml",
        "401-admission-only-a-grant-starts.yaml",
        "402-admission-token-ledger.yaml",
    ] {
        installed.push(NamespacePolicy::install(ns, file).await?);
    }
    Ok(installed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn what_the_edit_role_can_do_to_a_lock_is_what_the_readme_says() -> Result<()> {
    for line in [
        MANAGES_MUTEXES,
        NO_STATUS,
        RECORD_GRANTS_NOTHING,
        CANNOT_START,
        CANNOT_LOWER,
        OWN_NAME,
    ] {
        readme_says(line)?;
    }
    let ns = TestNamespace::create("tenant-edit").await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let _policies = policies(&ns).await?;
    ns.apply(&gated_pipeline("gated")).await?;
    let editor = Editor::bind(&ns).await?;
    manages_mutexes(&editor)?;
    for pr in ["holder", "v2", "v3", "v4"] {
        editor.create(&queued(pr))?;
    }
    let first = wait_annotation(&ns, "holder", TOKEN)
        .await?
        .parse::<i64>()?;
    wait_annotation(&ns, "v4", "tekton-mutex.dev/waiting").await?;
    no_status(&editor, &ns).await?;
    cannot_start(&editor, &ns).await?;
    record_grants_nothing(&editor, &ns, first).await?;
    cannot_lower(&editor, first).await?;
    own_name(&editor, &ns).await?;
    Ok(())
}

/// MANAGES_MUTEXES
fn manages_mutexes(editor: &Editor) -> Result<()> {
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": "scratch"}, "spec": {"capacity": 1}});
    editor.create(&mutex)?;
    editor.run(&[
        "patch",
        "mutex",
        "scratch",
        "--type=merge",
        "-p",
        r#"{"spec":{"capacity":2}}"#,
    ])?;
    editor.run(&["delete", "mutex", "scratch"])?;
    Ok(())
}

/// NO_STATUS: RBAC keeps a lock's status and every ClusterMutex the controller's and the
/// cluster admin's.
async fn no_status(editor: &Editor, ns: &TestNamespace) -> Result<()> {
    let status = r#"{"status":{"lastToken":0,"holders":[]}}"#;
    let patch = [
        "patch",
        "mutex",
        "env",
        "--subresource=status",
        "--type=merge",
        "-p",
        status,
    ];
    editor.forbidden(&patch, "Forbidden")?;
    let cluster_mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
        "metadata": {"name": format!("{}-mine", ns.name())}, "spec": {}});
    let created = editor.create(&cluster_mutex);
    ensure!(
        created
            .as_ref()
            .is_err_and(|e| e.to_string().contains("Forbidden")),
        "a ClusterMutex was created: {created:?}"
    );
    Ok(())
}

/// CANNOT_START: clearing `spec.status` and taking the key off are refused; a cancel passes.
async fn cannot_start(editor: &Editor, ns: &TestNamespace) -> Result<()> {
    let start = [
        "patch",
        "pipelinerun",
        "v2",
        "--type=merge",
        "-p",
        r#"{"spec":{"status":null}}"#,
    ];
    editor.refused(&start, "only its grant starts it").await?;
    let unkey = format!("{KEY}-");
    editor
        .refused(
            &["annotate", "pipelinerun", "v2", &unkey],
            "cannot change while it waits",
        )
        .await?;
    let cancel = r#"{"spec":{"status":"Cancelled"}}"#;
    editor.run(&["patch", "pipelinerun", "v4", "--type=merge", "-p", cancel])?;
    let done = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", "v4", slow())
        .await?;
    ensure!(done.reason == "Cancelled", "v4 ended {done:?}");
    Ok(())
}

/// RECORD_GRANTS_NOTHING: v3 forges a grant with the largest token; when the holder ends, v2
/// (next in line) holds with the next token and v3 is still Pending, holding nothing.
async fn record_grants_nothing(editor: &Editor, ns: &TestNamespace, first: i64) -> Result<()> {
    editor.run(&["annotate", "pipelinerun", "v3", "team=payments"])?;
    let uid = editor.run(&["get", "pipelinerun", "v3", "-o", "jsonpath={.metadata.uid}"])?;
    let forged = json!({
        "conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
        "results": [{"name": "token", "value": tekton_mutex::model::mutex::MAX_TOKEN.to_string()}],
        "extraFields": {"key": "env", "lockKind": "Mutex", "member": uid.trim()},
    });
    let record = format!("tekton-mutex.dev/lock-record={forged}");
    editor.run(&["annotate", "--overwrite", "pipelinerun", "v3", &record])?;
    release(ns, "holder").await?;
    let second = wait_annotation(ns, "v2", TOKEN).await?.parse::<i64>()?;
    // The next token (above, and no higher than the clock makes it): never the forged one.
    let ceiling = tekton_mutex::model::mutex::clock_floor(jiff::Timestamp::now()).max(first + 1);
    ensure!(
        second > first && second <= ceiling,
        "v2 got token {second} after {first} (at most {ceiling})"
    );
    let v3 = ns
        .dynamic("tekton.dev/v1", "PipelineRun")
        .await?
        .get("v3")
        .await?;
    ensure!(
        v3.data.pointer("/spec/status") == Some(&json!("PipelineRunPending")),
        "v3 started: {:?}",
        v3.data["spec"]
    );
    ensure!(
        annotation(ns, "v3", TOKEN).await?.is_none(),
        "v3 was granted"
    );
    Ok(())
}

/// CANNOT_LOWER: the ledger covers the tokens handed out; lowering, removing and deleting are
/// refused, raising passes.
async fn cannot_lower(editor: &Editor, first: i64) -> Result<()> {
    let entry = "mutex.env";
    let read = [
        "get",
        "configmap",
        LEDGER,
        "-o",
        "jsonpath={.data.mutex\\.env}",
    ];
    let covered: i64 = editor
        .run(&read)?
        .trim()
        .parse()
        .context("the ledger entry")?;
    ensure!(
        covered >= first,
        "the ledger covers {covered}, below {first}"
    );
    let write = |value: serde_json::Value| json!({"data": {entry: value}}).to_string();
    let patch = |data: &str| -> [String; 6] {
        ["patch", "configmap", LEDGER, "--type=merge", "-p", data].map(String::from)
    };
    for lowered in [json!("1"), json!(null)] {
        let args = patch(&write(lowered));
        editor
            .refused(&args.each_ref().map(String::as_str), "never be lowered")
            .await?;
    }
    editor
        .refused(&["delete", "configmap", LEDGER], "goes with its namespace")
        .await?;
    let raised = patch(&write(json!((covered + 1).to_string())));
    editor.run(&raised.each_ref().map(String::as_str))?;
    Ok(())
}

/// OWN_NAME: a request naming another requester is refused; one in its own name passes.
async fn own_name(editor: &Editor, ns: &TestNamespace) -> Result<()> {
    let forged = r#"request.tekton-mutex.dev/forged={"action":"clear","by":"security-oncall"}"#;
    editor
        .refused(
            &["annotate", "mutex", "env", forged],
            "must name its requester",
        )
        .await?;
    let me = format!("system:serviceaccount:{}:editor", ns.name());
    let own = format!(r#"request.tekton-mutex.dev/own={{"action":"clear","by":"{me}"}}"#);
    editor.run(&["annotate", "mutex", "env", &own])?;
    Ok(())
}
