//! A ClusterMutex is shared by tenants: one namespace's runs must not take the key ahead of
//! another's by what they say of themselves (issue 46 item 7). `sequence` (a build number) and
//! `priority` are a run's own claims, and build numbers of different pipelines are no one
//! series; so they order a namespace's own runs only. Across namespaces the queue takes each
//! namespace's next run in turn by when it was created, in the lock's order: a waiter is
//! granted after at most the runs of other namespaces created before it (oldest first), however
//! many those namespaces keep sending.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use tekton_mutex_api::cluster_mutex::unqualify;
use tekton_mutex_api::mutex::{Order, Waiter};

/// `queue`, already in each namespace's own order, merged across namespaces: of the
/// namespaces' next runs, the one created first (last, `newest-first`) goes first; with
/// `by_priority` (the ClusterMutex allows it), the one of highest priority, then that. Waiters
/// are moved, never cloned: the queue is sorted on every grant.
pub(super) fn across_namespaces(
    order: Order,
    by_priority: bool,
    queue: Vec<Waiter>,
) -> Vec<Waiter> {
    let mut lines: BTreeMap<&str, VecDeque<usize>> = BTreeMap::new();
    for (i, w) in queue.iter().enumerate() {
        let ns = unqualify(&w.run.name).map_or("", |(ns, _)| ns);
        lines.entry(ns).or_default().push_back(i);
    }
    if lines.len() < 2 {
        return queue;
    }
    let turn_of = turns(order, &queue);
    // The heap pops the greatest: the highest priority (when it counts), then the smallest turn.
    let rank = |i: usize, line: usize| {
        let priority = if by_priority { queue[i].priority } else { 0 };
        (priority, Reverse(turn_of[i]), Reverse(line))
    };
    let mut lines: Vec<VecDeque<usize>> = lines.into_values().collect();
    let mut heads = BinaryHeap::new();
    for (line, runs) in lines.iter().enumerate() {
        heads.extend(runs.front().map(|&i| rank(i, line)));
    }
    let mut merged = Vec::with_capacity(queue.len());
    while let Some((_, _, Reverse(line))) = heads.pop() {
        let line_runs = &mut lines[line];
        merged.extend(line_runs.pop_front());
        heads.extend(line_runs.front().map(|&i| rank(i, line)));
    }
    let mut slots: Vec<Option<Waiter>> = queue.into_iter().map(Some).collect();
    merged.into_iter().filter_map(|i| slots[i].take()).collect()
}

/// Each waiter's turn across namespaces: its rank by creation time, then name, in `order`.
fn turns(order: Order, queue: &[Waiter]) -> Vec<usize> {
    let mut by_age: Vec<usize> = (0..queue.len()).collect();
    let when = |i: &usize| (queue[*i].age.created, queue[*i].age.name.as_str());
    match order {
        Order::OldestFirst => by_age.sort_by(|a, b| when(a).cmp(&when(b))),
        Order::NewestFirst => by_age.sort_by(|a, b| when(b).cmp(&when(a))),
    }
    let mut turn = vec![0; queue.len()];
    for (rank, i) in by_age.into_iter().enumerate() {
        turn[i] = rank;
    }
    turn
}
