//! An independent record of what happened in a namespace: every CustomRun and
//! PipelineRun change, from our own watches (not from the controller), ordered
//! by resourceVersion. etcd revisions are global, so this order is the order
//! in which the API server accepted the writes, across both kinds.

use anyhow::{Result, bail};
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tekton_mutex::model::tekton::customrun::CustomRun;
use tekton_mutex::model::tekton::pipelinerun::PipelineRun;

#[derive(Clone, Debug)]
pub enum Change {
    /// A lock CustomRun of PipelineRun `pipeline_run` now has this Succeeded reason.
    Run {
        name: String,
        pipeline_run: String,
        reason: Option<String>,
        token: Option<i64>,
    },
    /// A PipelineRun finished (done = true) or was deleted.
    Parent {
        name: String,
        done: bool,
        deleted: bool,
    },
}

#[derive(Clone, Debug)]
pub struct Entry {
    pub rv: u64,
    pub at: Instant,
    pub change: Change,
}

#[derive(Clone, Debug)]
pub struct Grant {
    pub pipeline_run: String,
    pub token: i64,
    pub rv: u64,
    pub at: Instant,
}

pub struct Timeline {
    entries: Arc<Mutex<Vec<Entry>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Timeline {
    /// Starts watching. Call before creating the runs.
    pub fn start(client: Client, namespace: &str) -> Self {
        let entries = Arc::new(Mutex::new(Vec::new()));
        let crs: Api<CustomRun> = Api::namespaced(client.clone(), namespace);
        let prs: Api<PipelineRun> = Api::namespaced(client, namespace);
        let e1 = entries.clone();
        let t1 = tokio::spawn(async move {
            let mut s = watcher::watcher(crs, watcher::Config::default()).boxed();
            while let Some(ev) = s.next().await {
                if let Ok(Event::Apply(cr) | Event::InitApply(cr)) = ev {
                    let st = cr.status.clone().unwrap_or_default();
                    let change = Change::Run {
                        name: cr.name_any(),
                        pipeline_run: cr
                            .labels()
                            .get("tekton.dev/pipelineRun")
                            .cloned()
                            .unwrap_or_else(|| cr.name_any()),
                        reason: st.succeeded().and_then(|c| c.reason.clone()),
                        token: st.result("token").and_then(|t| t.parse().ok()),
                    };
                    push(&e1, &cr, change);
                }
            }
        });
        let e2 = entries.clone();
        let t2 = tokio::spawn(async move {
            let mut s = watcher::watcher(prs, watcher::Config::default()).boxed();
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(Event::Apply(pr) | Event::InitApply(pr)) => {
                        let change = Change::Parent {
                            name: pr.name_any(),
                            done: pr.is_done(),
                            deleted: false,
                        };
                        push(&e2, &pr, change);
                    }
                    Ok(Event::Delete(pr)) => {
                        let change = Change::Parent {
                            name: pr.name_any(),
                            done: true,
                            deleted: true,
                        };
                        push(&e2, &pr, change);
                    }
                    _ => {}
                }
            }
        });
        Timeline {
            entries,
            tasks: vec![t1, t2],
        }
    }

    /// A timeline of these entries, watching nothing: for testing the checks themselves.
    pub fn from_entries(entries: Vec<Entry>) -> Self {
        Timeline {
            entries: Arc::new(Mutex::new(entries)),
            tasks: Vec::new(),
        }
    }

    pub fn entries(&self) -> Vec<Entry> {
        let mut v = self.entries.lock().unwrap().clone();
        v.sort_by_key(|e| e.rv);
        v
    }

    /// Replays the history in API-server order and checks that no more than
    /// `capacity` PipelineRuns ever held the slot at once: a PipelineRun holds
    /// from its lock run turning Acquired until the PipelineRun is done or gone.
    /// Returns the grants in order.
    pub fn check_exclusion(&self, capacity: usize) -> Result<Vec<Grant>> {
        self.check_exclusion_among(capacity, |_| true)
    }

    /// [`Self::check_exclusion`] among the PipelineRuns `among` accepts: those that take one key,
    /// when PipelineRuns on other keys hold at the same time.
    pub fn check_exclusion_among(
        &self,
        capacity: usize,
        among: impl Fn(&str) -> bool,
    ) -> Result<Vec<Grant>> {
        let mut holding = BTreeSet::new();
        let mut granted = BTreeSet::new();
        let mut grants = Vec::new();
        for e in self.entries() {
            match &e.change {
                Change::Run {
                    pipeline_run,
                    reason: Some(r),
                    token,
                    ..
                } if r == "Acquired"
                    && among(pipeline_run)
                    && granted.insert(pipeline_run.clone()) =>
                {
                    holding.insert(pipeline_run.clone());
                    let Some(token) = *token else {
                        bail!("{pipeline_run} acquired without a token")
                    };
                    grants.push(Grant {
                        pipeline_run: pipeline_run.clone(),
                        token,
                        rv: e.rv,
                        at: e.at,
                    });
                    if holding.len() > capacity {
                        bail!(
                            "{} PipelineRuns held the slot at once at rv {}: {holding:?}",
                            holding.len(),
                            e.rv
                        );
                    }
                }
                Change::Parent {
                    name, done: true, ..
                } => {
                    holding.remove(name);
                }
                _ => {}
            }
        }
        Ok(grants)
    }

    /// For each grant that followed a release, the time from the release
    /// (the previous holder's PipelineRun seen done) to the grant being seen.
    pub fn handover_latencies(&self) -> Vec<std::time::Duration> {
        let entries = self.entries();
        let mut last_release: Option<(u64, Instant)> = None;
        let mut granted = BTreeSet::new();
        let mut out = Vec::new();
        for e in &entries {
            match &e.change {
                Change::Parent {
                    done: true, name, ..
                } if granted.contains(name) => {
                    last_release.get_or_insert((e.rv, e.at));
                }
                Change::Run {
                    pipeline_run,
                    reason: Some(r),
                    ..
                } if r == "Acquired" && granted.insert(pipeline_run.clone()) => {
                    if let Some((_, at)) = last_release.take() {
                        out.push(e.at.saturating_duration_since(at));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The last Succeeded reason seen for each lock run, by PipelineRun.
    pub fn final_reasons(&self) -> std::collections::BTreeMap<String, Option<String>> {
        let mut out = std::collections::BTreeMap::new();
        for e in self.entries() {
            if let Change::Run {
                pipeline_run,
                reason,
                ..
            } = e.change
            {
                out.insert(pipeline_run, reason);
            }
        }
        out
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn push<K: ResourceExt>(entries: &Arc<Mutex<Vec<Entry>>>, obj: &K, change: Change) {
    let rv = obj
        .resource_version()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    entries.lock().unwrap().push(Entry {
        rv,
        at: Instant::now(),
        change,
    });
}

impl Timeline {
    /// For each lock run, the time from its creation being seen to its first
    /// status (any reason) being seen.
    pub fn first_status_latencies(&self) -> Vec<std::time::Duration> {
        let mut created = std::collections::BTreeMap::new();
        let mut out = Vec::new();
        for e in self.entries() {
            if let Change::Run { name, reason, .. } = &e.change {
                match reason {
                    None => {
                        created.entry(name.clone()).or_insert(e.at);
                    }
                    Some(_) => {
                        if let Some(t) = created.remove(name) {
                            out.push(e.at.saturating_duration_since(t));
                        }
                    }
                }
            }
        }
        out
    }
}

/// Prints latency figures (a measurement to report, never an assertion).
pub fn report_latencies(what: &str, lat: &[std::time::Duration]) {
    if lat.is_empty() {
        return;
    }
    let mut ms: Vec<f64> = lat.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    eprintln!(
        "MEASUREMENT {what}: over {} samples: mean {:.0} ms, median {:.0} ms, max {:.0} ms",
        ms.len(),
        mean,
        ms[ms.len() / 2],
        ms[ms.len() - 1]
    );
}
