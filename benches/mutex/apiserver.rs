//! The API server's own request counters (`apiserver_request_total` from its /metrics), summed
//! over codes, by resource, subresource and verb: what was written, whoever wrote it.

use anyhow::{Context, Result, bail};
use kube::Client;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Verbs that change something.
const WRITE_VERBS: &[&str] = &[
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters(BTreeMap<(String, String, String, String), f64>);

impl Counters {
    pub async fn scrape(client: &Client) -> Result<Self> {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .context("building the /metrics request")?;
        let text = client
            .request_text(req)
            .await
            .context("reading the apiserver's /metrics")?;
        Ok(Self::parse(&text))
    }

    fn parse(text: &str) -> Self {
        let mut out = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let label = |name: &str| -> String {
                let pat = format!("{name}=\"");
                labels
                    .split(',')
                    .find_map(|l| l.strip_prefix(&pat))
                    .map(|v| v.trim_end_matches('"').to_string())
                    .unwrap_or_default()
            };
            let key = (
                label("resource"),
                label("subresource"),
                label("verb"),
                label("code"),
            );
            *out.entry(key).or_insert(0.0) += value.trim().parse::<f64>().unwrap_or(0.0);
        }
        Self(out)
    }

    /// `self - before`, keeping only what changed.
    pub fn since(&self, before: &Counters) -> Counters {
        let mut out = BTreeMap::new();
        for (k, v) in &self.0 {
            let d = v - before.0.get(k).copied().unwrap_or(0.0);
            if d > 0.0 {
                out.insert(k.clone(), d);
            }
        }
        Counters(out)
    }

    /// The sum of two sets of deltas.
    pub fn plus(&self, other: &Counters) -> Counters {
        let mut out = self.0.clone();
        for (k, v) in &other.0 {
            *out.entry(k.clone()).or_insert(0.0) += v;
        }
        Counters(out)
    }

    /// Writes refused with 409 Conflict, over the controller's kinds.
    pub fn conflicts(&self) -> f64 {
        self.0
            .iter()
            .filter(|((r, _, v, c), _)| {
                (r == "customruns" || r == "mutexes")
                    && c == "409"
                    && WRITE_VERBS.contains(&v.as_str())
            })
            .map(|(_, n)| n)
            .sum::<f64>()
            + 0.0 // an empty f64 sum is -0.0
    }

    /// Writes to `resource`/`subresource` ("" for the object itself), `verbs` or all write verbs.
    pub fn writes(&self, resource: &str, subresource: &str, verbs: &[&str]) -> f64 {
        let verbs = if verbs.is_empty() { WRITE_VERBS } else { verbs };
        self.0
            .iter()
            .filter(|((r, s, v, _), _)| {
                r == resource && s == subresource && verbs.contains(&v.as_str())
            })
            .map(|(_, n)| n)
            .sum::<f64>()
            + 0.0 // an empty f64 sum is -0.0
    }

    /// The writes the controller makes (the benchmark itself only creates and deletes runs):
    /// CustomRun status patches, other CustomRun updates, Mutex status and object writes, the
    /// token ledger's ConfigMaps, Events. Leases are counted too, but the control plane's own
    /// components renew theirs as well, so they stay out of the totals.
    pub fn controller_writes(&self) -> Writes {
        let updates = &["PUT", "PATCH", "APPLY"];
        let any = &["POST", "PUT", "PATCH", "APPLY"];
        Writes {
            configmaps: self.writes("configmaps", "", any),
            leases: self.writes("leases", "", any),
            customrun_status: self.writes("customruns", "status", updates),
            customrun_other: self.writes("customruns", "", updates),
            mutex_status: self.writes("mutexes", "status", updates),
            mutex_object: self.writes("mutexes", "", &["POST", "PUT", "PATCH", "APPLY"]),
            pipelinerun_patches: self.writes("pipelineruns", "", &["PATCH"]),
            events: self.writes("events", "", &["POST", "PUT", "PATCH"]),
            conflicts: self.conflicts(),
        }
    }

    /// Sum of writes to the objects a Mutex workload touches (to see when it has settled; the
    /// API server's own periodic lease and endpoint writes are left out).
    pub fn all_writes(&self) -> f64 {
        const WORKLOAD: &[&str] = &[
            "customruns",
            "mutexes",
            "pipelineruns",
            "taskruns",
            "pods",
            "events",
            "configmaps",
        ];
        self.0
            .iter()
            .filter(|((r, _, v, _), _)| {
                WORKLOAD.contains(&r.as_str()) && WRITE_VERBS.contains(&v.as_str())
            })
            .map(|(_, n)| n)
            .sum::<f64>()
            + 0.0 // an empty f64 sum is -0.0
    }

    pub fn to_json(&self) -> Value {
        let m: serde_json::Map<String, Value> = self
            .0
            .iter()
            .map(|((r, s, v, c), n)| {
                let key = if s.is_empty() {
                    format!("{v} {r} {c}")
                } else {
                    format!("{v} {r}/{s} {c}")
                };
                (key, json!(n))
            })
            .collect();
        Value::Object(m)
    }
}

/// Writes by kind, as counted by the API server.
#[derive(Clone, Copy, Debug, Default)]
pub struct Writes {
    /// The token ledgers (one ConfigMap per namespace, one for the ClusterMutexes).
    pub configmaps: f64,
    /// Every Lease write, whoever made it (the controller's leader Lease among them).
    pub leases: f64,
    pub customrun_status: f64,
    pub customrun_other: f64,
    pub mutex_status: f64,
    pub mutex_object: f64,
    pub pipelinerun_patches: f64,
    pub events: f64,
    /// Of all the above, how many were refused with 409 Conflict.
    pub conflicts: f64,
}

impl Writes {
    /// CustomRun status patches, Mutex status writes and ledger writes: the figure the targets
    /// are set on.
    pub fn status_writes(&self) -> f64 {
        self.customrun_status + self.mutex_status + self.configmaps
    }

    pub fn per(&self, n: f64) -> Writes {
        let d = n.max(1.0);
        Writes {
            configmaps: self.configmaps / d,
            leases: self.leases / d,
            customrun_status: self.customrun_status / d,
            customrun_other: self.customrun_other / d,
            mutex_status: self.mutex_status / d,
            mutex_object: self.mutex_object / d,
            pipelinerun_patches: self.pipelinerun_patches / d,
            events: self.events / d,
            conflicts: self.conflicts / d,
        }
    }

    /// One line for the table.
    pub fn line(&self) -> String {
        format!(
            "{:>7.2}  (CustomRun status {:.2}, Mutex status {:.2}, ledger {:.2}; other: CustomRun {:.2}, Mutex {:.2}, Events {:.2}, Leases of any writer {:.2}; 409s {:.2})",
            self.status_writes(),
            self.customrun_status,
            self.mutex_status,
            self.configmaps,
            self.customrun_other,
            self.mutex_object,
            self.events,
            self.leases,
            self.conflicts
        )
    }

    pub fn to_json(self) -> Value {
        json!({
            "configmaps": self.configmaps,
            "leases": self.leases,
            "customrun_status": self.customrun_status,
            "customrun_other": self.customrun_other,
            "mutex_status": self.mutex_status,
            "mutex_object": self.mutex_object,
            "pipelinerun_patches": self.pipelinerun_patches,
            "events": self.events,
            "conflicts": self.conflicts,
            "status_writes": self.status_writes(),
        })
    }
}

/// Scrapes until no write of any kind has been counted for `quiet` (the controller and Tekton
/// have stopped reacting), at most `timeout`; returns the final counters.
pub async fn settle(client: &Client, quiet: Duration, timeout: Duration) -> Result<Counters> {
    let deadline = Instant::now() + timeout;
    let mut last = Counters::scrape(client).await?;
    let mut since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await; // scrape interval, bounded by timeout
        let now = Counters::scrape(client).await?;
        if now.all_writes() != last.all_writes() {
            last = now;
            since = Instant::now();
        } else if since.elapsed() >= quiet {
            return Ok(now);
        }
        if Instant::now() > deadline {
            bail!("the API server did not settle (writes still counted) within {timeout:?}");
        }
    }
}
