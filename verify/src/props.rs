//! The four properties. Exclusion, Fencing and Supersede are invariants over
//! every reachable state, judged by the rules of `tekton_mutex_promise` (which the
//! fault campaign's checker replays its recorded histories through). No lost waiter is liveness, checked as bounded
//! liveness: from every reachable state, a fair calm continuation (no more
//! user actions or crashes; every replica finishes its sync, every watch event
//! arrives, a replica with the lease syncs every key, Tekton finishes every section and every
//! grace period ends) must leave no live run waiting while its PipelineRun runs.

use crate::config::Config;
use crate::controller;
use crate::env::{self, Env};
use crate::exec;
use crate::world::{Pod, PrPhase, State, Told};

pub const EXCLUSION: &str = "Exclusion";
pub const FENCING: &str = "Fencing";
pub const SUPERSEDE: &str = "Supersede";
pub const NO_LOST_WAITER: &str = "No lost waiter";
pub const ALL: [&str; 4] = [EXCLUSION, FENCING, SUPERSEDE, NO_LOST_WAITER];

/// Did a write of the history break the rule `what` (the ghost state records it)?
pub fn broke(s: &State, what: &str) -> bool {
    s.ghost.broken.as_ref().is_some_and(|b| b.starts_with(what))
}

/// A key whose live sections (pod running since the grant) exceed capacity.
pub fn over_capacity(cfg: &Config, s: &State) -> Option<String> {
    (0..cfg.keys).find_map(|k| {
        // By PipelineRun: two lock runs of one PipelineRun are one section.
        let mut live: Vec<usize> = cfg
            .runs_of(k)
            .map(|i| cfg.pr_of(i))
            .filter(|&p| s.api.prs[p].pod == Pod::Live)
            .collect();
        live.sort_unstable();
        live.dedup();
        tekton_mutex_promise::exclusion(live.len(), cfg.capacity as usize)
            .err()
            .map(|why| format!("k{k}: {why}: {live:?}"))
    })
}

/// A run still waiting after the calm continuation, though its PipelineRun runs.
pub fn lost_waiter(cfg: &Config, s: &State) -> Option<String> {
    let end = settle(cfg, s);
    (0..cfg.runs.len()).find_map(|i| {
        let (r, pr) = (&end.api.runs[i], &end.api.prs[cfg.pr_of(i)]);
        let unstarted = matches!(pr.phase, PrPhase::Running | PrPhase::Pending);
        let waiting = r.live() && r.told == Told::Nothing && unstarted;
        waiting.then(|| format!("run-{i} still waits after everything else settled"))
    })
}

/// The fair calm continuation, run until nothing changes (bounded).
pub fn settle(cfg: &Config, s: &State) -> State {
    let mut s = s.clone();
    for _ in 0..40 {
        let before = s.clone();
        for rep in 0..s.replicas.len() {
            finish_sync(cfg, &mut s, rep);
            catch_up(cfg, &mut s, rep);
        }
        for i in 0..cfg.runs.len() as u8 {
            for e in [Env::Stopped(i), Env::PodEnds(i), Env::Finish(i)] {
                env::apply(cfg, &mut s, e);
            }
        }
        let leader = s.leaders.trailing_zeros() as usize;
        for k in 0..cfg.keys {
            catch_up(cfg, &mut s, leader);
            controller::ensure(cfg, &mut s, leader, k);
            catch_up(cfg, &mut s, leader);
            if controller::sync(cfg, &mut s, leader, k) {
                finish_sync(cfg, &mut s, leader);
            }
        }
        if s == before {
            break;
        }
    }
    s
}

fn finish_sync(cfg: &Config, s: &mut State, rep: usize) {
    while s.replicas[rep].sync.is_some() {
        exec::step(cfg, s, rep);
    }
}

fn catch_up(cfg: &Config, s: &mut State, rep: usize) {
    if !s.replicas[rep].listed {
        controller::relist(s, rep);
    }
    for o in controller::KINDS {
        controller::deliver(cfg, s, rep, o);
    }
}
