//! A controller replica: its caches (fed by watch events that may lag, skip
//! versions or repeat), its syncs (fetch -> view -> decide -> plan of writes,
//! then one write per step), crashes and restarts.

use crate::adapter::{MutexFacts, decide_step};
use crate::config::{Broken, Config};
use crate::plan::{self, Read};
use crate::view::{self, now};
use crate::world::{Api, Cache, MutexObj, Replica, State, Sync, Told};
use tekton_mutex_api::mutex::LockSpec;

/// A watch (one per kind): its pending events arrive together. Versions in
/// between are skipped (events dropped until a relist), repeats change nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Obj {
    Mutexes,
    Runs,
    Prs,
}

pub const KINDS: [Obj; 3] = [Obj::Mutexes, Obj::Runs, Obj::Prs];

pub fn fresh_replica(cfg: &Config) -> Replica {
    Replica {
        listed: false,
        cache: empty_cache(cfg),
        sync: None,
        retry: vec![false; cfg.keys as usize],
    }
}

fn empty_cache(cfg: &Config) -> Cache {
    let n = cfg.runs.len();
    Cache {
        mutexes: vec![None; cfg.keys as usize],
        runs: vec![Default::default(); n],
        prs: vec![Default::default(); n],
    }
}

/// The spec every Mutex has in the model.
pub fn spec(cfg: &Config) -> LockSpec {
    LockSpec {
        capacity: cfg.capacity,
        ..LockSpec::default()
    }
}

/// A restart: the in-flight sync and the caches are lost.
pub fn crash(cfg: &Config, s: &mut State, rep: usize) {
    s.replicas[rep] = fresh_replica(cfg);
}

/// The first list after a (re)start: the cache is the API server's state now.
pub fn relist(s: &mut State, rep: usize) {
    let api = &s.api;
    let r = &mut s.replicas[rep];
    r.cache = Cache {
        mutexes: api.mutexes.clone(),
        runs: api.runs.clone(),
        prs: api.prs.clone(),
    };
    r.listed = true;
}

/// The watch events that bring kind `o` in the cache up to the API server's state.
/// The record of a PipelineRun queued as a whole is part of that PipelineRun: it
/// comes with the PipelineRuns' watch, not the lock runs'.
pub fn deliver(cfg: &Config, s: &mut State, rep: usize, o: Obj) {
    let api = &s.api;
    let c = &mut s.replicas[rep].cache;
    match o {
        Obj::Mutexes => c.mutexes.clone_from(&api.mutexes),
        Obj::Runs | Obj::Prs => {
            for i in watched_runs(cfg, o) {
                c.runs[i].clone_from(&api.runs[i]);
            }
            if o == Obj::Prs {
                c.prs.clone_from(&api.prs);
            }
        }
    }
}

pub fn stale(cfg: &Config, s: &State, rep: usize, o: Obj) -> bool {
    let (api, c) = (&s.api, &s.replicas[rep].cache);
    let runs_behind = watched_runs(cfg, o).any(|i| c.runs[i] != api.runs[i]);
    match o {
        Obj::Mutexes => c.mutexes != api.mutexes,
        Obj::Runs => runs_behind,
        Obj::Prs => runs_behind || c.prs != api.prs,
    }
}

/// The runs whose object the watch of kind `o` carries.
fn watched_runs(cfg: &Config, o: Obj) -> impl Iterator<Item = usize> + '_ {
    (0..cfg.runs.len()).filter(move |&i| match o {
        Obj::Runs => !cfg.runs[i].pending,
        Obj::Prs => cfg.runs[i].pending,
        Obj::Mutexes => false,
    })
}

/// Intake's ensure_mutex: a live run of the key is seen and its Mutex is not.
pub fn ensure(cfg: &Config, s: &mut State, rep: usize, k: u8) -> bool {
    let c = &s.replicas[rep].cache;
    let waiting = cfg
        .runs_of(k)
        .any(|i| c.runs[i].live() && c.runs[i].told == Told::Nothing);
    waiting && c.mutexes[k as usize].is_none() && crate::exec::create_mutex(s, k as usize)
}

/// sync_key up to the decision: read, view, decide; the writes are left to do.
/// False if it would write nothing.
pub fn sync(cfg: &Config, s: &mut State, rep: usize, k: u8) -> bool {
    let retry = s.replicas[rep].retry[k as usize];
    s.replicas[rep].retry[k as usize] = false;
    let read = if retry {
        &s.api.mutexes[k as usize]
    } else {
        &s.replicas[rep].cache.mutexes[k as usize]
    };
    let Some(m) = read.clone() else { return retry };
    let facts = MutexFacts {
        deleting: m.deleting,
        token_floor: token_floor(cfg, &s.api, k, &m),
        namespace_share: None,             // Mutexes only
        priority_across_namespaces: false, // Mutexes only
        ledger_read: false, // the model's objects have no uid: the floor goes by `fresh`
        clock_floor: 0,     // no clock: tokens count from 1 (a restore is tests/etcd_restore.rs's)
    };
    let writes = decide_writes(cfg, &s.api, &s.replicas[rep].cache, k, &m, !retry, facts);
    if writes.is_empty() {
        return retry;
    }
    s.replicas[rep].sync = Some(Sync { key: k, writes });
    true
}

fn decide_writes(
    cfg: &Config,
    api: &Api,
    cache: &Cache,
    k: u8,
    m: &MutexObj,
    from_cache: bool,
    facts: MutexFacts,
) -> Vec<crate::world::Write> {
    let fetched = view::fetch(cfg, cache, api, k, m);
    let views: Vec<_> = fetched
        .iter()
        .map(|f| {
            // members.rs: a queued PipelineRun's record, as the status vouches for it.
            let mut v = view::run_view(cfg, api, f, k);
            tekton_mutex_core::decide::vouch_queued_record(&mut v, &m.status.0);
            v
        })
        .collect();
    let multi = view::multi_keys(cfg, &fetched, k);
    let d = decide_step(&spec(cfg), &m.status.0, &views, now(), facts, &multi);
    let read = Read {
        mutex: m,
        token_floor: facts.token_floor,
        from_cache,
        fetched: &fetched,
        views: &views,
    };
    plan::writes(cfg, &read, &d)
}

/// lock_facts: the token ledger's floor, read from the API server while the
/// Mutex has no status yet (its first status write carries it; from then on
/// the CRD keeps `lastToken` from going down).
fn token_floor(cfg: &Config, api: &Api, k: u8, m: &MutexObj) -> i64 {
    let fresh = m.status == crate::world::Ledger::default();
    if !cfg.guarded(Broken::TokenFloor) || !fresh {
        return 0;
    }
    api.ledger[k as usize]
}
