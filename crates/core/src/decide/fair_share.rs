//! A ClusterMutex is shared by tenants: one namespace's runs must not take the key ahead of
//! another's by what they say of themselves (issue 46 item 7). `sequence` (a build number) and
//! `priority` are a run's own claims, and build numbers of different pipelines are no one
//! series; so they order a namespace's own runs only. Across namespaces the queue takes each
//! namespace's next run in turn by when it was created, in the lock's order: a waiter is
//! granted after at most the runs of other namespaces created before it (oldest first), however
//! many those namespaces keep sending.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use tekton_mutex_api::cluster_mutex::unqualify;
use tekton_mutex_api::mutex::{Order, Waiter};

/// `queue`, already in each namespace's own order, merged across namespaces: of the
/// namespaces' next runs, the one created first (last, `newest-first`) goes first.
pub(super) fn across_namespaces(order: Order, queue: Vec<Waiter>) -> Vec<Waiter> {
    let mut by_namespace: BTreeMap<&str, VecDeque<&Waiter>> = BTreeMap::new();
    for w in &queue {
        let ns = unqualify(&w.run.name).map_or("", |(ns, _)| ns);
        by_namespace.entry(ns).or_default().push_back(w);
    }
    if by_namespace.len() < 2 {
        return queue;
    }
    let mut heads: BinaryHeap<Turn> = BinaryHeap::new();
    let mut lines: Vec<VecDeque<&Waiter>> = by_namespace.into_values().collect();
    for (line, runs) in lines.iter().enumerate() {
        heads.extend(runs.front().map(|w| Turn::of(order, w, line)));
    }
    let mut merged = Vec::with_capacity(queue.len());
    while let Some(turn) = heads.pop() {
        let line = &mut lines[turn.line];
        merged.extend(line.pop_front().cloned());
        heads.extend(line.front().map(|w| Turn::of(order, w, turn.line)));
    }
    merged
}

/// A namespace's next run, as the merge ranks it: the heap pops the greatest, so the
/// earliest-created (oldest first) or the latest-created (newest first) is greatest.
#[derive(PartialEq, Eq)]
struct Turn {
    when: (jiff::Timestamp, String),
    newest_first: bool,
    line: usize,
}

impl Turn {
    fn of(order: Order, w: &Waiter, line: usize) -> Turn {
        Turn {
            when: (w.age.created, w.age.name.clone()),
            newest_first: order == Order::NewestFirst,
            line,
        }
    }
}

impl Ord for Turn {
    fn cmp(&self, other: &Self) -> Ordering {
        let by_when = match self.newest_first {
            true => self.when.cmp(&other.when),
            false => other.when.cmp(&self.when),
        };
        by_when.then_with(|| other.line.cmp(&self.line))
    }
}

impl PartialOrd for Turn {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
