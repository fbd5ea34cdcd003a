//! The `cluster-tenants` round on the local control plane (plan and checks: tenants.rs): two
//! tenant namespaces, one ClusterMutex of this round's own name allowing both, and a
//! cluster-wide controller (the main round's is namespace-scoped and cannot serve a
//! ClusterMutex), SIGKILLed once in half the rounds. The main round's checker judges the
//! deploys of both namespaces as one key; the fair-share check and figure come on top.

use super::checker::{self, Deploy, RunFacts, Violation};
use super::faults::Replica;
use super::observe::{self, PrFinal, Watches, now_ms};
use super::round::{self, Line, RoundResult};
use super::tenants::{self, Fairness, Grant, SHARED_KEY, TenantsPlan};
use crate::support::controller::install_crd;
use crate::support::{TestNamespace, repo_root, wait_until};
use anyhow::Result;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};
use tekton_mutex::model::cluster_mutex::{ClusterMutex, ClusterMutexSpec};
use tekton_mutex::model::tekton::customrun::CustomRun;

/// What the round set up: the tenants' namespaces (in the plan's order) and the lock.
struct Setup {
    namespaces: Vec<TestNamespace>,
    mutex: String,
    client: Client,
    log_dir: PathBuf,
}

async fn setup(seed: u64, plan: &TenantsPlan) -> Result<Setup> {
    let mut namespaces = vec![];
    for t in &plan.tenants {
        namespaces.push(TestNamespace::create(&format!("chaos-{seed}-{}", t.role)).await?);
    }
    let client = namespaces[0].client();
    // Unique per round (a seed may run twice): the first namespace's unique tail.
    let tail = namespaces[0].name().rsplit('-').next().unwrap_or("x");
    let mutex = format!("chaos-{seed}-shared-{tail}");
    let log_dir = repo_root()
        .join("target/chaos")
        .join(format!("{seed}-tenants-{tail}"));
    std::fs::create_dir_all(&log_dir)?;
    install_crd(&repo_root().join("config/300-crd.yaml")).await?;
    let names: Vec<&str> = namespaces.iter().map(|n| n.name()).collect();
    // Turns by creation across namespaces (no crossNamespacePriority); each tenant may queue
    // all of its runs (no QueueFull in the way of the fairness figure).
    // CHAOS_TENANTS_CROSS_PRIORITY=1, a check of the checker: priority then passes the other
    // tenant's turns, and the fair-share check must catch the busy tenant's urgent runs.
    let cross = std::env::var_os("CHAOS_TENANTS_CROSS_PRIORITY").is_some();
    let spec: ClusterMutexSpec = serde_json::from_value(json!({
        "capacity": 1, "namespaces": names, "maxQueuePerNamespace": 50,
        "crossNamespacePriority": cross}))?;
    let api: Api<ClusterMutex> = Api::all(client.clone());
    api.create(&PostParams::default(), &ClusterMutex::new(&mutex, spec))
        .await?;
    Ok(Setup {
        namespaces,
        mutex,
        client,
        log_dir,
    })
}

/// Deletes the round's ClusterMutex, its finalizer first (its controller is stopped by then).
async fn delete_mutex(client: &Client, name: &str) {
    let api: Api<ClusterMutex> = Api::all(client.clone());
    let no_finalizers = json!({"metadata": {"finalizers": null}});
    let _ = api
        .patch(name, &PatchParams::default(), &Patch::Merge(&no_finalizers))
        .await;
    let _ = api.delete(name, &Default::default()).await;
}

pub async fn run(seed: u64, plan: &TenantsPlan) -> Result<RoundResult> {
    let wall = Instant::now();
    let s = setup(seed, plan).await?;
    let watches: Vec<Watches> = s
        .namespaces
        .iter()
        .map(|n| Watches::start(&s.client, n.name()))
        .collect();
    let timeline = Arc::new(StdMutex::new(Vec::<Line>::new()));
    let t0 = now_ms();
    let note = |text: String| {
        let t = now_ms().saturating_sub(t0);
        timeline.lock().unwrap().push((t, text));
    };
    note(format!(
        "ClusterMutex {} shared by {:?}",
        s.mutex,
        s.namespaces.iter().map(|n| n.name()).collect::<Vec<_>>()
    ));
    let log = |n: usize| s.log_dir.join(format!("controller-cluster-wide-{n}.log"));
    let mut ctl = Some(Replica::start_cluster_wide(&s.mutex, &log(1))?);
    let mut creations = vec![];
    for (t, ns) in plan.tenants.iter().zip(&s.namespaces) {
        let bodies = t.plan.runs.iter().map(|r| {
            let body = tenants::cluster_run(&t.plan, r, &s.mutex);
            (r.at_ms, r.name.clone(), body)
        });
        let (c, tl) = (s.client.clone(), timeline.clone());
        creations.push(round::spawn_bodies(bodies.collect(), c, ns.name(), t0, tl));
    }
    let mut faults = BTreeMap::new();
    if let Some((at, down)) = plan.kill {
        round::sleep_until(t0 + at).await;
        drop(ctl.take()); // SIGKILL
        note("FAULT cluster-wide controller SIGKILL".into());
        tokio::time::sleep(Duration::from_millis(down)).await; // the fault's downtime
        ctl = Some(Replica::start_cluster_wide(&s.mutex, &log(2))?);
        note(format!(
            "FAULT cluster-wide controller restarted (down {down} ms)"
        ));
        faults.insert("controller-kill", 1);
    }
    for c in creations {
        c.await??;
    }
    let stuck = wait_done(plan, &s, t0).await?;
    for (w, ns) in watches.iter().zip(&s.namespaces) {
        round::settle(&s.client, ns.name(), w).await;
    }
    let seen = observe_end(plan, &s, &watches, t0).await?;
    drop(ctl);
    delete_mutex(&s.client, &s.mutex).await;
    faults.insert("cluster-tenants", 1);
    let mut timeline = std::mem::take(&mut *timeline.lock().unwrap());
    let (violations, fairness) = judge(plan, &seen, &stuck, &mut timeline, t0);
    std::fs::write(s.log_dir.join("timeline.txt"), text(&timeline))?;
    Ok(RoundResult {
        seed,
        runs: plan.tenants.iter().map(|t| t.plan.runs.len()).sum(),
        faults,
        violations,
        stuck,
        handovers: vec![],
        timeline,
        wall: wall.elapsed(),
        fairness: Some(fairness),
    })
}

fn text(timeline: &[Line]) -> String {
    let lines: Vec<String> = timeline
        .iter()
        .map(|(t, l)| format!("+{:>7.3}s  {l}", *t as f64 / 1000.0))
        .collect();
    lines.join("\n") + "\n"
}

/// Waits, up to the round's liveness bound, for every run of both tenants to end; returns
/// those that did not (names are unique across the tenants: `c03-busy`).
async fn wait_done(plan: &TenantsPlan, s: &Setup, t0: u64) -> Result<Vec<String>> {
    let deadline = t0 + plan.liveness_bound_ms();
    let pending = || async {
        let mut out = vec![];
        for (t, ns) in plan.tenants.iter().zip(&s.namespaces) {
            let prs = observe::pipeline_runs(&s.client, ns.name())
                .await
                .unwrap_or_default();
            let open = t
                .plan
                .runs
                .iter()
                .filter(|r| prs.get(&r.name).is_none_or(|p| !p.done));
            out.extend(open.map(|r| r.name.clone()));
        }
        out
    };
    let budget = Duration::from_millis(deadline.saturating_sub(now_ms()));
    let done = wait_until("every tenant's PipelineRun to end", budget, || async {
        Ok(pending().await.is_empty().then_some(()))
    })
    .await;
    Ok(if done.is_ok() {
        vec![]
    } else {
        pending().await
    })
}

/// What the round saw at its end, both tenants together (run names are unique across them).
struct Seen {
    deploys: Vec<Deploy>,
    facts: Vec<RunFacts>,
    prs: BTreeMap<String, PrFinal>,
    /// Each run's tenant role, and its lock run's creation (ms since the round started).
    roles: BTreeMap<String, &'static str>,
    joined_ms: BTreeMap<String, u64>,
}

async fn observe_end(plan: &TenantsPlan, s: &Setup, watches: &[Watches], t0: u64) -> Result<Seen> {
    let end_ms = now_ms().saturating_sub(t0);
    let mut seen = Seen {
        deploys: vec![],
        facts: vec![],
        prs: BTreeMap::new(),
        roles: BTreeMap::new(),
        joined_ms: BTreeMap::new(),
    };
    for ((t, ns), w) in plan.tenants.iter().zip(&s.namespaces).zip(watches) {
        let prs = observe::pipeline_runs(&s.client, ns.name()).await?;
        let locks = observe::lock_runs(&s.client, ns.name()).await?;
        let marks = std::mem::take(&mut *w.seen.lock().unwrap());
        let deploys = round::deploys(&marks, t0, end_ms);
        seen.facts
            .extend(round::facts_of(&t.plan, &prs, &locks, &deploys));
        seen.deploys.extend(deploys);
        let api: Api<CustomRun> = Api::namespaced(s.client.clone(), ns.name());
        for cr in api.list(&ListParams::default()).await?.items {
            let pr = cr.labels().get("tekton.dev/pipelineRun").cloned();
            let created = cr.metadata.creation_timestamp.as_ref();
            if let (Some(pr), Some(c)) = (pr, created) {
                let ms = (c.0.as_second() * 1000) as u64;
                seen.joined_ms.insert(pr, ms.saturating_sub(t0));
            }
        }
        for r in &t.plan.runs {
            seen.roles.insert(r.name.clone(), t.role);
        }
        seen.prs.extend(prs);
    }
    Ok(seen)
}

/// The main round's invariants over both tenants' deploys as one key, then the fair-share check
/// and the fairness figure (also written to the timeline).
fn judge(
    plan: &TenantsPlan,
    seen: &Seen,
    stuck: &[String],
    timeline: &mut Vec<Line>,
    t0: u64,
) -> (Vec<Violation>, Fairness) {
    let capacity = BTreeMap::from([(SHARED_KEY.to_string(), 1)]);
    let mut violations = checker::check(&checker::Round {
        capacity: &capacity,
        deploys: &seen.deploys,
        runs: &seen.facts,
        stuck,
        wipes: &[],
        restores: &[],
    });
    let grants = grants(seen, t0);
    let (unfair, most) = tenants::fair_share(&grants, plan.min_hold_ms());
    violations.extend(unfair);
    let fairness = Fairness {
        turn_wait_ms: tenants::turn_waits(&grants),
        most_overtakers: most,
    };
    timeline.extend(round::mark_lines(&seen.deploys));
    timeline.extend(round::completion_lines(&seen.prs, t0));
    timeline.sort();
    let end = timeline.last().map_or(0, |(t, _)| *t);
    timeline.push((end, format!("fairness: {fairness:?}")));
    (violations, fairness)
}

/// Each granted run (a deploy with a token), with its tenant, creation and joining.
fn grants(seen: &Seen, t0: u64) -> Vec<Grant> {
    seen.deploys
        .iter()
        .filter(|d| d.token > 0)
        .filter_map(|d| {
            let pr = seen.prs.get(&d.pr)?;
            let created_ms = ((pr.created_s * 1000) as u64).saturating_sub(t0);
            Some(Grant {
                role: seen.roles.get(&d.pr)?.to_string(),
                pr: d.pr.clone(),
                created_ms,
                join_ms: seen.joined_ms.get(&d.pr).copied().unwrap_or(created_ms),
                grant_ms: d.start_ms,
                token: d.token,
            })
        })
        .collect()
}
