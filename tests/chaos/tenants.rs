//! The `cluster-tenants` round (issue 46): two tenant namespaces share one ClusterMutex
//! (capacity 1). The busy tenant keeps sending runs that claim to be newer and more urgent
//! (`sequence`, `priority`); the sparse one sends a few plain runs now and then. The plan and
//! the fairness checks are pure; tests/chaos/tenants_round.rs runs it.
//!
//! The fair-share rule (crates/core/src/decide/fair_share.rs, `crossNamespacePriority` off):
//! `sequence` and `priority` order a namespace's own runs only; across namespaces each one's
//! next run takes its turn by its PipelineRun's creation. So a run is never granted after a run
//! of another namespace created later than it, once it waits: such an *overtaker* can only
//! have been granted before its lock run joined the queue (or before the controller saw it).
//! Capacity 1 and holds at least as long as the shortest deploy bound how many grants fit in
//! that window: see [`overtaker_bound`].

use super::checker::{Invariant, Violation};
use super::manifest;
use super::plan::{CANCEL_MODES, GroupPlan, KeyPlan, Knobs, RoundPlan, RunPlan, Shape, Supersede};
use super::plan::{FaultKind, rng};
use proptest::prelude::RngExt;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// The key the deploys mark (the ClusterMutex's name is the round's own, see tenants_round.rs).
pub const SHARED_KEY: &str = "shared";
pub const BUSY: &str = "busy";
pub const SPARSE: &str = "sparse";

/// One tenant: its role (`busy`, `sparse`) and its runs, as a one-key round plan (so the
/// manifests and the run facts are the main round's).
#[derive(Clone, Debug)]
pub struct Tenant {
    pub role: &'static str,
    pub plan: RoundPlan,
}

#[derive(Clone, Debug)]
pub struct TenantsPlan {
    pub tenants: Vec<Tenant>,
    /// The cluster-wide controller SIGKILLed at `.0` ms, started again `.1` ms later.
    pub kill: Option<(u64, u64)>,
}

impl TenantsPlan {
    /// How long every run may take before it counts as stuck: every hold one after another
    /// (both tenants share one slot) with each run's overhead, the downtime and a margin.
    pub fn liveness_bound_ms(&self) -> u64 {
        const PER_RUN_OVERHEAD_MS: u64 = 6_000;
        const MARGIN_MS: u64 = 90_000;
        let runs = self.tenants.iter().flat_map(|t| &t.plan.runs);
        let work: u64 = runs
            .clone()
            .map(|r| r.deploy_ms + PER_RUN_OVERHEAD_MS)
            .sum();
        let last = runs.map(|r| r.at_ms).max().unwrap_or(0);
        last + work + self.kill.map_or(0, |(_, down)| down) + MARGIN_MS
    }

    /// The shortest hold: a grant lasts at least its deploy.
    pub fn min_hold_ms(&self) -> u64 {
        let runs = self.tenants.iter().flat_map(|t| &t.plan.runs);
        runs.map(|r| r.deploy_ms).min().unwrap_or(1_000)
    }
}

/// The tenants' round of `seed`, if the knobs allow it: always when it is the only kind asked
/// for, else one round in three. Drawn from an RNG of its own, so the main round stays as it was.
pub fn draw(seed: u64, knobs: &Knobs) -> Option<TenantsPlan> {
    if !knobs.faults.contains(&FaultKind::ClusterTenants) {
        return None;
    }
    let mut rng = rng(seed ^ 0x7465_6e61_6e74_7300);
    let alone = knobs.faults.iter().all(|k| !k.in_main_round());
    if !alone && !rng.random_bool(1.0 / 3.0) {
        return None;
    }
    // The busy tenant: a burst at once, then a stream; most runs claim a newer build or a
    // higher priority than the last.
    let busy_n = rng.random_range(14..=18usize);
    let mut busy_at: Vec<u64> = (0..busy_n)
        .map(|i| {
            if i < 5 {
                rng.random_range(0..2_000)
            } else {
                rng.random_range(2_000..45_000)
            }
        })
        .collect();
    busy_at.sort_unstable();
    let busy: Vec<RunPlan> = busy_at
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            let mut r = run(
                &format!("c{i:02}-{BUSY}"),
                at,
                rng.random_range(1_500..=3_500),
            );
            r.sequence = rng.random_bool(0.7).then(|| rng.random_range(100..=200));
            r.priority = if rng.random_bool(0.5) {
                rng.random_range(1..=3)
            } else {
                0
            };
            r
        })
        .collect();
    // The sparse tenant: a few plain runs, each while the busy one has a queue.
    let mut sparse_at: Vec<u64> = (0..rng.random_range(4..=5usize))
        .map(|_| rng.random_range(3_000..50_000))
        .collect();
    sparse_at.sort_unstable();
    let sparse = sparse_at
        .into_iter()
        .enumerate()
        .map(|(i, at)| {
            run(
                &format!("c{i:02}-{SPARSE}"),
                at,
                rng.random_range(1_500..=3_500),
            )
        })
        .collect();
    let kill = rng.random_bool(0.5).then(|| {
        (
            rng.random_range(10_000..40_000),
            rng.random_range(1_000..=5_000),
        )
    });
    let tenants = [(BUSY, busy), (SPARSE, sparse)]
        .into_iter()
        .map(|(role, runs)| Tenant {
            role,
            plan: tenant_plan(seed, role, runs, knobs.unguarded),
        })
        .collect();
    Some(TenantsPlan { tenants, kill })
}

fn run(name: &str, at_ms: u64, deploy_ms: u64) -> RunPlan {
    RunPlan {
        name: name.to_string(),
        group: 0,
        at_ms,
        sequence: None,
        priority: 0,
        wait: true,
        cancel_mode: CANCEL_MODES[0],
        lock_timeout_s: None,
        retries: 0,
        pipeline_timeout_s: None,
        deploy_ms,
        term_extra_ms: 0,
        shape: Shape::Plain,
    }
}

fn tenant_plan(seed: u64, role: &'static str, runs: Vec<RunPlan>, unguarded: bool) -> RoundPlan {
    RoundPlan {
        seed,
        unguarded,
        keys: vec![KeyPlan {
            name: SHARED_KEY.into(),
            capacity: 1,
            order: None,
            selecting: false,
        }],
        // Supersede none: every run is granted in the end, which the fairness figure needs.
        groups: vec![GroupPlan {
            name: role.into(),
            key: 0,
            supersede: Supersede::None,
        }],
        runs,
        faults: vec![],
        probes: vec![],
        tenants: None,
    }
}

/// A tenant's PipelineRun: the main round's manifest with its lock task aimed at the
/// ClusterMutex `mutex` (which the taskRef names: no `key` param).
pub fn cluster_run(plan: &RoundPlan, run: &RunPlan, mutex: &str) -> Value {
    let mut body = manifest::pipeline_run(plan, run);
    let tasks = body["spec"]["pipelineSpec"]["tasks"].as_array_mut();
    for task in tasks.into_iter().flatten() {
        if task["name"] != manifest::LOCK {
            continue;
        }
        task["taskRef"] = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": mutex});
        if let Some(params) = task["params"].as_array_mut() {
            params.retain(|p| p["name"] != "key");
        }
    }
    body
}

/// The fairness figure of a round (see [`turn_waits`]) and the most runs of other tenants
/// created later that passed one run.
#[derive(Clone, Debug, Default)]
pub struct Fairness {
    pub turn_wait_ms: BTreeMap<String, u64>,
    pub most_overtakers: usize,
}

/// One granted run, as observed: times in ms since the round started.
#[derive(Clone, Debug)]
pub struct Grant {
    pub role: String,
    pub pr: String,
    /// Its PipelineRun's creation (second resolution, as the API server keeps it).
    pub created_ms: u64,
    /// Its lock run's creation (second resolution): when it joined the queue.
    pub join_ms: u64,
    /// Its deploy's start mark: the grant, seen by the step it guards.
    pub grant_ms: u64,
    pub token: i64,
}

/// The fairness figure: per tenant, the longest its earliest waiter waited for the tenant's
/// next grant (from the later of its joining and the tenant's previous grant).
pub fn turn_waits(grants: &[Grant]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let roles: BTreeSet<&str> = grants.iter().map(|g| g.role.as_str()).collect();
    for role in roles {
        let mut own: Vec<&Grant> = grants.iter().filter(|g| g.role == role).collect();
        own.sort_by_key(|g| g.grant_ms);
        let mut previous = 0;
        let mut longest = 0;
        for g in &own {
            // The earliest of the tenant's runs waiting at this grant (itself included).
            let earliest = own
                .iter()
                .filter(|o| o.join_ms <= g.grant_ms && o.grant_ms >= g.grant_ms)
                .map(|o| o.join_ms)
                .min()
                .unwrap_or(g.join_ms);
            longest = longest.max(g.grant_ms.saturating_sub(earliest.max(previous)));
            previous = g.grant_ms;
        }
        out.insert(role.to_string(), longest);
    }
    out
}

/// How many runs of other tenants created after `g` may be granted before it: those granted
/// between its creation and its joining the queue (plus a second for the controller to see
/// it), one at a time, each holding at least `min_hold_ms`; and one already granted as it
/// was created.
pub fn overtaker_bound(g: &Grant, min_hold_ms: u64) -> usize {
    let window = g.join_ms.saturating_sub(g.created_ms) + 1_000;
    1 + (window / min_hold_ms.max(1)) as usize
}

/// Runs of another tenant created (a later second) after `g`, granted (a lower token) before it.
pub fn overtakers<'a>(g: &Grant, grants: &'a [Grant]) -> Vec<&'a Grant> {
    grants
        .iter()
        .filter(|o| {
            o.role != g.role && o.token < g.token && o.created_ms / 1000 > g.created_ms / 1000
        })
        .collect()
}

/// The fair-share check: no run of the sparse tenant is overtaken by more runs of other tenants
/// than [`overtaker_bound`] lets through. Only the sparse tenant's: its runs claim nothing, so
/// its own line is by creation and each run is its line's head once the older ones are
/// granted. A busy run may rightly be passed by later runs of the sparse tenant while its own
/// tenant's newer, more urgent runs stand before it. Returns the violations and the most
/// overtakers seen.
pub fn fair_share(grants: &[Grant], min_hold_ms: u64) -> (Vec<Violation>, usize) {
    let mut out = vec![];
    let mut most = 0;
    for g in grants.iter().filter(|g| g.role == SPARSE) {
        let over = overtakers(g, grants);
        most = most.max(over.len());
        let bound = overtaker_bound(g, min_hold_ms);
        if over.len() > bound {
            let names: Vec<&str> = over.iter().map(|o| o.pr.as_str()).collect();
            out.push(Violation {
                invariant: Invariant::FairShare,
                key: SHARED_KEY.into(),
                at_ms: g.grant_ms,
                detail: format!(
                    "{} ({}, token {}) was granted after {} runs of other tenants created after it \
                     (bound {bound}): {names:?}",
                    g.pr,
                    g.role,
                    g.token,
                    over.len()
                ),
            });
        }
    }
    (out, most)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs(faults: &[FaultKind]) -> Knobs {
        Knobs {
            min_runs: 20,
            max_runs: 24,
            faults: faults.iter().copied().collect::<BTreeSet<_>>(),
            unguarded: false,
        }
    }

    fn grant(
        role: &str,
        pr: &str,
        created_s: u64,
        join_s: u64,
        grant_ms: u64,
        token: i64,
    ) -> Grant {
        Grant {
            role: role.into(),
            pr: pr.into(),
            created_ms: created_s * 1000,
            join_ms: join_s * 1000,
            grant_ms,
            token,
        }
    }

    #[test]
    fn alone_it_is_always_drawn_and_the_main_round_has_no_runs() {
        let k = knobs(&[FaultKind::ClusterTenants]);
        for seed in 1..20 {
            let p = super::super::plan::draw(seed, &k);
            let t = p.tenants.as_ref().expect("drawn");
            assert!(p.runs.is_empty(), "seed {seed}");
            assert_eq!(t.tenants.len(), 2);
            let busy = &t.tenants[0].plan.runs;
            let sparse = &t.tenants[1].plan.runs;
            assert!(busy.len() >= 14 && sparse.len() >= 4 && sparse.len() < busy.len());
            assert!(busy.iter().any(|r| r.priority > 0 || r.sequence.is_some()));
        }
        assert!(draw(1, &knobs(&[FaultKind::UserCancel])).is_none());
    }

    #[test]
    fn a_tenants_run_takes_the_cluster_mutex_by_name() {
        let t = draw(7, &knobs(&[FaultKind::ClusterTenants])).unwrap();
        let plan = &t.tenants[0].plan;
        let body = cluster_run(plan, &plan.runs[0], "chaos-x");
        let lock = &body["spec"]["pipelineSpec"]["tasks"][0];
        assert_eq!(lock["taskRef"]["kind"], "ClusterMutex");
        assert_eq!(lock["taskRef"]["name"], "chaos-x");
        let params = lock["params"].as_array().unwrap();
        assert!(params.iter().all(|p| p["name"] != "key"), "{params:?}");
    }

    #[test]
    fn turn_waits_measure_from_the_earliest_waiter_or_the_previous_grant() {
        let g = [
            grant(BUSY, "b1", 0, 0, 1_000, 1),
            grant(BUSY, "b2", 0, 1, 20_000, 3),
            grant(SPARSE, "s1", 5, 6, 10_000, 2),
        ];
        let w = turn_waits(&g);
        assert_eq!(w[BUSY], 19_000); // b2 waited from b1's grant
        assert_eq!(w[SPARSE], 4_000);
    }

    /// The check can fail: a busy tenant whose later runs pass the sparse one's (as with
    /// priority across namespaces) is caught; one that was granted before it joined is not.
    #[test]
    fn a_tenant_overtaken_beyond_the_bound_is_a_violation() {
        let mut g = vec![grant(SPARSE, "s1", 10, 11, 40_000, 9)];
        for i in 0..4 {
            g.push(grant(
                BUSY,
                &format!("b{i}"),
                12 + i,
                12 + i,
                15_000 + i * 5_000,
                5 + i as i64,
            ));
        }
        let (v, most) = fair_share(&g, 3_000);
        assert_eq!(most, 4);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(v[0].invariant, Invariant::FairShare);
        // Only one overtaker, granted as s1 was still on its way to the queue: within the bound.
        let (v, most) = fair_share(&g[..2], 3_000);
        assert_eq!((v.len(), most), (0, 1));
        // A busy run passed by later sparse runs: its own tenant's claims put it behind.
        let g = [
            grant(BUSY, "b0", 1, 1, 30_000, 9),
            grant(SPARSE, "s1", 5, 5, 10_000, 2),
            grant(SPARSE, "s2", 8, 8, 20_000, 5),
        ];
        let (v, most) = fair_share(&g, 3_000);
        assert_eq!((v.len(), most), (0, 0));
    }
}
