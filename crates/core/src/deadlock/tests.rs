use super::*;
use proptest::prelude::*;
use tekton_mutex_api::mutex::{Age, RunKind, RunRef, Supersede};

/// PipelineRun `pr` (created at second `at`) as an entry of a Mutex of namespace `ns`.
fn waiter(pr: &str, at: i64, run: &str) -> Waiter {
    Waiter {
        run: RunRef {
            kind: RunKind::CustomRun,
            name: run.into(),
            uid: format!("uid-{run}"),
        },
        pipeline_run: Some(pr.into()),
        // A ClusterMutex's status qualifies the name, never the uid.
        pipeline_run_uid: Some(format!("uid-{}", pr.trim_start_matches("ns/"))),
        group: "deploy".into(),
        age: Age {
            sequence: None,
            created: Timestamp::from_second(at).unwrap(),
            name: pr.into(),
        },
        priority: 0,
        supersede: Supersede::None,
        waiting_since: None,
    }
}

fn holder(pr: &str, at: i64, run: &str) -> Holder {
    let w = waiter(pr, at, run);
    Holder {
        run: w.run,
        pipeline_run: w.pipeline_run,
        pipeline_run_uid: w.pipeline_run_uid,
        token: 1,
        since: Timestamp::from_second(at).unwrap(),
        waited_seconds: 0,
        group: w.group,
        age: w.age,
        supersede: w.supersede,
    }
}

/// A Mutex of namespace "ns": (pr, created, run) holders, then waiters.
fn mutex(
    name: &str,
    capacity: u32,
    holders: &[(&str, i64, &str)],
    queue: &[(&str, i64, &str)],
) -> LockWaits {
    let spec = LockSpec {
        capacity,
        ..Default::default()
    };
    let status = MutexStatus {
        holders: holders.iter().map(|(p, at, r)| holder(p, *at, r)).collect(),
        queue: queue.iter().map(|(p, at, r)| waiter(p, *at, r)).collect(),
        ..Default::default()
    };
    let id = LockId::of(&Scope::Namespace("ns".into()), name);
    LockWaits::of(id, &spec, &status, &BTreeSet::new())
}

fn x_and_y_crossed() -> Vec<LockWaits> {
    vec![
        mutex("x", 1, &[("a", 10, "a-x")], &[("b", 20, "b-x")]),
        mutex("y", 1, &[("b", 20, "b-y")], &[("a", 10, "a-y")]),
    ]
}

#[test]
fn two_pipelineruns_crossed_on_two_keys_fail_the_younger() {
    let found = find(&x_and_y_crossed());
    assert_eq!(found.len(), 1, "{found:?}");
    let d = &found[0];
    assert_eq!(d.victim, "ns/b");
    assert_eq!(
        d.runs,
        vec![(
            LockId::of(&Scope::Namespace("ns".into()), "x"),
            "uid-b-x".into()
        )]
    );
    assert_eq!(
        d.cycle,
        "PipelineRun ns/b waits for Mutex ns/x, held by ns/a; ns/a waits for Mutex ns/y, held by ns/b"
    );
}

#[test]
fn the_answer_is_the_same_whatever_order_the_locks_come_in() {
    let mut locks = x_and_y_crossed();
    let before = find(&locks);
    locks.reverse();
    assert_eq!(find(&locks), before);
}

#[test]
fn a_wait_with_a_free_slot_or_a_holder_that_moves_on_is_no_deadlock() {
    // x has room for both: b is about to be granted.
    let roomy = vec![
        mutex("x", 2, &[("a", 10, "a-x")], &[("b", 20, "b-x")]),
        mutex("y", 1, &[("b", 20, "b-y")], &[("a", 10, "a-y")]),
    ];
    assert_eq!(find(&roomy), vec![]);
    // a waits for y, whose holder c waits for nothing: c ends, then a, then b.
    let chain = vec![
        mutex("x", 1, &[("a", 10, "a-x")], &[("b", 20, "b-x")]),
        mutex("y", 1, &[("c", 5, "c-y")], &[("a", 10, "a-y")]),
    ];
    assert_eq!(find(&chain), vec![]);
}

#[test]
fn a_release_after_hold_is_never_part_of_a_cycle() {
    let mut locks = x_and_y_crossed();
    let spec = LockSpec {
        capacity: 1,
        ..Default::default()
    };
    let status = MutexStatus {
        holders: vec![holder("a", 10, "a-x")],
        queue: vec![waiter("b", 20, "b-x")],
        ..Default::default()
    };
    let early = BTreeSet::from(["uid-a-x".to_string()]);
    locks[0] = LockWaits::of(locks[0].lock.clone(), &spec, &status, &early);
    assert_eq!(find(&locks), vec![]);
}

#[test]
fn a_pipelinerun_waiting_behind_a_cycle_is_not_its_victim() {
    // c is younger than both, and stuck behind the cycle: failing it frees nothing.
    let mut locks = x_and_y_crossed();
    locks[0]
        .waiters
        .push(mutex("x", 1, &[], &[("c", 30, "c-x")]).waiters[0].clone());
    let found = find(&locks);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].victim, "ns/b");
}

#[test]
fn three_keys_round_a_ring_and_a_cluster_mutex_in_it() {
    let cluster = |name: &str, h: (&str, i64, &str), w: (&str, i64, &str)| {
        let spec = LockSpec {
            capacity: 1,
            ..Default::default()
        };
        let status = MutexStatus {
            holders: vec![holder(h.0, h.1, h.2)],
            queue: vec![waiter(w.0, w.1, w.2)],
            ..Default::default()
        };
        LockWaits::of(
            LockId::of(&Scope::Cluster, name),
            &spec,
            &status,
            &BTreeSet::new(),
        )
    };
    let locks = vec![
        mutex("x", 1, &[("a", 10, "a-x")], &[("c", 30, "c-x")]),
        mutex("y", 1, &[("b", 20, "b-y")], &[("a", 10, "a-y")]),
        cluster("z", ("ns/c", 30, "ns/c-z"), ("ns/b", 20, "ns/b-z")),
    ];
    let found = find(&locks);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].victim, "ns/c");
    assert_eq!(
        found[0].cycle,
        "PipelineRun ns/c waits for Mutex ns/x, held by ns/a; ns/a waits for Mutex ns/y, held by \
         ns/b; ns/b waits for ClusterMutex z, held by ns/c"
    );
}

#[test]
fn sibling_runs_of_one_pipelinerun_do_not_wait_for_each_other() {
    // a holds x and its second lock task on x waits: a sharer, not a cycle.
    let locks = vec![mutex("x", 1, &[("a", 10, "a-x1")], &[("a", 10, "a-x2")])];
    assert_eq!(find(&locks), vec![]);
}

proptest! {
    /// Random holds and waits of four PipelineRuns on four keys of capacity 1: every victim is
    /// on a cycle of stuck parties, no victim is found where the graph has no cycle, and the
    /// answer does not depend on the order of the locks.
    #[test]
    fn victims_are_only_ever_on_a_cycle(
        holds in proptest::collection::vec(proptest::option::of(0usize..4), 4),
        waits in proptest::collection::vec(proptest::collection::vec(0usize..4, 0..3), 4),
    ) {
        let prs = ["a", "b", "c", "d"];
        let locks: Vec<LockWaits> = (0..4).map(|k| {
            let key = format!("k{k}");
            let h: Vec<(&str, i64, String)> = holds[k].iter().map(|p| (prs[*p], *p as i64, format!("{}-{key}", prs[*p]))).collect();
            let q: Vec<(&str, i64, String)> = (0..4).filter(|p| waits[*p].contains(&k) && holds[k] != Some(*p)).map(|p| (prs[p], p as i64, format!("{}-{key}-w", prs[p]))).collect();
            let h: Vec<(&str, i64, &str)> = h.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
            let q: Vec<(&str, i64, &str)> = q.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
            mutex(&key, 1, &h, &q)
        }).collect();
        let found = find(&locks);
        let mut reversed = locks.clone();
        reversed.reverse();
        prop_assert_eq!(&find(&reversed), &found);
        // Brute force: with capacity 1, a wait on a held key is blocked, so a party is on a
        // deadlock exactly when it reaches itself through "waits for a key held by".
        let edges = |p: &str| -> Vec<&str> {
            locks.iter().filter(|l| l.waiters.iter().any(|w| w.name == format!("ns/{p}")))
                .flat_map(|l| l.holders.iter().map(|h| h.name.trim_start_matches("ns/")))
                .filter(|h| *h != p)
                .collect()
        };
        let on_a_cycle = |p: &str| {
            let mut seen = BTreeSet::new();
            let mut next = edges(p);
            while let Some(n) = next.pop() {
                if n == p { return true; }
                if seen.insert(n.to_string()) { next.extend(edges(n)); }
            }
            false
        };
        for d in &found {
            let victim = d.victim.trim_start_matches("ns/");
            prop_assert!(on_a_cycle(victim), "victim {} is on no cycle: {:?}", victim, d);
            prop_assert!(!d.runs.is_empty());
        }
        prop_assert_eq!(prs.iter().any(|p| on_a_cycle(p)), !found.is_empty());
    }
}

/// The deadlocks that `here`'s sync acts on (its own waiting runs are victims).
fn acting_on(found: Vec<Deadlock>, here: &LockId) -> Vec<Deadlock> {
    found
        .into_iter()
        .filter(|d| d.runs.iter().any(|(l, _)| l == here))
        .collect()
}

fn ids(locks: &[LockWaits]) -> Vec<LockId> {
    locks.iter().map(|l| l.lock.clone()).collect()
}

fn by_id(locks: &[LockWaits], id: &LockId) -> Option<LockWaits> {
    locks.iter().find(|l| l.lock == *id).cloned()
}

#[test]
fn a_lock_whose_holders_wait_nowhere_is_its_own_neighbourhood() {
    let x = mutex("x", 1, &[("a", 10, "a-x")], &[("b", 20, "b-x")]);
    let mut asked = Vec::new();
    let near = neighbourhood(
        x.clone(),
        |p| {
            asked.push(p.name.clone());
            vec![x.lock.clone()]
        },
        |_| panic!("no lock but its own is read"),
    );
    assert_eq!(near.len(), 1);
    assert_eq!(asked, ["ns/a"], "only the holder is looked up, once");
}

#[test]
fn the_neighbourhood_follows_holders_round_a_ring_and_no_further() {
    let ring = vec![
        mutex("x", 1, &[("a", 10, "a-x")], &[("c", 30, "c-x")]),
        mutex("y", 1, &[("b", 20, "b-y")], &[("a", 10, "a-y")]),
        mutex("z", 1, &[("c", 30, "c-z")], &[("b", 20, "b-z")]),
        // Held and waited on too, but by nobody on the ring.
        mutex("w", 1, &[("d", 40, "d-w")], &[("e", 50, "e-w")]),
    ];
    let near = neighbourhood(ring[0].clone(), |_| ids(&ring), |id| by_id(&ring, id));
    let names: BTreeSet<String> = near.iter().map(|l| l.lock.name.clone()).collect();
    assert_eq!(names, BTreeSet::from(["x".into(), "y".into(), "z".into()]));
    assert_eq!(find(&near), find(&ring));
}

proptest! {
    /// Random holds (capacity 1 or 2) and waits of five PipelineRuns on five keys: every lock's
    /// sync finds, over its neighbourhood alone, exactly the deadlocks it acts on over all
    /// locks (same victim, same runs, same cycle in words).
    #[test]
    fn a_neighbourhood_decides_as_all_locks_do(
        capacity in proptest::collection::vec(1u32..=2, 5),
        holds in proptest::collection::vec(proptest::collection::vec(0usize..5, 0..=2), 5),
        waits in proptest::collection::vec(proptest::collection::vec(0usize..5, 0..3), 5),
    ) {
        let prs = ["a", "b", "c", "d", "e"];
        let locks: Vec<LockWaits> = (0..5).map(|k| {
            let key = format!("k{k}");
            let mut held: Vec<usize> = holds[k].clone();
            held.sort();
            held.dedup();
            held.truncate(capacity[k] as usize);
            let h: Vec<(&str, i64, String)> = held.iter().map(|p| (prs[*p], *p as i64, format!("{}-{key}", prs[*p]))).collect();
            let q: Vec<(&str, i64, String)> = (0..5).filter(|p| waits[*p].contains(&k) && !held.contains(p)).map(|p| (prs[p], p as i64, format!("{}-{key}-w", prs[p]))).collect();
            let h: Vec<(&str, i64, &str)> = h.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
            let q: Vec<(&str, i64, &str)> = q.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
            mutex(&key, capacity[k], &h, &q)
        }).collect();
        let everywhere = find(&locks);
        for here in &locks {
            let near = neighbourhood(here.clone(), |_| ids(&locks), |id| by_id(&locks, id));
            prop_assert_eq!(
                acting_on(find(&near), &here.lock),
                acting_on(everywhere.clone(), &here.lock),
                "lock {}", here.lock.describe()
            );
        }
    }
}
