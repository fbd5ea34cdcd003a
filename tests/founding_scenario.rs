//! The founding scenario (jenkins-x/jx#6167, told in the README) end to end on the local
//! control plane, with the example pipelines of `examples/`:
//!
//! - without the Mutex, five promotions of one environment at once wipe it out (the control: it
//!   shows these tests can see the failure);
//! - with the Mutex, repeated: never two deploys at once, never a chart object deleted, and the
//!   environment always ends at the newest version;
//! - the fenced deploy with the lock bypassed: an older deploy that prunes after a newer one
//!   deletes nothing, and one that arrives after it applies nothing;
//! - in every cancel mode, and for a stale arrival, a superseded promotion ends `Cancelled`
//!   (as `tkn pipelinerun list` shows), never `Failed`, and says who superseded it.
//!
//! Every deploy step logs `EVENT <epoch-ms> <what> k=v...`; the pod-runner runs steps on this host,
//! so those clocks are one clock. Waits are bounded condition polls; nothing sleeps to synchronize.
//!
//! Needs a running cluster: `hack/test.sh` (or `hack/cluster.sh up` first).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex as StdMutex};

use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service, ServiceAccount};
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use support::controller::ControllerProcess;
use support::*;

const PROMOTE_TASK: &str = include_str!("../examples/promote-task.yaml");
const FENCED_TASK: &str = include_str!("../examples/promote-fenced-task.yaml");
const UNGUARDED: &str = include_str!("../examples/promote-unguarded.yaml");
const GUARDED: &str = include_str!("../examples/promote-guarded.yaml");
const FENCED: &str = include_str!("../examples/promote-fenced.yaml");
const PENDING: &str = include_str!("../examples/promote-pending.yaml");

/// The chart every deploy applies (see examples/promote-task.yaml).
const CHART: &[(&str, &str)] = &[
    ("ConfigMap", "app-config"),
    ("ConfigMap", "exposecontroller"),
    ("ConfigMap", "skills-server-redis"),
    ("ConfigMap", "skills-server-redis-health"),
    ("Service", "api-poi-v2"),
    ("Service", "skills-vue-x"),
    ("Service", "testx"),
    ("ServiceAccount", "cleanup"),
    ("ServiceAccount", "expose"),
    ("ServiceAccount", "api-poi-v2"),
];

/// One `EVENT` line of a deploy step.
#[derive(Clone, Debug)]
struct DeployEvent {
    ms: u64,
    what: String,
    fields: BTreeMap<String, String>,
}

fn parse_events(log: &str) -> Vec<DeployEvent> {
    log.lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            if parts.next()? != "EVENT" {
                return None;
            }
            let ms = parts.next()?.parse().ok()?;
            let what = parts.next()?.to_string();
            let fields = parts
                .filter_map(|p| {
                    p.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                })
                .collect();
            Some(DeployEvent { ms, what, fields })
        })
        .collect()
}

/// The deploy step's events of a TaskRun (empty if it never got a pod).
async fn taskrun_events(ns: &TestNamespace, taskrun: &str) -> Result<Vec<DeployEvent>> {
    let Some(tr) = ns.get_opt("tekton.dev/v1", "TaskRun", taskrun).await? else {
        return Ok(vec![]);
    };
    let Some(pod) = tr
        .data
        .pointer("/status/podName")
        .and_then(|p| p.as_str())
        .filter(|p| !p.is_empty())
    else {
        return Ok(vec![]);
    };
    let path = step_log_path(ns.name(), pod, "step-deploy");
    Ok(parse_events(
        &std::fs::read_to_string(&path).unwrap_or_default(),
    ))
}

/// The name of the `deploy` TaskRun of a PipelineRun, if it was created.
async fn deploy_taskrun(ns: &TestNamespace, pipeline_run: &str) -> Result<Option<String>> {
    let api = ns.dynamic("tekton.dev/v1", "TaskRun").await?;
    let lp = ListParams::default().labels(&format!(
        "tekton.dev/pipelineRun={pipeline_run},tekton.dev/pipelineTask=deploy"
    ));
    Ok(api.list(&lp).await?.items.first().map(|t| t.name_any()))
}

/// Label `key` of every chart object in the environment, by (kind, name).
async fn chart_objects(
    client: &Client,
    env: &str,
) -> Result<BTreeMap<(String, String), BTreeMap<String, String>>> {
    async fn list<K>(
        client: &Client,
        env: &str,
        out: &mut BTreeMap<(String, String), BTreeMap<String, String>>,
    ) -> Result<()>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + DeserializeOwned
            + std::fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(client.clone(), env);
        for o in api
            .list(&ListParams::default().labels("chart-release=jx"))
            .await?
            .items
        {
            out.insert(
                (K::kind(&()).to_string(), o.name_any()),
                o.labels().clone().into_iter().collect(),
            );
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    list::<ConfigMap>(client, env, &mut out).await?;
    list::<Service>(client, env, &mut out).await?;
    list::<ServiceAccount>(client, env, &mut out).await?;
    Ok(out)
}

/// Chart objects that are missing from the environment.
fn missing(objects: &BTreeMap<(String, String), BTreeMap<String, String>>) -> Vec<String> {
    CHART
        .iter()
        .filter(|(k, n)| !objects.contains_key(&(k.to_string(), n.to_string())))
        .map(|(k, n)| format!("{k}/{n}"))
        .collect()
}

/// Records every deletion of a chart object in a namespace, from our own watches.
struct DeletionWatch {
    deleted: Arc<StdMutex<Vec<String>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl DeletionWatch {
    async fn start(client: &Client, env: &str) -> Result<Self> {
        let deleted = Arc::new(StdMutex::new(Vec::new()));
        let ready = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        fn spawn<K>(
            client: &Client,
            env: &str,
            deleted: Arc<StdMutex<Vec<String>>>,
            ready: Arc<std::sync::atomic::AtomicUsize>,
        ) -> tokio::task::JoinHandle<()>
        where
            K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
                + Clone
                + DeserializeOwned
                + std::fmt::Debug
                + Send
                + 'static,
        {
            let api: Api<K> = Api::namespaced(client.clone(), env);
            tokio::spawn(async move {
                let cfg = watcher::Config::default().labels("chart-release=jx");
                let mut s = watcher::watcher(api, cfg).boxed();
                while let Some(ev) = s.next().await {
                    match ev {
                        Ok(Event::InitDone) => {
                            ready.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        }
                        Ok(Event::Delete(o)) => {
                            deleted.lock().unwrap().push(format!(
                                "{}/{}",
                                K::kind(&()),
                                o.name_any()
                            ));
                        }
                        _ => {}
                    }
                }
            })
        }
        tasks.push(spawn::<ConfigMap>(
            client,
            env,
            deleted.clone(),
            ready.clone(),
        ));
        tasks.push(spawn::<Service>(
            client,
            env,
            deleted.clone(),
            ready.clone(),
        ));
        tasks.push(spawn::<ServiceAccount>(
            client,
            env,
            deleted.clone(),
            ready.clone(),
        ));
        wait_until("the deletion watches to start", secs(30), || {
            let n = ready.load(std::sync::atomic::Ordering::SeqCst);
            async move { Ok((n >= 3).then_some(())) }
        })
        .await?;
        Ok(Self { deleted, tasks })
    }

    fn deleted(&self) -> Vec<String> {
        self.deleted.lock().unwrap().clone()
    }
}

impl Drop for DeletionWatch {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The pipelines' namespace (with the example Tasks and Pipelines) and the environment.
async fn setup(prefix: &str) -> Result<(TestNamespace, TestNamespace)> {
    let pipelines = TestNamespace::create(prefix).await?;
    let env = TestNamespace::create(&format!("{prefix}-env")).await?;
    for yaml in [PROMOTE_TASK, FENCED_TASK, UNGUARDED, GUARDED, FENCED] {
        pipelines.apply(yaml).await?;
    }
    Ok((pipelines, env))
}

/// Starts one PipelineRun per version, all at once (like five `jx start pipeline`), and waits
/// until every one is done. Returns the PipelineRun names by version.
async fn promote_at_once(
    ns: &TestNamespace,
    pipeline: &str,
    env: &str,
    versions: &[u32],
    window: u32,
) -> Result<BTreeMap<u32, String>> {
    let names: BTreeMap<u32, String> = versions
        .iter()
        .map(|v| (*v, format!("{pipeline}-{v}")))
        .collect();
    let creates = names.iter().map(|(v, name)| {
        let yaml = format!(
            r#"
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata: {{name: {name}}}
spec:
  pipelineRef: {{name: {pipeline}}}
  params:
    - {{name: environment, value: {env}}}
    - {{name: version, value: "{v}"}}
    - {{name: race-window, value: "{window}"}}
"#
        );
        async move { ns.apply(&yaml).await }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    for name in names.values() {
        ns.wait_for_succeeded(
            "tekton.dev/v1",
            "PipelineRun",
            name,
            secs(u64::from(window) * 8 + 180),
        )
        .await?;
    }
    Ok(names)
}

/// Every deploy's events, by version (versions whose deploy never ran are absent).
async fn deploys(
    ns: &TestNamespace,
    names: &BTreeMap<u32, String>,
) -> Result<BTreeMap<u32, Vec<DeployEvent>>> {
    let mut out = BTreeMap::new();
    for (v, pr) in names {
        if let Some(tr) = deploy_taskrun(ns, pr).await? {
            let events = taskrun_events(ns, &tr).await?;
            if !events.is_empty() {
                out.insert(*v, events);
            }
        }
    }
    Ok(out)
}

fn render(deploys: &BTreeMap<u32, Vec<DeployEvent>>) -> String {
    let mut all: Vec<(u64, u32, String)> = deploys
        .iter()
        .flat_map(|(v, evs)| {
            evs.iter()
                .map(move |e| (e.ms, *v, format!("{} {:?}", e.what, e.fields)))
        })
        .collect();
    all.sort();
    let t0 = all.first().map_or(0, |e| e.0);
    all.iter()
        .map(|(ms, v, s)| format!("  +{:>6}ms v{v} {s}\n", ms - t0))
        .collect()
}

/// Asserts that no two deploys overlapped: each one's first event comes after the previous
/// one's last event.
fn assert_one_at_a_time(deploys: &BTreeMap<u32, Vec<DeployEvent>>) -> Result<()> {
    let mut spans: Vec<(u64, u64, u32)> = Vec::new();
    for (v, evs) in deploys {
        let (first, last) = (evs.first().unwrap(), evs.last().unwrap());
        ensure!(
            last.what == "pruned",
            "deploy v{v} did not finish its prune:\n{}",
            render(deploys)
        );
        spans.push((first.ms, last.ms, *v));
    }
    spans.sort();
    for pair in spans.windows(2) {
        let ((_, end_a, va), (start_b, _, vb)) = (pair[0], pair[1]);
        ensure!(
            start_b >= end_a,
            "deploys v{va} and v{vb} overlapped:\n{}",
            render(deploys)
        );
    }
    Ok(())
}

/// With the Mutex, repeated: one deploy at a time, no chart object ever deleted, and the
/// environment ends at the newest version every round. The last round uses the fenced pipeline.
#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn guarded_promotions_run_one_at_a_time_and_the_newest_wins() -> Result<()> {
    let (ns, env) = setup("founding-guarded").await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let client = ns.client();
    let watch = DeletionWatch::start(&client, env.name()).await?;
    let rounds = [
        ("promote-guarded", 1),
        ("promote-guarded", 2),
        ("promote-guarded", 3),
        ("promote-fenced", 4),
    ];
    let mut last_token = 0;
    for (pipeline, round) in rounds {
        // Build numbers keep growing from round to round, as they do in real life.
        let versions: Vec<u32> = (1..=5).map(|i| round * 100 + i).collect();
        let newest = *versions.last().unwrap();
        let names = promote_at_once(&ns, pipeline, env.name(), &versions, 2).await?;
        let deploys = deploys(&ns, &names).await?;
        let story = render(&deploys);

        assert_one_at_a_time(&deploys)?;
        ensure!(
            deploys.contains_key(&newest),
            "round {round}: the newest version never deployed:\n{story}"
        );
        for (v, evs) in &deploys {
            for e in evs.iter().filter(|e| e.what == "pruned") {
                ensure!(
                    e.fields.get("deleted").map(String::as_str) == Some("0"),
                    "round {round}: deploy v{v} pruned chart objects:\n{story}"
                );
            }
        }
        ensure!(
            watch.deleted().is_empty(),
            "round {round}: chart objects were deleted: {:?}\n{story}",
            watch.deleted()
        );
        let objects = chart_objects(&client, env.name()).await?;
        let gone = missing(&objects);
        ensure!(
            gone.is_empty(),
            "round {round}: missing from the environment: {gone:?}\n{story}"
        );
        for ((kind, name), labels) in &objects {
            ensure!(
                labels.get("version") == Some(&newest.to_string()),
                "round {round}: {kind}/{name} is at version {:?}, not the newest {newest}\n{story}",
                labels.get("version")
            );
        }

        // Every run either deployed (holding the lock) or was superseded without deploying.
        let customruns = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
        for (v, pr) in &names {
            let runs = customruns
                .list(&ListParams::default().labels(&format!("tekton.dev/pipelineRun={pr}")))
                .await?;
            let lock = runs
                .items
                .first()
                .with_context(|| format!("no lock CustomRun for {pr}"))?;
            let cond = condition(lock, "Succeeded").unwrap_or_default();
            let superseded = cond.reason == "CustomRunCancelled"
                && cond.message.starts_with("Superseded: newer PipelineRun");
            match if superseded {
                "Superseded"
            } else {
                cond.reason.as_str()
            } {
                "Acquired" => {
                    ensure!(
                        deploys.contains_key(v),
                        "round {round}: {pr} acquired but never deployed:\n{story}"
                    );
                    let token: i64 = lock
                        .data
                        .pointer("/status/results")
                        .and_then(|r| r.as_array())
                        .and_then(|r| r.iter().find(|x| x["name"] == "token"))
                        .and_then(|x| x["value"].as_str())
                        .context("no token result")?
                        .parse()?;
                    ensure!(
                        token > last_token || *v != newest,
                        "tokens went backwards: {token} after {last_token}"
                    );
                    if *v == newest {
                        last_token = token;
                    }
                }
                "Superseded" => {
                    ensure!(
                        !deploys.contains_key(v),
                        "round {round}: {pr} was superseded but deployed:\n{story}"
                    );
                    assert_ended_superseded(&ns, pr).await?;
                }
                _ => bail!("round {round}: lock of {pr} ended with {cond:?}:\n{story}"),
            }
        }
        if pipeline == "promote-fenced" {
            let nsapi: Api<Namespace> = Api::all(client.clone());
            let fence = nsapi
                .get(env.name())
                .await?
                .annotations()
                .get("tekton-mutex.dev/deploy-token")
                .cloned();
            ensure!(
                fence == Some(last_token.to_string()),
                "fence is {fence:?}, expected the last token {last_token}"
            );
        }
    }
    Ok(())
}

/// Guarded without editing the pipeline (issue 26): five PipelineRuns of the UNGUARDED pipeline,
/// created Pending with the key annotation (examples/promote-pending.yaml). One deploy at a time,
/// nothing pruned, the environment ends at the newest version, and each superseded PipelineRun
/// ends Cancelled, names who superseded it, and never started a task.
#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn pending_promotions_of_the_unguarded_pipeline_run_one_at_a_time() -> Result<()> {
    let (ns, env) = setup("founding-pending").await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let client = ns.client();
    let watch = DeletionWatch::start(&client, env.name()).await?;
    let versions = [77, 78, 79, 80, 81];
    let names = queue_at_once(&ns, env.name(), &versions, 2).await?;
    let deploys = deploys(&ns, &names).await?;
    let story = render(&deploys);
    assert_one_at_a_time(&deploys)?;
    ensure!(deploys.contains_key(&81), "v81 never deployed:\n{story}");
    ensure!(
        watch.deleted().is_empty(),
        "chart objects were deleted: {:?}\n{story}",
        watch.deleted()
    );
    let objects = chart_objects(&client, env.name()).await?;
    ensure!(
        missing(&objects).is_empty(),
        "missing: {:?}\n{story}",
        missing(&objects)
    );
    for ((kind, name), labels) in &objects {
        ensure!(
            labels.get("version").map(String::as_str) == Some("81"),
            "{kind}/{name} is at {:?}, not v81\n{story}",
            labels.get("version")
        );
    }
    let prs = ns.dynamic("tekton.dev/v1", "PipelineRun").await?;
    for (v, pr) in &names {
        let obj = prs.get(pr).await?;
        let done = condition(&obj, "Succeeded").unwrap_or_default();
        let annotations = obj.annotations();
        if annotations.contains_key("tekton-mutex.dev/token") {
            ensure!(
                done.reason == "Succeeded",
                "{pr} was granted and ended {done:?}"
            );
            continue;
        }
        let children = obj
            .data
            .pointer("/status/childReferences")
            .and_then(|c| c.as_array());
        ensure!(
            done.status == "False" && done.reason == "Cancelled",
            "{pr} (v{v}) was not granted and ended {done:?}, not Cancelled"
        );
        ensure!(
            children.is_none_or(|c| c.is_empty()),
            "{pr} started tasks: {children:?}"
        );
        ensure!(
            !deploys.contains_key(v),
            "{pr} was never granted but deployed:\n{story}"
        );
        ensure!(
            annotations.contains_key("tekton-mutex.dev/superseded-by"),
            "{pr} does not say who superseded it: {annotations:?}"
        );
    }
    Ok(())
}

/// Creates one Pending PipelineRun of examples/promote-pending.yaml per version, all at once,
/// and waits until every one is done. Returns their names by version.
async fn queue_at_once(
    ns: &TestNamespace,
    env: &str,
    versions: &[u32],
    window: u32,
) -> Result<BTreeMap<u32, String>> {
    let names: BTreeMap<u32, String> = versions
        .iter()
        .map(|v| (*v, format!("promote-pending-{v}")))
        .collect();
    let creates = names.iter().map(|(v, name)| {
        let mut pr: serde_json::Value =
            serde_saphyr::from_str(PENDING).expect("the example parses");
        pr["metadata"] = serde_json::json!({"name": name, "annotations": {
            "tekton-mutex.dev/key": env, "tekton-mutex.dev/sequence": v.to_string()}});
        // The example's ServiceAccount (examples/rbac.yaml) lives in namespace jx; here the
        // steps run as the test namespace's own.
        pr["spec"]
            .as_object_mut()
            .unwrap()
            .remove("taskRunTemplate");
        pr["spec"]["params"] = serde_json::json!([
            {"name": "environment", "value": env},
            {"name": "version", "value": v.to_string()},
            {"name": "race-window", "value": window.to_string()},
        ]);
        async move { ns.apply(&pr.to_string()).await }
    });
    for r in futures::future::join_all(creates).await {
        r?;
    }
    for name in names.values() {
        let bound = secs(u64::from(window) * 8 + 180);
        ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", name, bound)
            .await?;
    }
    Ok(names)
}

/// The control: without the Mutex, five promotions at once wipe the environment out, as in the
/// report. If this ever fails, the other tests here could not see the failure either.
#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn unguarded_promotions_wipe_out_the_environment() -> Result<()> {
    let (ns, env) = setup("founding-unguarded").await?;
    let versions = [77, 78, 79, 80, 81];
    // A wide race window: every apply lands before the first prune, so each prune but the last
    // applier's deletes everything.
    let names = promote_at_once(&ns, "promote-unguarded", env.name(), &versions, 15).await?;
    let deploys = deploys(&ns, &names).await?;
    let story = render(&deploys);
    ensure!(
        deploys.len() == versions.len(),
        "not every deploy ran:\n{story}"
    );
    let wipes: BTreeSet<u32> = deploys
        .iter()
        .filter(|(_, evs)| {
            evs.iter().any(|e| {
                e.what == "pruned" && e.fields.get("deleted").map(String::as_str) == Some("10")
            })
        })
        .map(|(v, _)| *v)
        .collect();
    ensure!(
        !wipes.is_empty(),
        "no deploy pruned the whole chart:\n{story}"
    );
    let objects = chart_objects(&ns.client(), env.name()).await?;
    let gone = missing(&objects);
    ensure!(
        gone.len() == CHART.len(),
        "expected the environment wiped out, but it still has {objects:?}\n{story}"
    );
    Ok(())
}

/// Runs the fenced deploy Task directly (no Mutex: the lock is bypassed) with a given token.
async fn fenced_taskrun(
    ns: &TestNamespace,
    name: &str,
    env: &str,
    version: u32,
    token: u32,
    gate: &str,
) -> Result<()> {
    ns.apply(&format!(
        r#"
apiVersion: tekton.dev/v1
kind: TaskRun
metadata: {{name: {name}}}
spec:
  taskRef: {{name: promote-environment-fenced}}
  params:
    - {{name: environment, value: {env}}}
    - {{name: version, value: "{version}"}}
    - {{name: token, value: "{token}"}}
    - {{name: race-window, value: "0"}}
    - {{name: gate, value: "{gate}"}}
"#
    ))
    .await?;
    Ok(())
}

async fn outcome(ns: &TestNamespace, taskrun: &str) -> Result<String> {
    let cond = ns
        .wait_for_succeeded("tekton.dev/v1", "TaskRun", taskrun, secs(180))
        .await?;
    ensure!(cond.status == "True", "TaskRun {taskrun} failed: {cond:?}");
    let tr = ns
        .get_opt("tekton.dev/v1", "TaskRun", taskrun)
        .await?
        .context("TaskRun gone")?;
    tr.data
        .pointer("/status/results")
        .and_then(|r| r.as_array())
        .and_then(|r| r.iter().find(|x| x["name"] == "outcome"))
        .and_then(|x| x["value"].as_str())
        .map(String::from)
        .context("no outcome result")
}

/// The fenced deploy, with the lock bypassed: an older deploy that prunes after a newer one has
/// deployed deletes nothing, and an older one that starts after it applies nothing. The newer
/// one prunes what carries a lower token.
#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn fenced_deploy_with_the_lock_bypassed_does_no_damage() -> Result<()> {
    let (ns, env) = setup("founding-fenced").await?;
    let client = ns.client();
    // A leftover of an old release: the newer deploy's prune should remove it (lower token).
    env.apply(
        r#"{apiVersion: v1, kind: ConfigMap, metadata: {name: retired, labels: {chart-release: jx, version: "1", deploy-token: "1"}}}"#,
    )
    .await?;

    // The older deploy (token 10) applies, then holds before its prune until we open the gate.
    fenced_taskrun(&ns, "older", env.name(), 90, 10, "go-older").await?;
    wait_until("the older deploy to have applied", secs(120), || async {
        Ok(taskrun_events(&ns, "older")
            .await?
            .iter()
            .any(|e| e.what == "applied")
            .then_some(()))
    })
    .await?;

    // The newer deploy (token 11) runs start to finish in the meantime.
    fenced_taskrun(&ns, "newer", env.name(), 91, 11, "").await?;
    ensure!(outcome(&ns, "newer").await? == "deployed");
    let objects = chart_objects(&client, env.name()).await?;
    ensure!(
        !objects.contains_key(&("ConfigMap".into(), "retired".into())),
        "the newer deploy did not prune the lower-token leftover: {objects:?}"
    );

    // Now the older one prunes, after the newer one: it must refuse, and delete nothing.
    let watch = DeletionWatch::start(&client, env.name()).await?;
    ns.apply(r#"{apiVersion: v1, kind: ConfigMap, metadata: {name: go-older}}"#)
        .await?;
    ensure!(
        outcome(&ns, "older").await? == "refused-prune",
        "{:?}",
        taskrun_events(&ns, "older").await?
    );

    // And a still older one that starts only now must not even apply.
    fenced_taskrun(&ns, "oldest", env.name(), 89, 9, "").await?;
    ensure!(outcome(&ns, "oldest").await? == "refused-apply");

    ensure!(
        watch.deleted().is_empty(),
        "chart objects were deleted: {:?}",
        watch.deleted()
    );
    let objects = chart_objects(&client, env.name()).await?;
    let gone = missing(&objects);
    ensure!(gone.is_empty(), "missing from the environment: {gone:?}");
    for ((kind, name), labels) in &objects {
        ensure!(
            labels.get("version").map(String::as_str) == Some("91")
                && labels.get("deploy-token").map(String::as_str) == Some("11"),
            "{kind}/{name} is not the newer deploy's: {labels:?}"
        );
    }
    let nsapi: Api<Namespace> = Api::all(client);
    let fence = nsapi
        .get(env.name())
        .await?
        .annotations()
        .get("tekton-mutex.dev/deploy-token")
        .cloned();
    ensure!(fence.as_deref() == Some("11"), "fence is {fence:?}");
    Ok(())
}

/// The lock CustomRun of PipelineRun `pr` (its name is Tekton's to choose).
async fn lock_run_of(ns: &TestNamespace, pr: &str) -> Result<kube::api::DynamicObject> {
    let runs = ns.dynamic("tekton.dev/v1beta1", "CustomRun").await?;
    let list = runs
        .list(&ListParams::default().labels(&format!("tekton.dev/pipelineRun={pr}")))
        .await?;
    list.items
        .into_iter()
        .next()
        .with_context(|| format!("no lock CustomRun for {pr}"))
}

/// A superseded promotion: its lock run ended `CustomRunCancelled` with a `Superseded:`
/// message, its PipelineRun ended `Cancelled` (not `Failed`) and names who superseded it,
/// and a `Superseded` Event sits on each of them. Returns who superseded it.
async fn assert_ended_superseded(ns: &TestNamespace, pr: &str) -> Result<String> {
    let done = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", pr, secs(180))
        .await?;
    let lock = lock_run_of(ns, pr).await?;
    let cond = condition(&lock, "Succeeded").unwrap_or_default();
    ensure!(
        cond.status == "False"
            && cond.reason == "CustomRunCancelled"
            && cond.message.starts_with("Superseded: newer PipelineRun "),
        "lock run of {pr}: {cond:?}"
    );
    ensure!(
        done.status == "False" && done.reason == "Cancelled",
        "{pr} ended {done:?}, not Cancelled"
    );
    let obj = ns
        .dynamic("tekton.dev/v1", "PipelineRun")
        .await?
        .get(pr)
        .await?;
    let by = obj
        .annotations()
        .get("tekton-mutex.dev/superseded-by")
        .cloned()
        .with_context(|| format!("{pr} lacks the superseded-by annotation"))?;
    ensure!(
        cond.message.contains(&format!("newer PipelineRun {by} ")),
        "the message names {by}: {cond:?}"
    );
    let lock_name = lock.name_any();
    for (kind, name) in [("PipelineRun", pr), ("CustomRun", lock_name.as_str())] {
        wait_until(
            &format!("a Superseded Event on {kind} {name}"),
            secs(30),
            || async {
                let selector = format!("reason=Superseded,involvedObject.name={name}");
                let events = ns.kubectl(&[
                    "get",
                    "events",
                    "--field-selector",
                    &selector,
                    "-o",
                    "custom-columns=KIND:.involvedObject.kind",
                    "--no-headers",
                ])?;
                Ok(events.lines().any(|l| l.trim() == kind).then_some(()))
            },
        )
        .await?;
    }
    Ok(by)
}

/// The guarded pipeline with `cancel-mode` set, under a name of its own.
fn guarded_with(mode: &str) -> (String, String) {
    let name = format!("promote-{}", mode.to_lowercase());
    let yaml = GUARDED
        .replace("name: promote-guarded", &format!("name: {name}"))
        .replace(
            "        - {name: sequence, value: $(params.version)}\n",
            &format!(
                "        - {{name: sequence, value: $(params.version)}}\n        - {{name: cancel-mode, value: {mode}}}\n"
            ),
        );
    assert!(
        yaml.contains("cancel-mode"),
        "the example's lock params moved"
    );
    (name, yaml)
}

/// The line of `tkn ... list` output that shows `name`.
fn tkn_line<'a>(list: &'a str, name: &str) -> Option<&'a str> {
    list.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
}

/// A superseded promotion ends `Cancelled`, whatever the cancel mode, and so does a stale
/// arrival: nothing pages anyone for a run that did what it should. `tkn` shows it so.
#[tokio::test]
#[ignore = "needs hack/cluster.sh up"]
async fn superseded_promotions_end_cancelled_in_every_cancel_mode() -> Result<()> {
    let (ns, env) = setup("founding-cancelled").await?;
    let _controller = ControllerProcess::start(ns.name()).await?;
    let modes = ["CancelledRunFinally", "Cancelled", "StoppedRunFinally"];
    for (round, mode) in (1u32..).zip(modes) {
        let (pipeline, yaml) = guarded_with(mode);
        ns.apply(&yaml).await?;
        let versions: Vec<u32> = (1..=5).map(|i| round * 100 + i).collect();
        let names = promote_at_once(&ns, &pipeline, env.name(), &versions, 2).await?;
        let newest = names[versions.last().unwrap()].clone();
        let mut superseded = Vec::new();
        for pr in names.values() {
            let lock = lock_run_of(&ns, pr).await?;
            let reason = condition(&lock, "Succeeded").unwrap_or_default().reason;
            if reason == "Acquired" {
                continue;
            }
            assert_ended_superseded(&ns, pr).await?;
            let spec_status = ns
                .dynamic("tekton.dev/v1", "PipelineRun")
                .await?
                .get(pr)
                .await?;
            ensure!(
                spec_status
                    .data
                    .pointer("/spec/status")
                    .and_then(|s| s.as_str())
                    == Some(mode),
                "{pr} was cancelled with {mode}"
            );
            superseded.push(pr.clone());
        }
        ensure!(
            !superseded.is_empty() && !superseded.contains(&newest),
            "{mode}: some runs are superseded, never the newest: {superseded:?}"
        );
        if round == 1 {
            // A stale arrival: an older build that starts after a newer one was granted.
            let late = format!("{pipeline}-late");
            ns.apply(&format!(
                r#"{{apiVersion: tekton.dev/v1, kind: PipelineRun, metadata: {{name: {late}}},
                    spec: {{pipelineRef: {{name: {pipeline}}}, params: [{{name: environment, value: {env}}},
                    {{name: version, value: "{v}"}}, {{name: race-window, value: "2"}}]}}}}"#,
                env = env.name(),
                v = versions[2],
            ))
            .await?;
            let by = assert_ended_superseded(&ns, &late).await?;
            ensure!(by == newest, "the stale arrival names {newest}, not {by}");
            superseded.push(late);
        }
        let prs = ns.tkn(&["pipelinerun", "list"])?;
        let crs = ns.tkn(&["customrun", "list"])?;
        for pr in &superseded {
            let line = tkn_line(&prs, pr).unwrap_or_default();
            ensure!(
                line.contains("Cancelled") && !line.contains("Failed"),
                "tkn pipelinerun list shows {pr} as Cancelled:\n{prs}"
            );
            let lock = lock_run_of(&ns, pr).await?.name_any();
            ensure!(
                tkn_line(&crs, &lock).is_some_and(|l| l.contains("Failed(CustomRunCancelled)")),
                "tkn customrun list shows {lock} as Failed(CustomRunCancelled):\n{crs}"
            );
        }
        ensure!(
            tkn_line(&prs, &newest).is_some_and(|l| l.contains("Succeeded")),
            "the newest deployed:\n{prs}"
        );
    }
    Ok(())
}
