//! The view step for deadlocks across keys (`core::deadlock`): every lock the controller serves
//! that has both holders and waiters (no other can be on a cycle), from the caches, with this one
//! as just read. A cycle is acted on by the lock its victim waits on: this sync wakes the others,
//! and before it ends a run of its own it reads the other locks afresh, since a cycle seen in
//! caches may already be gone.

use crate::controller::context::{Context, Error};
use crate::controller::lock_object::LockObject;
use crate::core::deadlock::{self, Deadlock, LockId, LockScope, LockWaits};
use crate::core::observe::Observe;
use crate::core::scope::Scope;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::{Mutex, MutexStatus};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use tracing::warn;

/// This lock's waiting runs that are the victims of a deadlock, by uid, with the cycle in words.
pub async fn victims<L: LockObject>(
    ctx: &Context,
    lock: &L,
    current: &MutexStatus,
) -> Result<BTreeMap<String, String>, Error> {
    let mut mine = BTreeMap::new();
    if !may_be_on_a_cycle(current) {
        return Ok(mine);
    }
    let here = LockId::of(&lock.scope(), &lock.name_any());
    let own = waits_of(ctx, here.clone(), lock, current);
    let cached = with(cached_waits(ctx), &own);
    let found = deadlock::find(&cached);
    wake_the_others(ctx, &found, &here);
    if !found.iter().any(|d| acts_on(d, &here)) {
        return Ok(mine);
    }
    let fresh = with(fresh_waits(ctx, &cached, &here).await?, &own);
    for d in deadlock::find(&fresh) {
        warn!(
            lock = here.describe(),
            victim = d.victim,
            cycle = d.cycle,
            "deadlock across keys"
        );
        let runs = d.runs.iter().filter(|(l, _)| *l == here);
        mine.extend(runs.map(|(_, uid)| (uid.clone(), d.cycle.clone())));
    }
    Ok(mine)
}

/// Only a lock with a holder and a waiter can be on a cycle.
fn may_be_on_a_cycle(status: &MutexStatus) -> bool {
    !status.holders.is_empty() && !status.queue.is_empty()
}

fn acts_on(d: &Deadlock, lock: &LockId) -> bool {
    d.runs.iter().any(|(l, _)| l == lock)
}

/// `others` with `own` in place of whatever they said of it.
fn with(mut others: Vec<LockWaits>, own: &LockWaits) -> Vec<LockWaits> {
    others.retain(|w| w.lock != own.lock);
    others.push(own.clone());
    others
}

/// A victim's run on another lock is ended by that lock's sync: wake it.
fn wake_the_others(ctx: &Context, found: &[Deadlock], here: &LockId) {
    let others: BTreeSet<&LockId> = found
        .iter()
        .flat_map(|d| d.runs.iter().map(|(l, _)| l))
        .filter(|l| *l != here)
        .collect();
    for l in others {
        ctx.wake.lock(l);
    }
}

/// Every cached lock of either kind that may be on a cycle (ours as we last wrote it).
fn cached_waits(ctx: &Context) -> Vec<LockWaits> {
    let mutexes = ctx.mutexes.state().into_iter();
    let mut waits: Vec<LockWaits> = mutexes
        .map(|m| ctx.written.newest(m))
        .filter_map(|m| graph_entry(ctx, m.as_ref()))
        .collect();
    if let Some(clusters) = &ctx.cluster_mutexes {
        let clusters = clusters.state().into_iter();
        let newest = clusters.map(|c| ctx.cluster_written.newest(c));
        waits.extend(newest.filter_map(|c| graph_entry(ctx, c.as_ref())));
    }
    waits
}

/// The other locks of `cached`, as the API server has them now.
async fn fresh_waits(
    ctx: &Context,
    cached: &[LockWaits],
    here: &LockId,
) -> Result<Vec<LockWaits>, Error> {
    let mut fresh = Vec::new();
    for id in cached.iter().map(|w| &w.lock).filter(|l| *l != here) {
        let entry = match &id.scope {
            LockScope::Namespace(ns) => {
                read::<Mutex>(ctx, &Scope::Namespace(ns.clone()), id).await?
            }
            LockScope::Cluster => read::<ClusterMutex>(ctx, &Scope::Cluster, id).await?,
        };
        fresh.extend(entry);
    }
    Ok(fresh)
}

async fn read<L: LockObject>(
    ctx: &Context,
    scope: &Scope,
    id: &LockId,
) -> Result<Option<LockWaits>, Error> {
    let lock = L::api(&ctx.client, scope).get_opt(&id.name).await?;
    Ok(lock.and_then(|l| graph_entry(ctx, &l)))
}

fn graph_entry<L: LockObject>(ctx: &Context, lock: &L) -> Option<LockWaits> {
    let status = lock.lock_status().filter(|s| may_be_on_a_cycle(s))?;
    let id = LockId::of(&lock.scope(), &lock.name_any());
    Some(waits_of(ctx, id, lock, status))
}

/// The lock's entries, its `release-after` holders marked (their holds may end early).
fn waits_of<L: LockObject>(ctx: &Context, id: LockId, lock: &L, status: &MutexStatus) -> LockWaits {
    let holders: BTreeSet<&str> = status.holders.iter().map(|h| h.run.uid.as_str()).collect();
    let tag = lock.runs_tag();
    let mut early = BTreeSet::new();
    let mut mark = |uid: Option<String>, release_after: bool| {
        if let Some(uid) = uid.filter(|u| release_after && holders.contains(u.as_str())) {
            early.insert(uid);
        }
    };
    for r in ctx.custom_runs.iter().flat_map(|c| c.get(&tag)) {
        mark(r.uid(), releases_early(r.as_ref()));
    }
    for r in ctx.runs.iter().flat_map(|c| c.get(&tag)) {
        mark(r.uid(), releases_early(r.as_ref()));
    }
    LockWaits::of(id, lock.lock_spec(), status, &early)
}

fn releases_early<K: Observe>(run: &K) -> bool {
    run.observe()
        .config()
        .is_ok_and(|c| !c.release_after.is_empty())
}
