//! An independent record of what the benchmark's objects did, from our own watches (never from
//! the controller): for each object, the wall-clock time at which each milestone was first seen.

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Seconds since the Unix epoch, as f64: comparable with `date +%s%N` written by steps.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    CustomRun,
    PipelineRun,
    TaskRun,
    Pod,
    Lease,
}

impl Kind {
    fn api_version_kind(self) -> (&'static str, &'static str) {
        match self {
            Kind::CustomRun => ("tekton.dev/v1beta1", "CustomRun"),
            Kind::PipelineRun => ("tekton.dev/v1", "PipelineRun"),
            Kind::TaskRun => ("tekton.dev/v1", "TaskRun"),
            Kind::Pod => ("v1", "Pod"),
            Kind::Lease => ("coordination.k8s.io/v1", "Lease"),
        }
    }
}

/// One observed change, reduced to what the analyses read.
#[derive(Clone, Debug)]
pub struct Obs {
    pub at: f64,
    pub kind: Kind,
    pub name: String,
    pub pipeline_task: Option<String>,
    pub reason: Option<String>,
    pub done: bool,
    pub phase: Option<String>,
    pub deleted: bool,
}

impl Obs {
    fn from(kind: Kind, obj: &DynamicObject, deleted: bool) -> Self {
        let label = |k: &str| obj.labels().get(k).cloned();
        let succeeded = obj
            .data
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Succeeded"));
        let status = succeeded.and_then(|c| c["status"].as_str());
        Obs {
            at: now(),
            kind,
            name: obj.name_any(),
            pipeline_task: label("tekton.dev/pipelineTask"),
            reason: succeeded.and_then(|c| c["reason"].as_str().map(String::from)),
            done: matches!(status, Some("True" | "False")),
            phase: obj
                .data
                .pointer("/status/phase")
                .and_then(Value::as_str)
                .map(String::from),
            deleted,
        }
    }

    /// The milestones this observation shows: "seen", "reason:R", "done", "phase:P", "deleted".
    fn milestones(&self) -> Vec<String> {
        let mut m = vec!["seen".to_string()];
        if let Some(r) = &self.reason {
            m.push(format!("reason:{r}"));
        }
        if self.done {
            m.push("done".into());
        }
        if let Some(p) = &self.phase {
            m.push(format!("phase:{p}"));
        }
        if self.deleted {
            m.push("deleted".into());
        }
        m
    }
}

#[derive(Default)]
struct State {
    log: Vec<Obs>,
    keep_log: bool,
    firsts: HashMap<(Kind, String, String), f64>,
    counts: HashMap<(Kind, String), usize>,
}

/// Watches some kinds in one namespace and records first-seen times of milestones.
pub struct Recorder {
    state: Arc<Mutex<State>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Recorder {
    /// Starts the watches and waits until each has listed what exists. `keep_log` keeps every
    /// observation in order (for hop-by-hop analyses); otherwise only first-seen times.
    pub async fn start(client: &Client, ns: &str, kinds: &[Kind], keep_log: bool) -> Result<Self> {
        let state = Arc::new(Mutex::new(State {
            keep_log,
            ..Default::default()
        }));
        let synced = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for &kind in kinds {
            let (av, k) = kind.api_version_kind();
            let api: Api<DynamicObject> = super::support::dynamic_api(client, Some(ns), av, k)
                .await
                .with_context(|| format!("watching {k}"))?;
            let (state, synced) = (state.clone(), synced.clone());
            tasks.push(tokio::spawn(async move {
                let mut s = watcher(api, watcher::Config::default())
                    .default_backoff()
                    .boxed();
                while let Some(ev) = s.next().await {
                    match ev {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => {
                            record(&state, Obs::from(kind, &o, false))
                        }
                        Ok(watcher::Event::Delete(o)) => record(&state, Obs::from(kind, &o, true)),
                        Ok(watcher::Event::InitDone) => {
                            synced.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => {}
                    }
                }
            }));
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while synced.load(Ordering::SeqCst) < kinds.len() {
            if Instant::now() > deadline {
                bail!("the benchmark's own watches did not sync within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // bounded poll
        }
        Ok(Self { state, tasks })
    }

    /// When `milestone` was first seen on `kind` `name`.
    pub fn first(&self, kind: Kind, name: &str, milestone: &str) -> Option<f64> {
        let s = self.state.lock().unwrap();
        s.firsts
            .get(&(kind, name.to_string(), milestone.to_string()))
            .copied()
    }

    /// How many objects of `kind` have shown `milestone`.
    pub fn count(&self, kind: Kind, milestone: &str) -> usize {
        let s = self.state.lock().unwrap();
        s.counts
            .get(&(kind, milestone.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// Names of objects of `kind` that have shown `milestone`, with the time first seen.
    pub fn with(&self, kind: Kind, milestone: &str) -> Vec<(String, f64)> {
        let s = self.state.lock().unwrap();
        s.firsts
            .iter()
            .filter(|((k, _, m), _)| *k == kind && m == milestone)
            .map(|((_, n, _), t)| (n.clone(), *t))
            .collect()
    }

    /// Every observation so far, in arrival order (empty unless `keep_log`).
    pub fn log(&self) -> Vec<Obs> {
        self.state.lock().unwrap().log.clone()
    }

    /// Waits (polling our own in-memory record every `poll`) until `cond` holds.
    pub async fn wait(
        &self,
        desc: &str,
        timeout: Duration,
        poll: Duration,
        mut cond: impl FnMut(&Self) -> bool,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !cond(self) {
            if Instant::now() > deadline {
                bail!("timed out after {timeout:?} waiting for {desc}");
            }
            tokio::time::sleep(poll).await; // poll of an in-memory condition, bounded
        }
        Ok(())
    }
}

fn record(state: &Arc<Mutex<State>>, obs: Obs) {
    let mut s = state.lock().unwrap();
    for m in obs.milestones() {
        let key = (obs.kind, obs.name.clone(), m.clone());
        if let std::collections::hash_map::Entry::Vacant(e) = s.firsts.entry(key) {
            e.insert(obs.at);
            *s.counts.entry((obs.kind, m)).or_default() += 1;
        }
    }
    if s.keep_log {
        s.log.push(obs);
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}
