//! One run of a scenario under one plan: the world acts phase by phase, and
//! after each phase Tekton and the controller go on until the system is quiet
//! (a step in which the world changed nothing, and the controller changed
//! nothing and failed nothing: a write the API server refused changes nothing,
//! and the level-triggered passes would repeat it where the product, woken by
//! events only, would not). A crash plan kills the first incarnation after its
//! n-th write; the harness restarts it from an empty cache, as often as needed.

use super::api_server::ApiServer;
use super::fault::Write;
use super::incarnation::{Incarnation, Target};
use super::oracle::{self, Facts};
use super::scenarios::Scenario;
use super::store::Change;
use super::watch::{Delivery, Fired, Next, Watch, WatchPlan, current_objects};
use super::world::World;
use crate::metrics::write_sites;
use std::sync::Arc;

/// Steps a phase may take to go quiet; far more than any scenario needs.
const MAX_STEPS: usize = 80;

#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The i-th incarnation dies once its `crashes[i]`-th write has reached the
    /// API server; the incarnations after these run until the end.
    pub crashes: Vec<usize>,
    pub watch: WatchPlan,
}

impl Plan {
    pub const NONE: Plan = Plan {
        crashes: Vec::new(),
        watch: WatchPlan::None,
    };
}

/// Everything a run leaves for the report and the checks.
pub struct Record {
    /// Every write of every incarnation, in order.
    pub writes: Vec<Write>,
    pub deliveries: Vec<Delivery>,
    pub restarts: usize,
    pub fired: Fired,
    pub violations: Vec<String>,
    pub summary: Vec<String>,
    pub log: Vec<Change>,
}

struct Harness {
    server: Arc<ApiServer>,
    crashes: Vec<usize>,
    inc: Option<Incarnation>,
    watch: Watch,
    writes: Vec<Write>,
    restarts: usize,
}

pub async fn run(scenario: &Scenario, plan: &Plan) -> Record {
    write_sites::record();
    let server = ApiServer::new();
    let mut world = World::default();
    let mut h = Harness {
        inc: Some(Incarnation::start(
            &server,
            0,
            plan.crashes.first().copied(),
            &[],
            0,
        )),
        server,
        crashes: plan.crashes.clone(),
        watch: Watch::new(plan.watch.clone()),
        writes: Vec::new(),
        restarts: 0,
    };
    let mut violations = Vec::new();
    for (i, phase) in scenario.phases.iter().enumerate() {
        for action in phase {
            world.act(&mut h.server.store(), action);
        }
        if let Err(stuck) = h.settle(&mut world).await {
            violations.push(format!("phase {i}: {stuck}"));
            break;
        }
        let store = h.server.store();
        let grants = oracle::grants(store.log());
        let facts = scenario.facts(&world);
        let end = i + 1 == scenario.phases.len();
        violations.extend(
            oracle::lost_waiters(&store, &grants, &facts, end)
                .into_iter()
                .map(|v| format!("phase {i}: {v}")),
        );
    }
    h.finish(scenario, &world, violations).await
}

impl Harness {
    fn inc(&self) -> &Incarnation {
        self.inc.as_ref().expect("a controller is running")
    }

    /// Steps until quiet; Err if the phase never settles.
    async fn settle(&mut self, world: &mut World) -> Result<(), String> {
        let mut last = String::new();
        for _ in 0..MAX_STEPS {
            let changed = world.tekton(&mut self.server.store());
            let (writes, errors, crashed) = self.pass().await;
            if crashed {
                self.restart(None).await;
                continue;
            }
            // A stale object served or restored this pass: the next pass must see the cache as it is now.
            let busy = self.watch.busy();
            let next = {
                let store = self.server.store();
                let inc = self.inc.as_mut().expect("a controller is running");
                self.watch.after_pass(&mut inc.feed, &store)
            };
            if let Next::Restart(listing) = next {
                self.restart(Some(listing)).await;
                continue;
            }
            let quiet = !changed && writes == 0 && errors.is_empty() && !busy && !self.watch.busy();
            if quiet {
                let inc = self.inc.as_mut().expect("a controller is running");
                if self.watch.release_held(&mut inc.feed) {
                    continue;
                }
                return Ok(());
            }
            last = errors.join("; ");
        }
        Err(format!(
            "not quiet after {MAX_STEPS} steps (last errors: {last})"
        ))
    }

    /// One pass of every reconciler: (writes, errors, crashed).
    async fn pass(&mut self) -> (usize, Vec<String>, bool) {
        let before = self.inc().line.landed_count();
        let mut errors = Vec::new();
        for section in 0..3 {
            self.deliver();
            let inc = self.inc();
            let targets: Vec<Target> = match section {
                0 => inc.intake_targets().into_iter().map(Target::Run).collect(),
                1 => inc.mutex_targets().into_iter().map(Target::Mutex).collect(),
                _ => inc
                    .cluster_targets()
                    .into_iter()
                    .map(Target::Cluster)
                    .collect(),
            };
            for t in targets {
                self.deliver();
                let result = self.inc().reconcile(&t).await;
                drain(1).await;
                self.check_clean(&t);
                if let Some(Err(e)) = result {
                    errors.push(format!("{t:?}: {e}"));
                }
                if self.inc().line.dead() {
                    return (0, errors, true);
                }
            }
        }
        (self.inc().line.landed_count() - before, errors, false)
    }

    fn deliver(&mut self) {
        let store = self.server.store();
        let inc = self.inc.as_mut().expect("a controller is running");
        self.watch.deliver(&mut inc.feed, store.log());
    }

    /// Nothing this fake cannot answer was asked, and every announced write was sent.
    fn check_clean(&self, t: &Target) {
        let unmodelled = self.server.unmodelled();
        assert!(unmodelled.is_empty(), "reconciling {t:?}: {unmodelled:#?}");
        let pending = write_sites::pending();
        assert!(
            pending.is_empty(),
            "reconciling {t:?}: writes announced and never sent: {pending:#?}"
        );
    }

    /// The process is gone; a new one starts with empty memos and caches
    /// listed afresh (from `listing`, a lagging server's list, if given).
    async fn restart(
        &mut self,
        listing: Option<
            Vec<(
                crate::controller::tests::sieve::store::ObjKey,
                serde_json::Value,
            )>,
        >,
    ) {
        let old = self.inc.take().expect("a controller was running");
        self.writes.extend(old.line.writes());
        drop(old);
        // Its Events in flight fail against the dead connection, and its client goes.
        drain(0).await;
        self.restarts += 1;
        let store = self.server.store();
        let objects = listing.unwrap_or_else(|| current_objects(&store));
        let cursor = store.log().len();
        drop(store);
        let crash_after = self.crashes.get(self.restarts).copied();
        self.inc = Some(Incarnation::start(
            &self.server,
            self.restarts,
            crash_after,
            &objects,
            cursor,
        ));
    }

    async fn finish(
        mut self,
        scenario: &Scenario,
        world: &World,
        mut violations: Vec<String>,
    ) -> Record {
        let last = self.inc.take().expect("a controller is running");
        self.writes.extend(last.line.writes());
        drop(last);
        drain(0).await;
        let store = self.server.store();
        let log = store.log().to_vec();
        let grants = oracle::grants(&log);
        let facts: Facts<'_> = scenario.facts(world);
        violations.extend(oracle::exclusion(&log, &facts));
        violations.extend(oracle::fencing(&grants, &facts));
        violations.extend(oracle::supersede(&grants, &log, &facts));
        violations.extend(oracle::floors(&store, &grants));
        Record {
            summary: oracle::summary(&store, &grants),
            writes: self.writes,
            deliveries: self.watch.deliveries.clone(),
            restarts: self.restarts,
            fired: self.watch.fired,
            violations,
            log,
        }
    }
}

/// Let every task but `alive` others finish: the Events a reconcile sent off
/// in the background, and the client of a process that is gone. Yielding, not
/// sleeping: the runtime is single-threaded and nothing waits on a clock.
async fn drain(alive: usize) {
    let metrics = tokio::runtime::Handle::current().metrics();
    for _ in 0..100_000 {
        if metrics.num_alive_tasks() <= alive {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!(
        "{} tasks still alive after draining (expected {alive})",
        metrics.num_alive_tasks()
    );
}
