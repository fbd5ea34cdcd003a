//! The view step for deadlocks across keys (`core::deadlock`): this lock as just read, and from
//! the caches its neighbourhood (the locks its holders are queued on, and theirs in turn), which
//! alone decides every cycle through it. A lock whose holders wait nowhere else pays a cache
//! lookup per holder, whatever the controller holds. A cycle is acted on by the lock its victim
//! waits on: this sync wakes the others, and before it ends a run of its own it reads the other
//! locks afresh, since a cycle seen in caches may already be gone.

use crate::controller::cache::index::{Indexed, Tag};
use crate::controller::cache::triggers::{queued_tags, run_tags};
use crate::controller::context::{Context, Error};
use crate::controller::lock_object::LockObject;
use crate::core::deadlock::{self, Deadlock, LockId, LockScope, LockWaits, Party};
use crate::core::observe::Observe;
use crate::core::scope::Scope;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::{Mutex, MutexStatus};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::collections::{BTreeMap, BTreeSet, HashSet};
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
    let cached = deadlock::neighbourhood(
        own.clone(),
        |p| cached_queues_of(ctx, p),
        |id| cached_lock(ctx, id),
    );
    if cached.len() < 2 {
        return Ok(mine); // a cycle spans two locks: a waiter never waits for its own hold
    }
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

/// The locks `party` may be queued on, from the caches: those of its PipelineRun's lock runs,
/// of the PipelineRun itself when it is queued as a whole, and of a standalone run of that name.
/// Found through the caches' indexes, never by a scan.
fn cached_queues_of(ctx: &Context, party: &Party) -> Vec<LockId> {
    let Some((ns, name)) = party.name.split_once('/') else {
        return Vec::new();
    };
    let mut tags = HashSet::new();
    if let Some(c) = &ctx.custom_runs {
        tags.extend(tags_of_runs(c, ns, name));
    }
    if let Some(c) = &ctx.runs {
        tags.extend(tags_of_runs(c, ns, name));
    }
    if let Some(pr) = ctx.pipeline_runs.get(&ObjectRef::new(name).within(ns)) {
        tags.extend(queued_tags(&pr));
    }
    tags.into_iter().filter_map(lock_id).collect()
}

/// The tags of the lock runs of PipelineRun `ns/name`, and of a standalone run of that name.
fn tags_of_runs<K>(cache: &Indexed<K>, ns: &str, name: &str) -> Vec<Tag>
where
    K: Observe + kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let standalone = cache.store.get(&ObjectRef::new(name).within(ns));
    let of_pipeline_run = cache.get(&Tag::pipeline_run(ns, name));
    let runs = of_pipeline_run.into_iter().chain(standalone);
    runs.flat_map(|r| run_tags(r.as_ref())).collect()
}

fn lock_id(tag: Tag) -> Option<LockId> {
    let (scope, name) = match tag {
        Tag::Key { namespace, key } => (LockScope::Namespace(namespace), key),
        Tag::ClusterMutex { name } => (LockScope::Cluster, name),
        Tag::PipelineRun { .. } => return None,
    };
    Some(LockId { scope, name })
}

/// A lock from the cache (as we last wrote it), if it may be on a cycle.
fn cached_lock(ctx: &Context, id: &LockId) -> Option<LockWaits> {
    match &id.scope {
        LockScope::Namespace(ns) => {
            let m = ctx.mutexes.get(&ObjectRef::new(&id.name).within(ns))?;
            graph_entry(ctx, ctx.written.newest(m).as_ref())
        }
        LockScope::Cluster => {
            let c = ctx
                .cluster_mutexes
                .as_ref()?
                .get(&ObjectRef::new(&id.name))?;
            graph_entry(ctx, ctx.cluster_written.newest(c).as_ref())
        }
    }
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
    let holding = |uid: Option<String>| uid.filter(|u| holders.contains(u.as_str()));
    let mut early = BTreeSet::new();
    // Only holders' parameters are read: a long queue costs a uid lookup per waiter.
    for r in ctx.custom_runs.iter().flat_map(|c| c.get(&tag)) {
        early.extend(holding(r.uid()).filter(|_| releases_early(r.as_ref())));
    }
    for r in ctx.runs.iter().flat_map(|c| c.get(&tag)) {
        early.extend(holding(r.uid()).filter(|_| releases_early(r.as_ref())));
    }
    LockWaits::of(id, lock.lock_spec(), status, &early)
}

fn releases_early<K: Observe>(run: &K) -> bool {
    run.observe()
        .config()
        .is_ok_and(|c| !c.release_after.is_empty())
}
