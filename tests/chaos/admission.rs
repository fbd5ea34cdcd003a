//! The cluster install's admission policies in a round (issue 46), and the users they meet: the
//! author of a queued run who tries to start it (config/401-admission-only-a-grant-starts.yaml
//! refuses them), and a lock whose `spec.selector` takes runs that a Trigger creates
//! (config/admission/queue-at-create.yaml makes them Pending), edited or deleted while they wait.

use super::manifest;
use super::plan::{FaultKind, RoundPlan, Shape};
use crate::support::ops::service_account_kubeconfig;
use crate::support::policies::NamespacePolicy;
use crate::support::{
    TestNamespace, apply_yaml, dynamic_api, kubectl, repo_root, secs, wait_until,
};
use anyhow::{Context, Result};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::sync::Arc;
use tekton_mutex::model::mutex::Mutex;

const PENDING: &str = "PipelineRunPending";
/// What config/401-admission-only-a-grant-starts.yaml answers a start it refuses.
const REFUSAL: &str = "only its grant starts it";

/// Runs `kubectl -n <round> ARGS` as the author of the round's runs: a ServiceAccount that may
/// read and patch PipelineRuns there, not the controller.
pub type Author = Arc<dyn Fn(&[&str]) -> Result<String> + Send + Sync>;

/// The policies a round installed (removed when dropped) and its author, if it has one.
pub struct RoundPolicies {
    _installed: Vec<NamespacePolicy>,
    pub author: Option<Author>,
}

/// Installs what the plan needs, bound to the round's namespace, before the Mutexes are made:
/// for an `author-start`, the policy that only a grant starts a waiting run (enforced, as an
/// author's dry-run start shows) and the author; for a selecting key, the selected Pipeline
/// and the queue-at-create policies (see `wait_selecting`).
pub async fn install(plan: &RoundPlan, ns: &TestNamespace) -> Result<RoundPolicies> {
    let mut out = RoundPolicies {
        _installed: vec![],
        author: None,
    };
    if plan.unguarded {
        return Ok(out);
    }
    if plan.faults.iter().any(|f| f.kind == FaultKind::AuthorStart) {
        let policy = "401-admission-only-a-grant-starts.yaml";
        out._installed
            .push(NamespacePolicy::install(ns, policy).await?);
        let author = author(ns)?;
        wait_grant_only(ns, &author).await?;
        out.author = Some(author);
    }
    if let Some(pipeline) = manifest::selected_pipeline(plan) {
        apply_yaml(&ns.client(), Some(ns.name()), &pipeline.to_string()).await?;
        let file = repo_root().join("config/admission/queue-at-create.yaml");
        let text = std::fs::read_to_string(file)?;
        out._installed
            .push(NamespacePolicy::install_yaml(ns, &text).await?);
    }
    Ok(out)
}

/// Waits until the API server makes a selected run Pending at create (a dry run): the policies
/// and their params (the selecting Mutex) reach its admission a moment after they are written.
/// The selecting Mutex is applied again meanwhile, as an operator would: a policy that labels
/// selecting locks as they are written may have come into force after it was made.
pub async fn wait_selecting(plan: &RoundPlan, ns: &TestNamespace) -> Result<()> {
    let Some(run) = plan.runs.iter().find(|r| r.shape == Shape::Selected) else {
        return Ok(());
    };
    let selecting = manifest::mutexes(plan)
        .into_iter()
        .find(|m| m.pointer("/spec/selector").is_some())
        .context("a selected run, but no selecting Mutex")?;
    let api = dynamic_api(
        &ns.client(),
        Some(ns.name()),
        "tekton.dev/v1",
        "PipelineRun",
    )
    .await?;
    let pr: DynamicObject = serde_json::from_value(manifest::pipeline_run(plan, run))?;
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    wait_until(
        "the queue-at-create policy to take a selected run",
        secs(60),
        || {
            let (api, pr, dry) = (api.clone(), pr.clone(), dry.clone());
            let (client, name, yaml) = (ns.client(), ns.name().to_string(), selecting.to_string());
            async move {
                apply_yaml(&client, Some(&name), &yaml).await?;
                // Refused while its params' kind is not found yet: asked again.
                Ok(api
                    .create(&dry, &pr)
                    .await
                    .ok()
                    .filter(is_pending)
                    .map(|_| ()))
            }
        },
    )
    .await
}

/// The author: ServiceAccount `author` of the round's namespace, allowed to read and patch its
/// PipelineRuns (as a tenant with the edit role may).
fn author(ns: &TestNamespace) -> Result<Author> {
    ns.kubectl(&["create", "serviceaccount", "author"])?;
    let rule = ["--resource=pipelineruns.tekton.dev", "--verb=get,patch"];
    ns.kubectl(&["create", "role", "author", rule[0], rule[1]])?;
    let sa = format!("--serviceaccount={}:author", ns.name());
    ns.kubectl(&["create", "rolebinding", "author", "--role=author", &sa])?;
    let config = service_account_kubeconfig(ns.name(), "author")?;
    let namespace = ns.name().to_string();
    Ok(Arc::new(move |args: &[&str]| {
        let path = config.to_string_lossy();
        let mut all = vec!["--kubeconfig", path.as_ref(), "-n", &namespace];
        all.extend_from_slice(args);
        kubectl(&all)
    }))
}

/// Waits until the API server refuses an author's start of a waiting run: a probe, Pending
/// with a key annotation, created before the controller runs (so that no lock sees it), an
/// author's dry-run start of it refused, then deleted.
async fn wait_grant_only(ns: &TestNamespace, author: &Author) -> Result<()> {
    let api = dynamic_api(
        &ns.client(),
        Some(ns.name()),
        "tekton.dev/v1",
        "PipelineRun",
    )
    .await?;
    let probe: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": "author-probe", "annotations": {"tekton-mutex.dev/key": "author-probe"}},
        "spec": {"status": PENDING, "pipelineSpec": {"tasks": [{"name": "t",
            "taskSpec": {"steps": [{"name": "s", "image": "busybox", "script": "true"}]}}]}},
    }))?;
    api.create(&PostParams::default(), &probe).await?;
    let start = r#"{"spec":{"status":null}}"#;
    let args = [
        "patch",
        "pipelinerun",
        "author-probe",
        "--type=merge",
        "-p",
        start,
    ];
    let dry: Vec<&str> = args.iter().copied().chain(["--dry-run=server"]).collect();
    let enforced = wait_until(
        "the only-a-grant-starts policy to be enforced",
        secs(60),
        || {
            let author = author.clone();
            let dry: Vec<String> = dry.iter().map(|a| a.to_string()).collect();
            async move {
                let r =
                    blocking(move || author(&dry.iter().map(String::as_str).collect::<Vec<_>>()));
                Ok(matches!(r.await, Err(e) if e.to_string().contains(REFUSAL)).then_some(()))
            }
        },
    )
    .await;
    api.delete("author-probe", &DeleteParams::default()).await?;
    enforced
}

/// Runs a blocking call (kubectl) off the campaign's one-threaded runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await?
}

fn is_pending(pr: &DynamicObject) -> bool {
    pr.data.pointer("/spec/status") == Some(&json!(PENDING))
}

/// What an author's start of a waiting run came to.
pub enum AuthorStart {
    /// The API server refused it (the message says why).
    Refused { pr: String, message: String },
    /// The API server let it through: the run was waiting, unchanged, and now it starts.
    LetThrough { pr: String },
    /// None of the runs it could aim at waited (or none was answered) within the bound.
    NoneWaiting,
}

/// The author of the first of `candidates` (PipelineRuns queued as a whole) still waiting for
/// its grant (Pending, keyed, no token) clears its `spec.status`, on the condition that the run
/// is unchanged since it was read as waiting (its resourceVersion): a grant meanwhile is no
/// start of the author's. Asked again on a conflict, and while none waits, within 15 s.
pub async fn author_start(
    client: &Client,
    ns: &str,
    author: &Author,
    candidates: &[String],
) -> Result<AuthorStart> {
    let api = dynamic_api(client, Some(ns), "tekton.dev/v1", "PipelineRun").await?;
    let answered = wait_until(
        "a queued run to wait, and its author's start",
        secs(15),
        || async {
            let Some((pr, version)) = first_waiting(&api, candidates).await? else {
                return Ok(None);
            };
            let patch = json!({"metadata": {"resourceVersion": version}, "spec": {"status": null}});
            let args: Vec<String> = ["patch", "pipelinerun", pr.as_str(), "--type=merge", "-p"]
                .iter()
                .map(|a| a.to_string())
                .chain([patch.to_string()])
                .collect();
            let author = author.clone();
            let r = blocking(move || author(&args.iter().map(String::as_str).collect::<Vec<_>>()));
            Ok(match r.await {
                Ok(_) => Some(AuthorStart::LetThrough { pr }),
                Err(e) if e.to_string().contains(REFUSAL) => {
                    let text = e.to_string();
                    let message = text.lines().last().unwrap_or_default().to_string();
                    Some(AuthorStart::Refused { pr, message })
                }
                // Changed since it was read (a conflict), or the API server is away: again.
                Err(_) => None,
            })
        },
    )
    .await;
    Ok(answered.unwrap_or(AuthorStart::NoneWaiting))
}

/// The first of `names` still waiting for its grant, and its resourceVersion.
async fn first_waiting(
    api: &Api<DynamicObject>,
    names: &[String],
) -> Result<Option<(String, String)>> {
    for name in names {
        let Some(pr) = api.get_opt(name).await? else {
            continue;
        };
        let annotations = pr.annotations();
        let waiting = is_pending(&pr)
            && annotations.contains_key("tekton-mutex.dev/key")
            && !annotations.contains_key("tekton-mutex.dev/token");
        if waiting && let Some(version) = pr.resource_version() {
            return Ok(Some((name.clone(), version)));
        }
    }
    Ok(None)
}

/// A user edits Mutex `key`'s selector so that it takes none of the round's runs (`edit`), or
/// deletes the Mutex (`delete`), while runs wait on it. Returns what happened.
pub async fn edit_selector(client: &Client, ns: &str, key: &str, how: &str) -> Result<String> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    let Some(m) = api.get_opt(key).await? else {
        return Ok(format!("Mutex {key} is gone: nothing to {how}"));
    };
    let st = m.status.unwrap_or_default();
    let at = format!("{} holding, {} waiting", st.holders.len(), st.queue.len());
    let done = if how == "delete" {
        api.delete(key, &DeleteParams::default()).await.map(|_| ())
    } else {
        let patch = json!({"spec": {"selector": manifest::selector_taking_none()}});
        let pp = PatchParams::default();
        api.patch(key, &pp, &Patch::Merge(&patch)).await.map(|_| ())
    };
    let what = match how {
        "delete" => format!("deletes the selecting Mutex {key}"),
        _ => format!("edits Mutex {key}'s selector to take none of the round's runs"),
    };
    match done {
        Ok(()) => Ok(format!("user {what} ({at}): ok")),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(format!("user {what}: gone meanwhile")),
        Err(e) => Err(e).context(what),
    }
}
