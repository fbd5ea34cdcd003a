//! The campaign's own observations, through its own watches (never the controller's): the deploy
//! steps' marks (ConfigMaps), the removal of TaskRun pods, and at the end every PipelineRun and
//! lock run.

use super::manifest::{LOCK, MARK_LABEL, SECOND_LOCK};
use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex as StdMutex};
use tekton_mutex::model::tekton::customrun::CustomRun;

/// Milliseconds since the Unix epoch (the steps run on this host: one clock).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A start or end mark as the step wrote it.
#[derive(Clone, Debug)]
pub struct Mark {
    pub pr: String,
    /// The deploy task that marked (a multi-key run has one per key).
    pub task: String,
    pub end: bool,
    pub key: String,
    pub group: String,
    pub token: i64,
    /// The step's clock when it marked.
    pub ms: u64,
}

fn mark_of(cm: &ConfigMap) -> Option<Mark> {
    let d = cm.data.as_ref()?;
    let get = |k: &str| d.get(k).cloned().unwrap_or_default();
    Some(Mark {
        pr: get("pr"),
        task: get("task"),
        end: cm.labels().get(MARK_LABEL)? == "end",
        key: get("key"),
        group: get("group"),
        token: get("token").parse().unwrap_or(0),
        ms: get("ms").parse().ok()?,
    })
}

/// A mark's entry in [`Seen::marks`]: its ConfigMap's name and its token.
pub fn mark_name(config_map: &str, token: i64) -> String {
    format!("{config_map}@{token}")
}

#[derive(Default)]
pub struct Seen {
    /// By ConfigMap name and token ([`mark_name`]): the first sighting is kept.
    pub marks: BTreeMap<String, Mark>,
    /// (PipelineRun, pipeline task) -> when our watch saw its TaskRun pod removed.
    pub pods_gone_ms: BTreeMap<(String, String), u64>,
}

/// Background watches of one namespace; they survive API server restarts (watcher backoff).
pub struct Watches {
    pub seen: Arc<StdMutex<Seen>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Watches {
    pub fn start(client: &Client, ns: &str) -> Self {
        let seen = Arc::new(StdMutex::new(Seen::default()));
        let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let s1 = seen.clone();
        let t1 = tokio::spawn(async move {
            let cfg = watcher::Config::default().labels(MARK_LABEL);
            let mut stream = watcher::watcher(cms, cfg).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(Event::Apply(cm) | Event::InitApply(cm)) = ev
                    && let Some(m) = mark_of(&cm)
                {
                    // By token too: after an etcd restore took its marks away, a run granted
                    // again deploys again under the same names.
                    let name = mark_name(&cm.name_any(), m.token);
                    s1.lock().unwrap().marks.entry(name).or_insert(m);
                }
            }
        });
        let s2 = seen.clone();
        let t2 = tokio::spawn(async move {
            let cfg = watcher::Config::default().labels("tekton.dev/pipelineRun");
            let mut stream = watcher::watcher(pods, cfg).default_backoff().boxed();
            while let Some(ev) = stream.next().await {
                if let Ok(Event::Delete(pod)) = ev
                    && let Some(pr) = pod.labels().get("tekton.dev/pipelineRun")
                {
                    let task = pod.labels().get("tekton.dev/pipelineTask");
                    let at = (pr.clone(), task.cloned().unwrap_or_default());
                    s2.lock().unwrap().pods_gone_ms.insert(at, now_ms());
                }
            }
        });
        Watches {
            seen,
            tasks: vec![t1, t2],
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

/// A PipelineRun at the end of a round.
#[derive(Clone, Debug)]
pub struct PrFinal {
    pub done: bool,
    pub reason: Option<String>,
    pub spec_status: Option<String>,
    /// The controller's `tekton-mutex.dev/superseded-by` annotation, if any.
    pub superseded_by: Option<String>,
    /// Its `tekton-mutex.dev/token` annotation (a queued run's grant, or a copy's copied one).
    pub token: Option<String>,
    /// Its `tekton-mutex.dev/key` annotation: a lock took it (or it asked for one).
    pub key: Option<String>,
    /// Its `tekton-mutex.dev/error` annotation: what the controller told it.
    pub error: Option<String>,
    pub created_s: i64,
    pub completion_s: Option<i64>,
}

/// A lock run at the end of a round.
#[derive(Clone, Debug, Default)]
pub struct LockFinal {
    pub status: Option<String>,
    pub reason: Option<String>,
    pub message: Option<String>,
}

pub async fn pipeline_runs(client: &Client, ns: &str) -> Result<BTreeMap<String, PrFinal>> {
    let api = crate::support::dynamic_api(client, Some(ns), "tekton.dev/v1", "PipelineRun").await?;
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|pr| {
            let v = pr.data.clone();
            let text = |p: &str| v.pointer(p).and_then(|x| x.as_str()).map(String::from);
            let cond = v
                .pointer("/status/conditions")
                .and_then(|c| c.as_array())
                .and_then(|c| c.iter().find(|c| c["type"] == "Succeeded"))
                .cloned()
                .unwrap_or_default();
            let ts = |p: &str| {
                text(p)
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .map(|t| t.as_second())
            };
            let fin = PrFinal {
                done: cond["status"] == "True" || cond["status"] == "False",
                reason: cond["reason"].as_str().map(String::from),
                spec_status: text("/spec/status").filter(|s| !s.is_empty()),
                superseded_by: pr
                    .annotations()
                    .get("tekton-mutex.dev/superseded-by")
                    .cloned(),
                token: pr.annotations().get("tekton-mutex.dev/token").cloned(),
                key: pr.annotations().get("tekton-mutex.dev/key").cloned(),
                error: pr.annotations().get("tekton-mutex.dev/error").cloned(),
                created_s: pr
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map_or(0, |t| t.0.as_second()),
                completion_s: ts("/status/completionTime"),
            };
            (pr.name_any(), fin)
        })
        .collect())
}

/// The lock runs of the namespace (of each PipelineRun's `lock` task), by PipelineRun, and the
/// records of the PipelineRuns queued as a whole (the status a lock run would have).
pub async fn lock_runs(client: &Client, ns: &str) -> Result<BTreeMap<String, LockFinal>> {
    let mut locks = lock_tasks(client, ns).await?;
    let api = crate::support::dynamic_api(client, Some(ns), "tekton.dev/v1", "PipelineRun").await?;
    for pr in api.list(&ListParams::default()).await?.items {
        let Some(record) = pr.annotations().get("tekton-mutex.dev/lock-record") else {
            continue;
        };
        let status: tekton_mutex::model::tekton::RunStatus = serde_json::from_str(record)?;
        let cond = status.succeeded().cloned();
        let fin = LockFinal {
            status: cond.as_ref().map(|c| c.status.clone()),
            reason: cond.as_ref().and_then(|c| c.reason.clone()),
            message: cond.and_then(|c| c.message),
        };
        locks.insert(pr.name_any(), fin);
    }
    Ok(locks)
}

async fn lock_tasks(client: &Client, ns: &str) -> Result<BTreeMap<String, LockFinal>> {
    let api: Api<CustomRun> = Api::namespaced(client.clone(), ns);
    let list = api.list(&ListParams::default()).await?;
    let mut out: BTreeMap<String, LockFinal> = BTreeMap::new();
    for cr in list.items {
        let Some(pr) = cr.labels().get("tekton.dev/pipelineRun").cloned() else {
            continue;
        };
        let task = cr.labels().get("tekton.dev/pipelineTask");
        if task.is_some_and(|t| t != LOCK && t != SECOND_LOCK) {
            continue; // a sibling lock task's run
        }
        let cond = cr.status.as_ref().and_then(|s| s.succeeded().cloned());
        let fin = LockFinal {
            status: cond.as_ref().map(|c| c.status.clone()),
            reason: cond.as_ref().and_then(|c| c.reason.clone()),
            message: cond.and_then(|c| c.message),
        };
        // Several lock runs of one PipelineRun (a matrix, or opposite orders): the one that
        // tells most (still open, then failed, then cancelled, then succeeded: a deadlock's
        // victim fails one and Tekton cancels the other).
        match out.get(&pr) {
            Some(seen) if telling(seen) >= telling(&fin) => {}
            _ => {
                out.insert(pr, fin);
            }
        }
    }
    Ok(out)
}

fn telling(l: &LockFinal) -> u8 {
    match (l.status.as_deref(), l.reason.as_deref()) {
        (Some("True"), _) => 0,
        (Some("False"), Some("CustomRunCancelled")) => 1,
        (Some("False"), _) => 2,
        _ => 3,
    }
}
