//! Lock PipelineRuns that nobody edits (issue 40): a Mutex's `spec.selector` takes the
//! PipelineRuns it matches, and the admission policy of config/admission/ makes them Pending
//! as the API server creates them, so a producer that writes neither Pending nor any annotation
//! (a Trigger, Pipelines-as-Code, a script) is serialized. On the local control plane with the
//! real Tekton controller; the policy is the file of config/, bound to the test's namespace only.

mod support;

use anyhow::{Context, Result, ensure};
use kube::ResourceExt;
use kube::api::{DynamicObject, PostParams};
use serde_json::{Value, json};
use support::controller::ControllerProcess;
use support::locks::ClusterMutexGuard;
use support::pipelines::*;
use support::*;
use tekton_mutex::model::cluster_mutex::{ClusterMutex, ClusterMutexSpec};

const TOKEN: &str = "tekton-mutex.dev/token";
const KEY: &str = "tekton-mutex.dev/key";
const PENDING: &str = "PipelineRunPending";

/// Tests whose controller serves only their namespace share the cluster; the one with a
/// cluster-wide controller runs alone (it would act in their namespaces too).
static CLUSTER_WIDE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The policies of config/admission/queue-at-create.yaml, renamed for one namespace and bound
/// to it alone (they are cluster-wide objects); removed when the test ends.
struct QueueAtCreate {
    names: Vec<(String, String)>,
}

impl QueueAtCreate {
    async fn install(ns: &TestNamespace) -> Result<QueueAtCreate> {
        Self::install_for(ns, &[ns.name()]).await
    }

    /// Named after `ns`, bound to `namespaces`.
    async fn install_for(ns: &TestNamespace, namespaces: &[&str]) -> Result<QueueAtCreate> {
        // Its params are Mutexes: without their CRD it refuses every PipelineRun create.
        support::controller::install_crd(&repo_root().join("config/300-crd.yaml")).await?;
        let file = repo_root().join("config/admission/queue-at-create.yaml");
        let docs: Vec<Value> = serde_saphyr::from_str_multiple(&std::fs::read_to_string(file)?)?;
        let mut names = Vec::new();
        for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
            let name = format!(
                "{}-{}",
                doc["metadata"]["name"].as_str().unwrap(),
                ns.name()
            );
            doc["metadata"]["name"] = json!(name);
            if let Some(policy) = doc.pointer_mut("/spec/policyName") {
                *policy = json!(format!("{}-{}", policy.as_str().unwrap(), ns.name()));
                doc["spec"]["matchResources"] = json!({"namespaceSelector": {"matchExpressions":
                    [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": namespaces}]}});
            }
            names.push((doc["kind"].as_str().unwrap().to_string(), name));
            apply_yaml(&ns.client(), None, &serde_json::to_string(&doc)?).await?;
        }
        wait_labelling(ns).await?;
        Ok(QueueAtCreate { names })
    }
}

/// Waits until the API server labels a selecting Mutex as it is written (the file's first
/// policy: a policy reaches admission a moment after it is created). A selecting Mutex written
/// before then is labelled by the controller, which some tests start only later.
async fn wait_labelling(ns: &TestNamespace) -> Result<()> {
    let api = ns.dynamic("tekton-mutex.dev/v1alpha1", "Mutex").await?;
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": "labelling-probe"}, "spec": {"selector": {"pipelines": ["probe"]}},
    }))?;
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_until(
        "the API server to label selecting Mutexes",
        slow(),
        || async {
            let stored = api.create(&pp, &probe).await?;
            let labelled = stored
                .labels()
                .get("tekton-mutex.dev/selects")
                .map(String::as_str);
            Ok((labelled == Some("true")).then_some(()))
        },
    )
    .await
}

impl Drop for QueueAtCreate {
    fn drop(&mut self) {
        for (kind, name) in &self.names {
            let plural = match kind.as_str() {
                "MutatingAdmissionPolicy" => "mutatingadmissionpolicies",
                _ => "mutatingadmissionpolicybindings",
            };
            let resource = format!("{plural}.v1beta1.admissionregistration.k8s.io");
            let _ = kubectl(&["delete", "--ignore-not-found", &resource, name]);
        }
    }
}

/// A PipelineRun of Pipeline `gated` as a Trigger creates it: labels, no status, no annotation.
fn triggered_run(name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "labels": labels},
        "spec": {"pipelineRef": {"name": "gated"}},
    })
}

/// Creates `run` and returns it as the API server stored it (after admission).
async fn create(ns: &TestNamespace, run: &Value, dry_run: bool) -> Result<DynamicObject> {
    let api = ns.dynamic("tekton.dev/v1", "PipelineRun").await?;
    let pp = PostParams {
        dry_run,
        ..Default::default()
    };
    let obj: DynamicObject = serde_json::from_value(run.clone())?;
    Ok(api.create(&pp, &obj).await?)
}

fn is_pending(pr: &DynamicObject) -> bool {
    pr.data.pointer("/spec/status") == Some(&json!(PENDING))
}

/// Waits until the API server makes a PipelineRun like `run` Pending at create (the policy
/// and its params reach the API server's admission a moment after they are written).
async fn wait_admission(ns: &TestNamespace, run: &Value) -> Result<()> {
    wait_until(
        "the admission policy to make a selected run Pending",
        slow(),
        || async {
            match create(ns, run, true).await {
                Ok(stored) => Ok(is_pending(&stored).then_some(())),
                // A CRD the API server has only just established: its admission has not
                // found the params' kind yet.
                Err(e)
                    if format!("{e:#}")
                        .contains("failed to find resource referenced by paramKind") =>
                {
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        },
    )
    .await
}

/// Let PipelineRun `name`'s deploy end, and wait until it has.
async fn finish(ns: &TestNamespace, name: &str) -> Result<()> {
    release(ns, name).await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", name, slow())
        .await?;
    Ok(())
}

/// The error annotation on PipelineRun `name`, once the controller wrote one.
async fn wait_error(ns: &TestNamespace, name: &str) -> Result<String> {
    wait_until(&format!("the error on {name}"), slow(), || async {
        let pr = pipeline_run(ns, name).await?;
        Ok(pr.annotations().get("tekton-mutex.dev/error").cloned())
    })
    .await
}

/// The annotations of ours on a PipelineRun (none on one no lock took).
fn ours(pr: &DynamicObject) -> Vec<&String> {
    let keys = pr.annotations().keys();
    keys.filter(|k| k.starts_with("tekton-mutex.dev/"))
        .collect()
}

async fn pipeline_run(ns: &TestNamespace, name: &str) -> Result<DynamicObject> {
    Ok(ns
        .dynamic("tekton.dev/v1", "PipelineRun")
        .await?
        .get(name)
        .await?)
}

/// The token of PipelineRun `name` once granted; it has started (its status was cleared).
async fn wait_granted(ns: &TestNamespace, name: &str) -> Result<i64> {
    let token = wait_until(&format!("{name} to be granted"), slow(), || async {
        Ok(pipeline_run(ns, name)
            .await?
            .annotations()
            .get(TOKEN)
            .cloned())
    })
    .await?;
    ensure!(
        !is_pending(&pipeline_run(ns, name).await?),
        "{name} granted but still Pending"
    );
    Ok(token.parse()?)
}

/// PipelineRun `name` is Pending and has started nothing.
async fn assert_waiting(ns: &TestNamespace, name: &str) -> Result<()> {
    let pr = pipeline_run(ns, name).await?;
    ensure!(
        is_pending(&pr),
        "{name} left Pending: {:?}",
        pr.data["spec"]
    );
    let children = pr
        .data
        .pointer("/status/childReferences")
        .and_then(Value::as_array);
    ensure!(
        children.is_none_or(|c| c.is_empty()),
        "{name} started tasks: {children:?}"
    );
    Ok(())
}

async fn setup(prefix: &str, mutex: Value) -> Result<(TestNamespace, QueueAtCreate)> {
    let ns = TestNamespace::create(prefix).await?;
    ns.apply(&gated_pipeline("gated")).await?;
    let policy = QueueAtCreate::install(&ns).await?;
    ns.apply(&mutex.to_string()).await?;
    Ok((ns, policy))
}

fn staging_mutex(spec: Value) -> Value {
    json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
           "metadata": {"name": "staging"}, "spec": spec})
}

/// The founding accident's producer (it writes neither Pending nor an annotation) is serialized:
/// each run is Pending from its create, one holds at a time, a newer run supersedes the older
/// one still waiting (the default), the tokens go up, and a run the selector does not match is
/// left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_trigger_like_producer_is_serialized_by_the_selector() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let selector = json!({"selector": {"matchLabels": {"env": "staging"}, "pipelines": ["gated"]}});
    let (ns, _policy) = setup("selector-trigger", staging_mutex(selector)).await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    wait_admission(&ns, &triggered_run("probe", json!({"env": "staging"}))).await?;
    let staging = json!({"env": "staging"});
    for name in ["t1", "t2", "t3"] {
        let stored = create(&ns, &triggered_run(name, staging.clone()), false).await?;
        ensure!(is_pending(&stored), "{name} was not made Pending at create");
        if name == "t1" {
            wait_granted(&ns, name).await?;
        }
    }
    let other = create(&ns, &triggered_run("prod", json!({"env": "prod"})), false).await?;
    ensure!(
        !is_pending(&other),
        "a run the selector does not match was made Pending"
    );
    // t3 supersedes t2, which never started; t3 waits for t1.
    let reason = wait_until("t2 to be superseded", slow(), || async {
        let pr = pipeline_run(&ns, "t2").await?;
        Ok(pr
            .annotations()
            .get("tekton-mutex.dev/cancel-reason")
            .cloned())
    })
    .await?;
    ensure!(reason == "Superseded", "t2 was cancelled for {reason}");
    let t2 = pipeline_run(&ns, "t2").await?;
    let children = t2
        .data
        .pointer("/status/childReferences")
        .and_then(Value::as_array);
    ensure!(
        children.is_none_or(|c| c.is_empty()),
        "t2 started tasks: {children:?}"
    );
    assert_waiting(&ns, "t3").await?;
    let t1 = pipeline_run(&ns, "t1").await?;
    ensure!(
        t1.annotations().get(KEY).map(String::as_str) == Some("staging")
            && t1
                .annotations()
                .get("tekton-mutex.dev/selected-by")
                .map(String::as_str)
                == Some("Mutex/staging"),
        "t1 does not say which lock took it: {:?}",
        t1.annotations()
    );
    let first: i64 = t1.annotations()[TOKEN].parse()?;
    finish(&ns, "t1").await?;
    let second = wait_granted(&ns, "t3").await?;
    ensure!(first < second, "tokens did not go up: {first}, {second}");
    finish(&ns, "t3").await?;
    // The unmatched run ran at once, untouched.
    finish(&ns, "prod").await?;
    let prod = pipeline_run(&ns, "prod").await?;
    let ours = ours(&prod);
    ensure!(ours.is_empty(), "the unmatched run carries {ours:?}");
    Ok(())
}

/// `keyFrom` gives each value its own lock: runs of two environments hold at once, a second
/// run of one environment waits, and each key's Mutex starts with the selecting one's settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn key_from_gives_each_environment_its_own_lock() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let spec = json!({"selector": {"pipelines": ["gated"]}, "keyFrom": {"label": "env"},
                      "maxQueue": 7});
    let (ns, _policy) = setup("selector-keyfrom", staging_mutex(spec)).await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    wait_admission(&ns, &triggered_run("probe", json!({"env": "a"}))).await?;
    for (name, env) in [("a1", "env-a"), ("b1", "env-b"), ("a2", "env-a")] {
        create(&ns, &triggered_run(name, json!({"env": env})), false).await?;
        if name != "a2" {
            wait_granted(&ns, name).await?;
        }
    }
    wait_until("a2 to be told it waits", slow(), || async {
        let pr = pipeline_run(&ns, "a2").await?;
        Ok(pr.annotations().get("tekton-mutex.dev/waiting").cloned())
    })
    .await?;
    assert_waiting(&ns, "a2").await?;
    let mutexes = ns.dynamic("tekton-mutex.dev/v1alpha1", "Mutex").await?;
    let env_a = mutexes.get("env-a").await?;
    ensure!(
        env_a.data.pointer("/spec/maxQueue") == Some(&json!(7)),
        "env-a's Mutex did not start with the selecting Mutex's settings: {:?}",
        env_a.data["spec"]
    );
    release(&ns, "a1").await?;
    wait_granted(&ns, "a2").await?;
    Ok(())
}

/// With the controller down, a selected run is still made Pending by the API server and waits:
/// nothing starts unguarded. When the controller comes back, it is queued and granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn with_the_controller_down_a_selected_run_waits_pending() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let selector = json!({"selector": {"pipelines": ["gated"]}});
    let (ns, _policy) = setup("selector-down", staging_mutex(selector)).await?;
    let run = triggered_run("r1", json!({}));
    wait_admission(&ns, &run).await?;
    let stored = create(&ns, &run, false).await?;
    ensure!(
        is_pending(&stored),
        "r1 was not made Pending with the controller down"
    );
    // Tekton sees it at once and leaves it Pending: its reason says so.
    wait_until("Tekton to report r1 Pending", slow(), || async {
        let pr = pipeline_run(&ns, "r1").await?;
        Ok(condition(&pr, "Succeeded").filter(|c| c.reason == PENDING))
    })
    .await?;
    assert_waiting(&ns, "r1").await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let token = wait_granted(&ns, "r1").await?;
    ensure!(token >= 1, "r1's token {token}");
    finish(&ns, "r1").await?;
    Ok(())
}

/// Two selectors that take one run, or an annotation that names another lock: the run stays
/// Pending (it never starts) with the error on it, and nothing is locked for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_run_two_selectors_take_stays_pending_with_a_clear_error() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let selector = json!({"selector": {"pipelines": ["gated"]}});
    let (ns, _policy) = setup("selector-two", staging_mutex(selector)).await?;
    ns.apply(
        &json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
                "metadata": {"name": "also"}, "spec": {"selector": {"matchLabels": {"env": "x"}}}})
        .to_string(),
    )
    .await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let run = triggered_run("both", json!({"env": "x"}));
    wait_admission(&ns, &run).await?;
    create(&ns, &run, false).await?;
    let error = wait_error(&ns, "both").await?;
    ensure!(
        error.contains("Mutex/also and Mutex/staging")
            || error.contains("Mutex/staging and Mutex/also"),
        "the error does not name both selectors: {error}"
    );
    assert_waiting(&ns, "both").await?;
    ensure!(
        !pipeline_run(&ns, "both")
            .await?
            .annotations()
            .contains_key(TOKEN),
        "a refused run was granted"
    );
    Ok(())
}

/// Without the admission policy, a selected run created without Pending starts before it can
/// be queued: it is told so (error annotation and a `NotQueued` Warning), and nothing is
/// locked for it. The documented behaviour of a cluster that does not serve the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn without_the_admission_policy_a_selected_run_is_told_it_was_not_queued() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let ns = TestNamespace::create("selector-nopolicy").await?;
    ns.apply(&gated_pipeline("gated")).await?;
    ns.apply(&staging_mutex(json!({"selector": {"pipelines": ["gated"]}})).to_string())
        .await?;
    let controller = ControllerProcess::start(ns.name()).await?;
    // It hears of a run as it is created (before Tekton reports on it) once it watches.
    wait_until("the controller to watch", slow(), || async {
        Ok(controller
            .log_text()
            .contains("caches synced")
            .then_some(()))
    })
    .await?;
    let stored = create(&ns, &triggered_run("r1", json!({})), false).await?;
    ensure!(
        !is_pending(&stored),
        "r1 was made Pending with no policy installed"
    );
    let error = wait_error(&ns, "r1").await?;
    ensure!(
        error.contains("Mutex/staging") && error.contains("queue-at-create.yaml"),
        "r1 is told {error}"
    );
    let r1 = pipeline_run(&ns, "r1").await?;
    ensure!(
        !r1.annotations().contains_key(TOKEN),
        "r1 was granted: {:?}",
        r1.annotations()
    );
    finish(&ns, "r1").await?;
    Ok(())
}

/// A ClusterMutex's selector takes the runs of the namespaces it allows, and only those: a
/// matching run of another namespace is neither made Pending nor queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_cluster_mutex_selects_only_in_the_namespaces_it_allows() -> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let (a, b) = (
        TestNamespace::create("selector-cluster-a").await?,
        TestNamespace::create("selector-cluster-b").await?,
    );
    let _policy = QueueAtCreate::install_for(&a, &[a.name(), b.name()]).await?;
    let suffix = a.name().rsplit('-').next().unwrap_or("x").to_string();
    let name = format!("prod-db-{suffix}");
    let api: kube::Api<ClusterMutex> = kube::Api::all(a.client());
    let spec: ClusterMutexSpec = serde_json::from_value(json!({
        "namespaces": [a.name()], "selector": {"matchLabels": {"db": suffix.clone()}}}))?;
    api.create(&Default::default(), &ClusterMutex::new(&name, spec))
        .await?;
    let _guard = ClusterMutexGuard(api.clone(), name.clone());
    for ns in [&a, &b] {
        ns.apply(&gated_pipeline("gated")).await?;
    }
    let _ctl = ControllerProcess::start_cluster_wide("cluster-wide").await?;
    let labels = json!({"db": suffix});
    wait_admission(&a, &triggered_run("probe", labels.clone())).await?;
    create(&a, &triggered_run("a1", labels.clone()), false).await?;
    let token = wait_granted(&a, "a1").await?;
    let a1 = pipeline_run(&a, "a1").await?;
    ensure!(
        a1.annotations().get("tekton-mutex.dev/selected-by")
            == Some(&format!("ClusterMutex/{name}")),
        "a1 was not taken by the ClusterMutex: {:?}",
        a1.annotations()
    );
    let b1 = create(&b, &triggered_run("b1", labels), false).await?;
    ensure!(
        !is_pending(&b1),
        "a run of a namespace the ClusterMutex does not allow was made Pending"
    );
    finish(&b, "b1").await?;
    let b1 = pipeline_run(&b, "b1").await?;
    let ours = ours(&b1);
    ensure!(ours.is_empty(), "b1 carries {ours:?}");
    let status = api.get(&name).await?.status.unwrap_or_default();
    ensure!(
        status.last_token == token && status.holders.len() == 1,
        "the ClusterMutex holds {:?} with last token {}",
        status.holders,
        status.last_token
    );
    finish(&a, "a1").await?;
    Ok(())
}

/// A tenant cannot take its run out of the lock its selector puts it in: annotated with another
/// key, the run is refused (it waits, told why), and the other lock never grants it, though it
/// would grant an older run first: a later run on that key is granted ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_run_annotated_away_from_its_selector_is_granted_by_no_lock() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let selector = json!({"selector": {"pipelines": ["gated"]}});
    let (ns, _policy) = setup("selector-escape", staging_mutex(selector)).await?;
    ns.apply(&gated_pipeline("other")).await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let mut escaping = triggered_run("escaping", json!({}));
    escaping["metadata"]["annotations"] = json!({KEY: "mine"});
    wait_admission(&ns, &triggered_run("probe", json!({}))).await?;
    let stored = create(&ns, &escaping, false).await?;
    ensure!(is_pending(&stored), "the escaping run was not made Pending");
    let error = wait_error(&ns, "escaping").await?;
    ensure!(
        error.contains("Mutex/staging") && error.contains("name another lock"),
        "{error}"
    );
    // A later run on key "mine", of another Pipeline: oldest first, so it is granted first
    // only if the escaping run is no member of that lock.
    let mut later = triggered_run("later", json!({}));
    later["spec"] = json!({"pipelineRef": {"name": "other"}, "status": PENDING});
    later["metadata"]["annotations"] = json!({KEY: "mine"});
    create(&ns, &later, false).await?;
    wait_granted(&ns, "later").await?;
    assert_waiting(&ns, "escaping").await?;
    let escaping = pipeline_run(&ns, "escaping").await?;
    ensure!(
        !escaping.annotations().contains_key(TOKEN),
        "the escaping run was granted"
    );
    Ok(())
}

/// No PipelineRun is held Pending by a lock that does not take it (issue 46): runs the admission
/// policy made Pending for a selector that changed (`s`) or whose lock was deleted (`p`) before
/// the controller queued them are let go: started without a lock, their mark removed, with a
/// Warning `LetGo` that says why, even with the cluster install's policy that lets only the
/// controller start a waiting run. A run the changed selector still takes stays queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn runs_a_selector_no_longer_takes_are_let_go() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let by_env =
        |env: &str| json!({"selector": {"pipelines": ["gated"], "matchLabels": {"env": env}}});
    let (ns, _policy) = setup("selector-let-go", staging_mutex(by_env("staging"))).await?;
    let prod = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": "prod"}, "spec": by_env("prod")});
    ns.apply(&prod.to_string()).await?;
    let only_a_grant = "401-admission-only-a-grant-starts.yaml";
    let _starts = support::policies::NamespacePolicy::install(&ns, only_a_grant).await?;
    let runs = [("s", "staging"), ("p", "prod"), ("kept", "qa")];
    for (name, env) in runs {
        let run = triggered_run(name, json!({"env": env}));
        if env != "qa" {
            wait_admission(&ns, &run).await?;
            ensure!(
                is_pending(&create(&ns, &run, false).await?),
                "{name} was not made Pending"
            );
        }
    }
    // Before the controller sees them: staging now takes qa's runs, prod is gone.
    let to_qa = r#"{"spec":{"selector":{"matchLabels":{"env":"qa"}}}}"#;
    ns.kubectl(&["patch", "mutex", "staging", "--type=merge", "-p", to_qa])?;
    ns.kubectl(&["delete", "mutex", "prod"])?;
    let kept = triggered_run("kept", json!({"env": "qa"}));
    wait_admission(&ns, &kept).await?;
    create(&ns, &kept, false).await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    for name in ["s", "p"] {
        wait_until(&format!("{name} to be let go"), slow(), || async {
            let pr = pipeline_run(&ns, name).await?;
            Ok((!is_pending(&pr) && ours(&pr).is_empty()).then_some(()))
        })
        .await?;
        wait_event(&ns, name, "LetGo").await?;
        finish(&ns, name).await?;
    }
    wait_granted(&ns, "kept").await?;
    finish(&ns, "kept").await?;
    Ok(())
}

/// Waits for an Event of `reason` on PipelineRun `name`.
async fn wait_event(ns: &TestNamespace, name: &str, reason: &str) -> Result<()> {
    wait_until(&format!("a {reason} Event on {name}"), slow(), || async {
        let selector =
            format!("reason={reason},involvedObject.name={name},involvedObject.kind=PipelineRun");
        let events = ns.kubectl(&["get", "events", "--field-selector", &selector, "-o", "name"])?;
        Ok((!events.trim().is_empty()).then_some(()))
    })
    .await
}

/// A selector or a namespaceSelector left empty in YAML (`selector:` with its parts commented
/// out, sent as null) means what leaving it out means, to the API server's admission policy as
/// to the controller: the API server drops the null as it stores the lock (a server-side apply
/// is refused instead), so a Mutex with a null selector takes no PipelineRun, and a ClusterMutex
/// with a null namespaceSelector allows no namespace but those it names (issue 46, items 3 and
/// 4: both held every run Pending).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_selector_left_empty_in_yaml_takes_nothing() -> Result<()> {
    let _alone = CLUSTER_WIDE.write().await;
    let ns = TestNamespace::create("selector-null").await?;
    let _ctl = ControllerProcess::start(ns.name()).await?; // installs the CRD of config/
    ns.apply(&gated_pipeline("gated")).await?;
    let _policy = QueueAtCreate::install(&ns).await?;
    let suffix = ns.name().rsplit('-').next().unwrap_or("x").to_string();
    let cluster_name = format!("null-ns-{suffix}");
    let api = ns
        .dynamic("tekton-mutex.dev/v1alpha1", "ClusterMutex")
        .await?;
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
        "metadata": {"name": cluster_name},
        "spec": {"namespaceSelector": null, "selector": {"matchLabels": {"team": suffix.clone()}}}}))?;
    let stored = api.create(&PostParams::default(), &cluster).await?;
    let _guard = ClusterMutexGuard(kube::Api::all(ns.client()), cluster_name.clone());
    ensure!(
        stored.data.pointer("/spec/namespaceSelector").is_none(),
        "the null namespaceSelector was stored: {:?}",
        stored.data["spec"]
    );
    let mutexes = ns.dynamic("tekton-mutex.dev/v1alpha1", "Mutex").await?;
    let staging = serde_json::from_value(staging_mutex(json!({"selector": null})))?;
    let stored = mutexes.create(&PostParams::default(), &staging).await?;
    ensure!(
        stored.data.pointer("/spec/selector").is_none(),
        "the null selector was stored: {:?}",
        stored.data["spec"]
    );
    // A server-side apply keeps the null to the schema check, which refuses it by name.
    let refused = ns
        .apply(&staging_mutex(json!({"selector": null})).to_string())
        .await
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    ensure!(
        refused.contains("spec.selector"),
        "a null selector was applied: {refused:?}"
    );
    // A lock that does select, applied last: once admission takes it, it has seen the others.
    ns.apply(
        &json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
                "metadata": {"name": "barrier"}, "spec": {"selector": {"matchLabels": {"env": "barrier"}}}})
        .to_string(),
    )
    .await?;
    wait_admission(&ns, &triggered_run("probe", json!({"env": "barrier"}))).await?;
    for labels in [json!({"env": "staging"}), json!({"team": suffix})] {
        let run = create(&ns, &triggered_run("free", labels.clone()), true).await?;
        ensure!(
            !is_pending(&run),
            "a run labelled {labels} was made Pending: {:?}",
            run.annotations()
        );
    }
    Ok(())
}

/// An operator's delete is final (issue 46, item 5): a selecting Mutex deleted while a run holds
/// it, with a selected run arriving during the drain, goes once empty; what comes back for the
/// run that waited is the plain Mutex a run creates, with no selector, so nothing new is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_deleted_selecting_mutex_does_not_come_back_with_its_selector() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let selector = json!({"capacity": 1, "selector": {"matchLabels": {"env": "staging"}}});
    let (ns, _policy) = setup("selector-deleted", staging_mutex(selector)).await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let staging = json!({"env": "staging"});
    wait_admission(&ns, &triggered_run("probe", staging.clone())).await?;
    create(&ns, &triggered_run("s1", staging.clone()), false).await?;
    wait_granted(&ns, "s1").await?;
    ns.kubectl(&["delete", "mutex", "staging", "--wait=false"])?;
    let s2 = create(&ns, &triggered_run("s2", staging.clone()), false).await?;
    ensure!(
        is_pending(&s2),
        "s2, selected while the Mutex drains, was not made Pending"
    );
    finish(&ns, "s1").await?;
    let mutexes = ns.dynamic("tekton-mutex.dev/v1alpha1", "Mutex").await?;
    wait_until("the drained Mutex to go", slow(), || async {
        let m = mutexes.get_opt("staging").await?;
        Ok(m.is_none_or(|m| m.metadata.deletion_timestamp.is_none())
            .then_some(()))
    })
    .await?;
    if let Some(back) = mutexes.get_opt("staging").await? {
        ensure!(
            back.data.pointer("/spec/selector").is_none(),
            "the Mutex came back with the deleted one's selector: {:?}",
            back.data["spec"]
        );
    }
    // Admission sees the Mutexes a moment after they change: no selector takes s3 for long.
    let s3 = triggered_run("s3", staging);
    wait_until("no selector to take a new run", slow(), || async {
        Ok((!is_pending(&create(&ns, &s3, true).await?)).then_some(()))
    })
    .await?;
    Ok(())
}

/// One meaning for a selector (issue 46): the admission policy's CEL, evaluated by the real API
/// server, and the controller's `RunSelector::matches` agree on generated selectors (null, empty
/// and given parts: labels, expressions of each operator, pipelines), labels and pipelineRefs.
/// Each case is a Mutex alone in a namespace of its own; a PipelineRun created there (dry run)
/// comes back Pending exactly when Rust, reading the Mutex as the API server stored it, says the
/// selector takes it. A selector with no part is refused by the API server, as Rust calls it
/// empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn the_admission_policy_and_the_controller_read_a_selector_alike() -> Result<()> {
    use tekton_mutex::model::mutex::Mutex;
    let _shared = CLUSTER_WIDE.read().await;
    support::controller::install_crd(&repo_root().join("config/300-crd.yaml")).await?;
    const CASES: usize = 40;
    let mut rng = Lcg(0x5eed_5e1e);
    let mut spaces = Vec::new();
    for _ in 0..=CASES {
        spaces.push(TestNamespace::create("selector-diff").await?);
    }
    let names: Vec<&str> = spaces.iter().map(|ns| ns.name()).collect();
    let _policy = QueueAtCreate::install_for(&spaces[0], &names).await?;
    let mut cases = Vec::new();
    for ns in &spaces[..CASES] {
        let selector = rng.selector();
        let mutexes = ns.dynamic("tekton-mutex.dev/v1alpha1", "Mutex").await?;
        let sent = serde_json::from_value(staging_mutex(json!({"selector": selector})))?;
        match mutexes.create(&PostParams::default(), &sent).await {
            Ok(stored) => {
                let stored: Mutex = serde_json::from_value(serde_json::to_value(&stored)?)?;
                let rule = stored.spec.selector.clone();
                ensure!(
                    rule.as_ref().is_none_or(|r| !r.is_empty()),
                    "{selector} was stored empty"
                );
                cases.push((ns, selector, rule));
            }
            Err(e) => ensure!(
                e.to_string()
                    .contains("an empty selector would take every PipelineRun"),
                "{selector} was refused: {e}"
            ),
        }
    }
    // The last namespace's Mutex, created after every other: once admission takes it, it has
    // seen them all (one watch of Mutexes, in order).
    let barrier = &spaces[CASES];
    barrier
        .apply(&staging_mutex(json!({"selector": {"matchLabels": {"barrier": "yes"}}})).to_string())
        .await?;
    wait_admission(barrier, &triggered_run("probe", json!({"barrier": "yes"}))).await?;
    ensure!(
        cases.len() >= CASES / 2,
        "only {} of {CASES} selectors were stored",
        cases.len()
    );
    let mut taken = 0;
    for (i, (ns, selector, rule)) in cases.iter().enumerate() {
        for j in 0..4 {
            let (labels, pipeline) = rng.run();
            let mut run = triggered_run(&format!("r{i}-{j}"), json!(labels));
            match &pipeline {
                Some(p) => run["spec"]["pipelineRef"]["name"] = json!(p),
                None => run["spec"] = json!({"pipelineSpec": {"tasks": []}}),
            }
            let by_cel = is_pending(&create(ns, &run, true).await?);
            let by_rust = rule
                .as_ref()
                .is_some_and(|r| r.matches(&labels, pipeline.as_deref()));
            ensure!(
                by_cel == by_rust,
                "selector {selector} on labels {labels:?}, pipeline {pipeline:?}: CEL says {by_cel}, Rust {by_rust}"
            );
            taken += usize::from(by_cel);
        }
    }
    let runs = cases.len() * 4;
    eprintln!(
        "{} selectors stored of {CASES}; {taken} of {runs} runs taken",
        cases.len()
    );
    ensure!(
        taken > 0 && taken < runs,
        "the cases never tell taken from not taken"
    );
    Ok(())
}

/// A small deterministic generator (the cases are the same on every run).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }

    fn pick<'a>(&mut self, of: &[&'a str]) -> &'a str {
        of[self.below(of.len() as u64) as usize]
    }

    /// A part: left out, null, `empty`, or `given`.
    fn part(&mut self, empty: Value, given: impl FnOnce(&mut Self) -> Value) -> Option<Value> {
        match self.below(5) {
            0 => None,
            1 => Some(Value::Null),
            2 => Some(empty),
            _ => Some(given(self)),
        }
    }

    /// A selector; now and then null as a whole (YAML's `selector:` with every part commented out).
    fn selector(&mut self) -> Value {
        if self.below(8) == 0 {
            return Value::Null;
        }
        let mut s = serde_json::Map::new();
        let labels = self.part(json!({}), |g| {
            let n = g.below(3);
            let m: serde_json::Map<String, Value> = (0..n)
                .map(|_| {
                    (
                        g.pick(&["env", "team", "tier"]).to_string(),
                        json!(g.pick(&["a", "b"])),
                    )
                })
                .collect();
            Value::Object(m)
        });
        let expressions = self.part(json!([]), |g| {
            let n = g.below(3);
            let list: Vec<Value> = (0..n)
                .map(|_| {
                    let op = g.pick(&["In", "NotIn", "Exists", "DoesNotExist"]);
                    let mut e = json!({"key": g.pick(&["env", "team", "tier"]), "operator": op});
                    match g.below(3) {
                        0 => {}
                        1 => e["values"] = Value::Null,
                        _ => e["values"] = json!([g.pick(&["a", "b"]), g.pick(&["a", "c"])]),
                    }
                    e
                })
                .collect();
            json!(list)
        });
        let pipelines = self.part(json!([]), |g| {
            let n = g.below(3);
            json!((0..n).map(|_| g.pick(&["p1", "p2"])).collect::<Vec<_>>())
        });
        for (name, part) in [
            ("matchLabels", labels),
            ("matchExpressions", expressions),
            ("pipelines", pipelines),
        ] {
            if let Some(p) = part {
                s.insert(name.into(), p);
            }
        }
        Value::Object(s)
    }

    /// A PipelineRun's labels and the Pipeline it names (None: an inline spec).
    fn run(&mut self) -> (std::collections::BTreeMap<String, String>, Option<String>) {
        let mut labels = std::collections::BTreeMap::new();
        for key in ["env", "team", "tier"] {
            if self.below(2) == 0 {
                labels.insert(key.to_string(), self.pick(&["a", "b", "c"]).to_string());
            }
        }
        let pipeline = match self.below(3) {
            0 => None,
            n => Some(format!("p{n}")),
        };
        (labels, pipeline)
    }
}

/// A run its producer holds Pending for reasons of its own (Pipelines-as-Code's
/// `concurrency_limit`) is left to it, and is queued the moment the producer starts it (issue
/// 46, item 2: it escaped the selector): the API server keeps it Pending and marks it, the
/// controller queues it, and it starts at its grant, after the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_run_its_producer_held_pending_is_queued_when_the_producer_starts_it() -> Result<()> {
    let _shared = CLUSTER_WIDE.read().await;
    let selector = json!({"selector": {"matchLabels": {"env": "staging"}}});
    let (ns, _policy) = setup("selector-producer", staging_mutex(selector)).await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let staging = json!({"env": "staging"});
    wait_admission(&ns, &triggered_run("probe", staging.clone())).await?;
    create(&ns, &triggered_run("s1", staging.clone()), false).await?;
    wait_granted(&ns, "s1").await?;
    // Created a second after s1 (creation times are whole seconds; within one, the name
    // decides), so that s1, granted first, does not supersede it as newer.
    let s1_created = pipeline_run(&ns, "s1")
        .await?
        .metadata
        .creation_timestamp
        .clone();
    let s1_created = s1_created.context("s1's creation time")?.0;
    wait_until("a second after s1's creation", secs(5), || async {
        let later = jiff::Timestamp::now().as_second() > s1_created.as_second();
        Ok(later.then_some(()))
    })
    .await?;
    let mut held = triggered_run("held", staging);
    held["spec"]["status"] = json!(PENDING);
    let stored = create(&ns, &held, false).await?;
    ensure!(
        is_pending(&stored) && ours(&stored).is_empty(),
        "a run its producer holds was marked: {:?}",
        stored.annotations()
    );
    // The producer starts it.
    let start = r#"{"spec":{"status":null}}"#;
    ns.kubectl(&["patch", "pipelinerun", "held", "--type=merge", "-p", start])?;
    let started = pipeline_run(&ns, "held").await?;
    ensure!(
        is_pending(&started)
            && started
                .annotations()
                .get("tekton-mutex.dev/pending-for")
                .map(String::as_str)
                == Some("Mutex/staging"),
        "the producer's start was not queued: {:?} {:?}",
        started.data.pointer("/spec/status"),
        started.annotations()
    );
    wait_until("held to be queued", slow(), || async {
        let pr = pipeline_run(&ns, "held").await?;
        Ok(pr.annotations().contains_key(KEY).then_some(()))
    })
    .await?;
    assert_waiting(&ns, "held").await?;
    finish(&ns, "s1").await?;
    wait_granted(&ns, "held").await?;
    Ok(())
}
