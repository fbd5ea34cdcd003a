//! Deadlocks across keys. Each lock decides alone, so two PipelineRuns can each hold a key the
//! other waits for: a matrixed lock task over keys whose queues order differently, or two
//! pipelines that take the same keys in opposite orders. Neither lock can see it; the wait-for
//! graph over every lock the controller serves can.
//!
//! A party is a PipelineRun (or a standalone run). A hold lasts until its PipelineRun ends, so a
//! party is stuck for good when one of its runs waits on a lock that is full and whose holders
//! are all stuck for good. The greatest such set is found by elimination, then its cycles (the
//! strongly connected parts of "waits for a key held by"). In each cycle the youngest party (its
//! PipelineRun's creation time, then its name and uid) is the victim: its waiting runs on the
//! cycle end with reason `Deadlock`, its PipelineRun fails, and its holds go back. Every lock
//! computes the same victim from the same graph, so whichever lock's sync sees the cycle first
//! agrees with the others.
//!
//! Left out on purpose, so that nothing is failed that would have moved on its own: a hold with
//! `release-after` (it may end before its PipelineRun does), a multi-key reservation (it is given
//! back when the run cannot take all its keys), and a lock below its capacity (a frozen one waits
//! for a person, not for a cycle).

use crate::scope::Scope;
use jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use tekton_mutex_api::mutex::{Holder, LockSpec, MutexStatus, Waiter};

/// A lock as the graph sees it: its identity, whether it is full, and its parties.
#[derive(Clone, Debug)]
pub struct LockWaits {
    pub lock: LockId,
    pub full: bool,
    pub holders: Vec<Party>,
    pub waiters: Vec<Party>,
}

/// Which lock object: its kind and where it lives.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockId {
    pub scope: LockScope,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LockScope {
    /// A Mutex of this namespace.
    Namespace(String),
    /// A ClusterMutex.
    Cluster,
}

impl LockId {
    pub fn of(scope: &Scope, name: &str) -> LockId {
        let scope = match scope {
            Scope::Namespace(ns) => LockScope::Namespace(ns.clone()),
            Scope::Cluster => LockScope::Cluster,
        };
        LockId {
            scope,
            name: name.to_string(),
        }
    }

    /// As a person reads it: `Mutex ns/name` or `ClusterMutex name`.
    pub fn describe(&self) -> String {
        match &self.scope {
            LockScope::Namespace(ns) => format!("Mutex {ns}/{}", self.name),
            LockScope::Cluster => format!("ClusterMutex {}", self.name),
        }
    }
}

/// One entry of a lock: which party, which of its runs, and whether its hold may end early.
#[derive(Clone, Debug)]
pub struct Party {
    /// The PipelineRun's uid (the run's own for a standalone run): one node of the graph.
    pub id: String,
    /// `namespace/name` of the PipelineRun (or of the standalone run).
    pub name: String,
    /// Its PipelineRun's creation time: the youngest party of a cycle is its victim.
    pub created: Timestamp,
    /// The lock run of this entry.
    pub run_uid: String,
    /// A hold that ends before its PipelineRun does (`release-after`): never part of a cycle.
    pub releases_early: bool,
}

/// A cycle found, and the victim's runs to end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deadlock {
    /// `namespace/name` of the victim's PipelineRun.
    pub victim: String,
    /// The victim's waiting runs on the cycle, by the lock they wait on.
    pub runs: Vec<(LockId, String)>,
    /// The cycle in words, from the victim round to it again.
    pub cycle: String,
}

impl LockWaits {
    /// A lock's entries from its status; `early` names the runs whose holds have `release-after`.
    pub fn of(
        lock: LockId,
        spec: &LockSpec,
        status: &MutexStatus,
        early: &BTreeSet<String>,
    ) -> LockWaits {
        let ns = match &lock.scope {
            LockScope::Namespace(ns) => Some(ns.as_str()),
            LockScope::Cluster => None,
        };
        let holders = status.holders.iter().map(|h| holder_party(h, ns, early));
        LockWaits {
            full: status.holders.len() >= spec.capacity as usize,
            holders: holders.collect(),
            waiters: status.queue.iter().map(|w| waiter_party(w, ns)).collect(),
            lock,
        }
    }
}

fn holder_party(h: &Holder, ns: Option<&str>, early: &BTreeSet<String>) -> Party {
    Party {
        releases_early: early.contains(&h.run.uid),
        ..waiter_party(&h.as_waiter(), ns)
    }
}

fn waiter_party(w: &Waiter, ns: Option<&str>) -> Party {
    let name = w.pipeline_run.as_deref().unwrap_or(&w.run.name);
    Party {
        id: w
            .pipeline_run_uid
            .clone()
            .unwrap_or_else(|| w.run.uid.clone()),
        // A ClusterMutex's status already writes `namespace/name`.
        name: ns.map_or_else(|| name.to_string(), |ns| format!("{ns}/{name}")),
        created: w.age.created,
        run_uid: w.run.uid.clone(),
        releases_early: false,
    }
}

/// The locks that decide every deadlock through `here`: `here`, then each lock that a holder of a
/// lock already taken is queued on, until none is added. Whether a party is stuck depends only on
/// the locks it waits on and, through their holders, on what those wait on; and a cycle through
/// `here` runs through its holders. So [`find`] over these answers for `here` exactly as over
/// every lock, and a sync pays for its own neighbourhood, not for all the controller serves (most
/// holders wait nowhere: the set is `here` alone).
///
/// `queued_on(party)` names the locks the party may be queued on (a superset will do: a lock that
/// does not queue it is left out), and `lock(id)` gives one, each asked at most once.
pub fn neighbourhood(
    here: LockWaits,
    mut queued_on: impl FnMut(&Party) -> Vec<LockId>,
    mut lock: impl FnMut(&LockId) -> Option<LockWaits>,
) -> Vec<LockWaits> {
    let mut known: BTreeMap<LockId, Option<LockWaits>> = BTreeMap::new();
    let mut taken: BTreeSet<LockId> = BTreeSet::from([here.lock.clone()]);
    let mut asked: BTreeSet<String> = BTreeSet::new();
    let mut locks = vec![here];
    let mut next = 0;
    while let Some(at) = locks.get(next) {
        let holders: Vec<Party> = at
            .holders
            .iter()
            .filter(|h| asked.insert(h.id.clone()))
            .cloned()
            .collect();
        next += 1;
        for h in holders {
            for id in queued_on(&h) {
                if taken.contains(&id) {
                    continue;
                }
                let l = known.entry(id.clone()).or_insert_with(|| lock(&id));
                if let Some(l) = l
                    .as_ref()
                    .filter(|l| l.waiters.iter().any(|w| w.id == h.id))
                {
                    taken.insert(id);
                    locks.push(l.clone());
                }
            }
        }
    }
    locks
}

/// Every deadlock among `locks`, each with its victim; the same answer whatever their order.
pub fn find(locks: &[LockWaits]) -> Vec<Deadlock> {
    let stuck = stuck_for_good(locks);
    let edges = wait_for_edges(locks, &stuck);
    let mut found: Vec<Deadlock> = cycles(&edges)
        .into_iter()
        .map(|part| victim_of(locks, &edges, &part))
        .collect();
    found.sort_by(|a, b| a.victim.cmp(&b.victim));
    found
}

/// May `waiter` never be granted `l`: full, and every holder (another party, held until its
/// PipelineRun ends) in `stuck`?
fn blocks(l: &LockWaits, waiter: &str, stuck: &BTreeSet<&str>) -> bool {
    l.full
        && !l.holders.is_empty()
        && l.holders
            .iter()
            .all(|h| !h.releases_early && h.id != waiter && stuck.contains(h.id.as_str()))
}

/// The greatest set of parties that wait for good: start from every waiting party and drop, until
/// nothing changes, each one none of whose waits is blocked by the ones left.
fn stuck_for_good(locks: &[LockWaits]) -> BTreeSet<&str> {
    // Each party's locks, once: a round then costs the entries, not parties x locks.
    let mut waits_on: BTreeMap<&str, Vec<&LockWaits>> = BTreeMap::new();
    for l in locks {
        for w in &l.waiters {
            waits_on.entry(w.id.as_str()).or_default().push(l);
        }
    }
    let mut stuck: BTreeSet<&str> = waits_on.keys().copied().collect();
    loop {
        let keep: BTreeSet<&str> = stuck
            .iter()
            .copied()
            .filter(|p| waits_on[p].iter().any(|l| blocks(l, p, &stuck)))
            .collect();
        if keep.len() == stuck.len() {
            return keep;
        }
        stuck = keep;
    }
}

/// One edge per blocked wait of a stuck party: party → (lock, holder).
type Edges<'a> = BTreeMap<&'a str, Vec<(&'a LockWaits, &'a str)>>;

fn wait_for_edges<'a>(locks: &'a [LockWaits], stuck: &BTreeSet<&'a str>) -> Edges<'a> {
    let mut edges: Edges<'a> = BTreeMap::new();
    for l in locks {
        for w in &l.waiters {
            if !stuck.contains(w.id.as_str()) || !blocks(l, &w.id, stuck) {
                continue;
            }
            let out = edges.entry(w.id.as_str()).or_default();
            out.extend(l.holders.iter().map(|h| (l, h.id.as_str())));
        }
    }
    // In a fixed order, so that the cycle is told the same whatever order the locks came in.
    for out in edges.values_mut() {
        out.sort_by(|a, b| (&a.0.lock, a.1).cmp(&(&b.0.lock, b.1)));
        out.dedup_by(|a, b| a.0.lock == b.0.lock && a.1 == b.1);
    }
    edges
}

/// The strongly connected parts of two parties or more, by mutual reachability (the graph has
/// one node per stuck PipelineRun: a handful, never the whole cluster).
fn cycles<'a>(edges: &Edges<'a>) -> Vec<BTreeSet<&'a str>> {
    let nodes: Vec<&str> = edges.keys().copied().collect();
    let reach = |from: &str| reachable(edges, from);
    let reaches: BTreeMap<&str, BTreeSet<&str>> = nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut parts: Vec<BTreeSet<&str>> = Vec::new();
    for n in &nodes {
        if parts.iter().any(|p| p.contains(n)) {
            continue;
        }
        let part: BTreeSet<&str> = nodes
            .iter()
            .copied()
            .filter(|m| reaches[n].contains(m) && reaches[m].contains(n))
            .collect();
        if part.len() >= 2 {
            parts.push(part);
        }
    }
    parts
}

/// Every party reachable from `from` by one edge or more.
fn reachable<'a>(edges: &Edges<'a>, from: &str) -> BTreeSet<&'a str> {
    let mut seen: BTreeSet<&'a str> = BTreeSet::new();
    let mut next: Vec<&'a str> = edges.get(from).into_iter().flatten().map(|e| e.1).collect();
    while let Some(n) = next.pop() {
        if seen.insert(n) {
            next.extend(edges.get(n).into_iter().flatten().map(|e| e.1));
        }
    }
    seen
}

/// The youngest party of `part`, its waits inside the part, and the cycle through it in words.
fn victim_of(locks: &[LockWaits], edges: &Edges<'_>, part: &BTreeSet<&str>) -> Deadlock {
    let party = |id: &str| {
        locks
            .iter()
            .flat_map(|l| l.waiters.iter().chain(&l.holders))
            .find(|p| p.id == id)
            .expect("every node is a party of some lock")
    };
    let victim = part
        .iter()
        .map(|id| party(id))
        .max_by(|a, b| (a.created, &a.name, &a.id).cmp(&(b.created, &b.name, &b.id)))
        .expect("a cycle has parties");
    let mut runs: Vec<(LockId, String)> = edges[victim.id.as_str()]
        .iter()
        .filter(|(_, holder)| part.contains(holder))
        .flat_map(|(l, _)| {
            let own = l.waiters.iter().filter(|w| w.id == victim.id);
            own.map(|w| (l.lock.clone(), w.run_uid.clone()))
        })
        .collect();
    runs.sort();
    runs.dedup();
    let cycle = describe_cycle(edges, part, &victim.id, &party);
    Deadlock {
        victim: victim.name.clone(),
        runs,
        cycle,
    }
}

/// "PipelineRun a waits for Mutex ns/x, held by PipelineRun b, which waits for ..., held by a":
/// the shortest way round from the victim (breadth first, in a fixed order).
fn describe_cycle<'p>(
    edges: &Edges<'_>,
    part: &BTreeSet<&str>,
    victim: &str,
    party: &dyn Fn(&str) -> &'p Party,
) -> String {
    let mut came_from: BTreeMap<&str, (&str, &LockWaits)> = BTreeMap::new();
    let mut frontier = vec![victim];
    'search: while !frontier.is_empty() {
        let mut next = Vec::new();
        for from in frontier {
            for (l, to) in edges.get(from).into_iter().flatten() {
                if !part.contains(to) || came_from.contains_key(to) {
                    continue;
                }
                came_from.insert(to, (from, l));
                if *to == victim {
                    break 'search;
                }
                next.push(*to);
            }
        }
        frontier = next;
    }
    let mut steps = Vec::new();
    let mut at = victim;
    while let Some((from, l)) = came_from.get(at) {
        steps.push((*from, *l, at));
        at = from;
        if at == victim {
            break;
        }
    }
    steps.reverse();
    let words: Vec<String> = steps
        .iter()
        .map(|(from, l, to)| {
            format!(
                "{} waits for {}, held by {}",
                party(from).name,
                l.lock.describe(),
                party(to).name
            )
        })
        .collect();
    format!("PipelineRun {}", words.join("; "))
}

#[cfg(test)]
mod tests;
