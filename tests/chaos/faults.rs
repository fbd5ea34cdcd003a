//! Fault injection: controller replicas (SIGKILL, SIGSTOP/SIGCONT, a second replica), restarts
//! of the local control plane's kube-apiserver and etcd, and a user's actions.

use super::manifest::{USER_ANNOTATION, deny_policy};
pub use crate::support::components::{compact_etcd, restart_component, wait_api};
use crate::support::{apply_yaml, dynamic_api, repo_root, secs, wait_until};
use anyhow::{Context, Result, bail};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tekton_mutex::model::mutex::Mutex;
use tekton_mutex::model::tekton::customrun::CustomRun;

/// One controller process (`tekton-mutex run --namespace NS`), with its pid at hand for signals.
pub struct Replica {
    child: Child,
    pub paused: bool,
}

impl Replica {
    /// With the credentials of `kubeconfig` (the admin's if None): an identity of its own, which
    /// issue 49's API-level faults single out (api_faults::Identity).
    pub fn start_as(namespace: &str, log: &Path, kubeconfig: Option<&Path>) -> Result<Self> {
        Self::spawn(
            &["run", "--namespace", namespace],
            namespace,
            log,
            kubeconfig,
        )
    }

    /// A controller of every namespace (`tekton-mutex run`), as a ClusterMutex needs: the
    /// `cluster-tenants` round's. In CI the chaos lane has the cluster to itself (hack/test.sh
    /// runs it after the rest of the suite), so it serves no one else's namespaces.
    pub fn start_cluster_wide(label: &str, log: &Path) -> Result<Self> {
        Self::spawn(&["run"], label, log, None)
    }

    fn spawn(args: &[&str], label: &str, log: &Path, kubeconfig: Option<&Path>) -> Result<Self> {
        let out = std::fs::File::create(log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_tekton-mutex"))
            .args(args)
            .env(
                "KUBECONFIG",
                kubeconfig.map_or_else(crate::support::kubeconfig_path, Path::to_path_buf),
            )
            // CHAOS_RUST_LOG: more (e.g. kube=debug) when a round needs explaining.
            .env(
                "RUST_LOG",
                std::env::var("CHAOS_RUST_LOG")
                    .unwrap_or_else(|_| "info,tekton_mutex=debug,kube=warn".into()),
            )
            .env("NO_COLOR", "1")
            .stdout(out.try_clone()?)
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .context("starting tekton-mutex")?;
        // Recorded so that hack/chaos.sh can stop it should this process die without unwinding.
        let pids = repo_root().join("target/chaos/pids");
        std::fs::create_dir_all(&pids)?;
        std::fs::write(pids.join(child.id().to_string()), label)?;
        Ok(Self {
            child,
            paused: false,
        })
    }

    pub fn signal(&mut self, sig: &str) -> Result<()> {
        let ok = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status()?
            .success();
        if !ok {
            bail!("kill -s {sig} {} failed", self.child.id());
        }
        self.paused = sig == "STOP";
        Ok(())
    }

    /// Whether it exited by itself (as a controller that cannot reach the API server at start
    /// does: a Deployment would start it again).
    pub fn exited(&mut self) -> bool {
        !self.paused && matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// SIGKILL, as a crash or an OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let pid = self.child.id().to_string();
        let _ = std::fs::remove_file(repo_root().join("target/chaos/pids").join(pid));
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn prs(client: &Client, ns: &str) -> Result<Api<DynamicObject>> {
    dynamic_api(client, Some(ns), "tekton.dev/v1", "PipelineRun").await
}

/// A user cancels PipelineRun `pr` with `mode` (marked as a user's, see the admission fault).
pub async fn cancel_run(client: &Client, ns: &str, pr: &str, mode: &str) -> Result<()> {
    let api = prs(client, ns).await?;
    let patch = json!({
        "metadata": {"annotations": {USER_ANNOTATION: format!("cancel {mode}")}},
        "spec": {"status": mode},
    });
    api.patch(pr, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

pub async fn delete_run(client: &Client, ns: &str, pr: &str) -> Result<()> {
    prs(client, ns)
        .await?
        .delete(pr, &DeleteParams::background())
        .await?;
    Ok(())
}

/// Deletes the lock CustomRun(s) of PipelineRun `pr`; returns how many.
pub async fn delete_lock_run(client: &Client, ns: &str, pr: &str) -> Result<usize> {
    let api: Api<CustomRun> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("tekton.dev/pipelineRun={pr}"));
    let runs = api.list(&lp).await?.items;
    for r in &runs {
        api.delete(&r.name_any(), &DeleteParams::default()).await?;
    }
    Ok(runs.len())
}

pub async fn delete_mutex(client: &Client, ns: &str, key: &str) -> Result<()> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    api.delete(key, &DeleteParams::default()).await?;
    Ok(())
}

/// Wipes a Mutex's status, as a restore of a backup without status would.
pub async fn wipe_mutex_status(client: &Client, ns: &str, key: &str) -> Result<()> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    api.patch_status(
        key,
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": null})),
    )
    .await?;
    Ok(())
}

/// Starts denying the controller's PipelineRun cancels in `ns`; waits until the API server
/// enforces it (a dry-run cancel is refused).
pub async fn deny_cancels(client: &Client, ns: &str, probe_pr: &str) -> Result<()> {
    let (policy, binding) = deny_policy(ns);
    let yaml = format!("{policy}\n---\n{binding}");
    apply_yaml(client, None, &yaml).await?;
    let api = prs(client, ns).await?;
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let patch = json!({"spec": {"status": "Cancelled"}});
    // Bounded: if the probe run is gone or already cancelled, enforcement is simply not proven.
    let _ = wait_until("the admission policy to be enforced", secs(10), || {
        let api = api.clone();
        let (dry, patch) = (dry.clone(), patch.clone());
        async move {
            match api.patch(probe_pr, &dry, &Patch::Merge(&patch)).await {
                Err(kube::Error::Api(e)) if e.code == 422 || e.code == 403 => Ok(Some(())),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(Some(())),
                _ => Ok(None),
            }
        }
    })
    .await;
    Ok(())
}

pub async fn allow_cancels(client: &Client, ns: &str) -> Result<()> {
    let name = format!("chaos-deny-cancel-{ns}");
    let bindings = dynamic_api(
        client,
        None,
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    )
    .await?;
    let policies = dynamic_api(
        client,
        None,
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    )
    .await?;
    for api in [bindings, policies] {
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A user re-points the lock run(s) of PipelineRun `pr` at `to`: its `key` (or `keys`) param is
/// patched, the rest of its params kept (issue 23 item 2). Returns how many were patched.
pub async fn repoint_lock_run(client: &Client, ns: &str, pr: &str, to: &str) -> Result<usize> {
    let api: Api<CustomRun> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("tekton.dev/pipelineRun={pr}"));
    let runs = api.list(&lp).await?.items;
    for r in &runs {
        let mut params = serde_json::to_value(&r.spec.params)?;
        for p in params.as_array_mut().into_iter().flatten() {
            if p["name"] == "key" || p["name"] == "keys" {
                p["value"] = json!(to);
            }
        }
        let patch = json!({"spec": {"params": params}});
        api.patch(
            &r.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    }
    Ok(runs.len())
}

/// Deletes a lock run that some Mutex keeps a reserved slot for (issue 23 item 5), waiting up
/// to `within` for one to exist. Returns its PipelineRun, or None if no key reserved a slot.
pub async fn delete_reserved_lock_run(
    client: &Client,
    ns: &str,
    within: Duration,
) -> Result<Option<String>> {
    let mutexes: Api<Mutex> = Api::namespaced(client.clone(), ns);
    let reserved = wait_until("a key to keep a reserved slot", within, || {
        let mutexes = mutexes.clone();
        async move {
            let list = mutexes.list(&ListParams::default()).await?;
            Ok(list
                .items
                .iter()
                .filter_map(|m| m.status.as_ref())
                .flat_map(|s| &s.reservations)
                .map(|r| (r.waiter.run.name.clone(), r.waiter.pipeline_run.clone()))
                .next())
        }
    })
    .await;
    let Ok((run, pr)) = reserved else {
        return Ok(None);
    };
    let api: Api<CustomRun> = Api::namespaced(client.clone(), ns);
    match api.delete(&run, &DeleteParams::default()).await {
        Ok(_) => Ok(pr),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(None), // it ended meanwhile
        Err(e) => Err(e.into()),
    }
}

/// A copy of PipelineRun `of` as Tekton Dashboard's "Rerun" makes it (issue 37): every
/// annotation kept (the lock's record and token too), the labels but Tekton's own, the spec
/// without `status`, under a new name; created Pending again if `pending` (as the README says
/// to queue a run) and the original is queued as a whole (a lock task's run would stay Pending).
/// Whether it is Pending is read from what the API server stored.
pub struct Copied {
    /// The original is queued as a whole (it has `tekton-mutex.dev/key`).
    pub queued: bool,
    /// Created Pending.
    pub pending: bool,
    /// The `tekton-mutex.dev/token` annotation it was created with.
    pub token: Option<String>,
}

pub async fn copy_run(
    client: &Client,
    ns: &str,
    of: &str,
    name: &str,
    pending: bool,
) -> Result<Copied> {
    let api = prs(client, ns).await?;
    let original = api.get(of).await?;
    let annotations = original.annotations().clone();
    let queued = annotations.contains_key("tekton-mutex.dev/key");
    let pending = pending && queued;
    let labels: std::collections::BTreeMap<_, _> = original
        .labels()
        .iter()
        .filter(|(k, _)| !k.starts_with("tekton.dev/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut spec = original.data["spec"].clone();
    let fields = spec.as_object_mut().context("spec is an object")?;
    fields.remove("status");
    if pending {
        fields.insert("status".into(), json!("PipelineRunPending"));
    }
    let copy = json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
    });
    let copy: DynamicObject = serde_json::from_value(copy)?;
    let stored = api.create(&kube::api::PostParams::default(), &copy).await?;
    // The queue-at-create policy, where a round installs it, makes a keyed copy Pending.
    let pending = stored.data.pointer("/spec/status") == Some(&json!("PipelineRunPending"));
    Ok(Copied {
        queued,
        pending,
        token: annotations.get("tekton-mutex.dev/token").cloned(),
    })
}

/// Creates a PipelineRun (a restore's probe).
pub async fn create_run(client: &Client, ns: &str, body: serde_json::Value) -> Result<()> {
    let pr: DynamicObject = serde_json::from_value(body)?;
    prs(client, ns)
        .await?
        .create(&kube::api::PostParams::default(), &pr)
        .await?;
    Ok(())
}

/// Mutex `key` as it is now (None: there is none), for a restore later.
pub async fn snapshot_mutex(client: &Client, ns: &str, key: &str) -> Result<Option<Mutex>> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    Ok(api.get_opt(key).await?)
}

/// Waits up to `within` for Mutex `key` to be idle (no holder, waiter or reservation, no
/// finalizer, not being deleted) or absent; false if it never was.
pub async fn wait_idle(client: &Client, ns: &str, key: &str, within: Duration) -> bool {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    wait_until(&format!("Mutex {key} to be idle"), within, || {
        let api = api.clone();
        async move {
            let Ok(m) = api.get_opt(key).await else {
                return Ok(None); // the API server is away: ask again
            };
            let idle = m.is_none_or(|m| {
                let st = m.status.unwrap_or_default();
                m.metadata.deletion_timestamp.is_none()
                    && m.metadata.finalizers.unwrap_or_default().is_empty()
                    && st.holders.is_empty()
                    && st.queue.is_empty()
                    && st.reservations.is_empty()
            });
            Ok(idle.then_some(()))
        }
    })
    .await
    .is_ok()
}

/// A restore of Mutex `snapshot` as Velero does it with status included: the object is
/// deleted (waited for, bounded), created again from the snapshot (spec, labels, annotations),
/// then its old status is written through the status subresource. An object that exists by
/// then is left alone, as Velero's default policy does. Returns what happened.
pub async fn restore_mutex(client: &Client, ns: &str, snapshot: &Mutex) -> Result<String> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    let key = snapshot.name_any();
    match api.delete(&key, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    let gone = wait_until(&format!("Mutex {key} to be gone"), secs(60), || {
        let api = api.clone();
        let key = key.clone();
        async move { Ok(matches!(api.get_opt(&key).await, Ok(None)).then_some(())) }
    })
    .await;
    if gone.is_err() {
        return Ok("deleted, but still there after 60 s (in use again): not restored".into());
    }
    let mut restored = Mutex::new(&key, snapshot.spec.clone());
    restored.metadata.labels = snapshot.metadata.labels.clone();
    restored.metadata.annotations = snapshot.metadata.annotations.clone();
    let created = match api
        .create(&kube::api::PostParams::default(), &restored)
        .await
    {
        Ok(m) => m,
        Err(kube::Error::Api(e)) if e.code == 409 => {
            return Ok("re-created meanwhile (by the controller): left alone".into());
        }
        Err(e) => return Err(e.into()),
    };
    let Some(status) = snapshot.status.clone() else {
        return Ok("re-created from a snapshot with no status".into());
    };
    let mut current = created;
    for attempt in 0..3 {
        current.status = Some(status.clone());
        match api
            .replace_status(&key, &kube::api::PostParams::default(), &current)
            .await
        {
            Ok(_) => {
                return Ok(format!(
                    "re-created with its old status (lastToken {}, {} holders, {} waiting)",
                    status.last_token,
                    status.holders.len(),
                    status.queue.len()
                ));
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 2 => {
                current = api.get(&key).await?;
            }
            Err(kube::Error::Api(e)) => {
                return Ok(format!(
                    "re-created; its old status (lastToken {}) refused: {} ({})",
                    status.last_token, e.message, e.code
                ));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok("re-created; its old status never written (conflicts)".into())
}

/// The PipelineRuns holding keys of `ns` as the statuses say, `preferred` first if among them.
pub async fn holders(client: &Client, ns: &str, preferred: &str) -> Result<Vec<String>> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    let mut holders: Vec<String> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .flat_map(|m| m.status.map(|s| s.holders).unwrap_or_default())
        .map(|h| h.pipeline_run.unwrap_or(h.run.name))
        .collect();
    holders.sort_by_key(|h| h != preferred);
    Ok(holders)
}

/// A PipelineRun waiting for a key of `ns` now: `preferred` if it waits, else the head of the
/// longest queue (None: nothing waits).
pub async fn a_waiter(client: &Client, ns: &str, preferred: &str) -> Result<Option<String>> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    let mut queues: Vec<Vec<String>> = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|m| m.status.map(|s| s.queue).unwrap_or_default())
        .map(|q| {
            q.into_iter()
                .map(|w| w.pipeline_run.unwrap_or(w.run.name))
                .collect()
        })
        .collect();
    if queues.iter().flatten().any(|w| w == preferred) {
        return Ok(Some(preferred.to_string()));
    }
    queues.sort_by_key(|q| std::cmp::Reverse(q.len()));
    Ok(queues.first().and_then(|q| q.first()).cloned())
}

/// Waits (bounded) until PipelineRun `pr` has no lock run left (Tekton's garbage collection).
pub async fn wait_lock_runs_gone(client: &Client, ns: &str, pr: &str, within: Duration) -> bool {
    let api: Api<CustomRun> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("tekton.dev/pipelineRun={pr}"));
    wait_until("the lock runs to be gone", within, || {
        let (api, lp) = (api.clone(), lp.clone());
        async move { Ok(api.list(&lp).await?.items.is_empty().then_some(())) }
    })
    .await
    .is_ok()
}

/// What the `Ready` condition of each Mutex of `keys` says now (issue 49: a key that looks
/// stuck is explained there), as `key K Ready: STATUS REASON: MESSAGE`.
pub async fn readiness(client: &Client, ns: &str, keys: &[String]) -> Vec<String> {
    let api: Api<Mutex> = Api::namespaced(client.clone(), ns);
    let mut out = vec![];
    for key in keys {
        let text = match api.get_opt(key).await {
            Ok(Some(m)) => {
                let conditions = m.status.map(|s| s.conditions).unwrap_or_default();
                match conditions.into_iter().find(|c| c.type_ == "Ready") {
                    Some(c) => format!("{} {}: {}", c.status, c.reason, c.message),
                    None => "no Ready condition".into(),
                }
            }
            Ok(None) => "no Mutex".into(),
            Err(e) => format!("unread: {e}"),
        };
        out.push(format!("key {key} Ready: {text}"));
    }
    out
}
