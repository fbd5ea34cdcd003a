//! A round drawn from a seed: keys, groups, PipelineRuns in bursts, and faults at set times.
//! Pure: the same seed and knobs give the same plan, so a printed seed reproduces a round (up to
//! the timing of the real cluster it runs on).

use proptest::prelude::RngExt;
use proptest::test_runner::{RngAlgorithm, TestRng};
use std::collections::BTreeSet;

/// A ChaCha RNG seeded from a number.
pub fn rng(seed: u64) -> TestRng {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    TestRng::from_seed(RngAlgorithm::ChaCha, &bytes)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Supersede {
    Pending,
    None,
    Running,
}

impl Supersede {
    pub fn as_str(self) -> &'static str {
        match self {
            Supersede::Pending => "pending",
            Supersede::None => "none",
            Supersede::Running => "running",
        }
    }
}

pub const CANCEL_MODES: [&str; 3] = ["Cancelled", "CancelledRunFinally", "StoppedRunFinally"];

#[derive(Clone, Debug)]
pub struct KeyPlan {
    pub name: String,
    pub capacity: usize,
}

/// A group belongs to one key and has one supersede mode for the round.
#[derive(Clone, Debug)]
pub struct GroupPlan {
    pub name: String,
    pub key: usize,
    pub supersede: Supersede,
}

#[derive(Clone, Debug)]
pub struct RunPlan {
    /// `c<index>-<group>`: the index keeps same-second name order equal to creation order.
    pub name: String,
    pub group: usize,
    /// Created this long after the round started.
    pub at_ms: u64,
    pub sequence: Option<i64>,
    pub priority: i64,
    pub wait: bool,
    pub cancel_mode: &'static str,
    pub lock_timeout_s: Option<u64>,
    pub retries: u32,
    pub pipeline_timeout_s: Option<u64>,
    pub deploy_ms: u64,
    /// How long the deploy keeps working after SIGTERM (0: ends at once).
    pub term_extra_ms: u64,
    pub shape: Shape,
}

/// How a run's pipeline takes the lock (issue 23's user actions that are pipeline shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One lock task, then the deploy.
    Plain,
    /// A second lock task on the same key, with `release-after` a quick task: its section is
    /// over early, while the first lock task still guards the deploy (item 1).
    Sibling,
    /// `keys: <its group's key>,<this key>`: one deploy per key, both under one grant (item 5).
    MultiKey(usize),
    /// No lock task: the PipelineRun is created Pending with the key annotation, and the lock
    /// queues it as a whole (issue 26); its deploy reads the token from its annotation.
    Queued,
}

/// Every kind of fault, named as `--faults` takes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    ControllerKill,
    ControllerReplica,
    ControllerPause,
    ApiserverRestart,
    EtcdRestart,
    UserCancel,
    UserDeleteRun,
    UserDeleteLockRun,
    MutexDelete,
    MutexWipe,
    AdmissionDeny,
    SiblingReleaseAfter,
    Repoint,
    DeleteReserved,
}

pub const ALL_FAULTS: [FaultKind; 14] = [
    FaultKind::ControllerKill,
    FaultKind::ControllerReplica,
    FaultKind::ControllerPause,
    FaultKind::ApiserverRestart,
    FaultKind::EtcdRestart,
    FaultKind::UserCancel,
    FaultKind::UserDeleteRun,
    FaultKind::UserDeleteLockRun,
    FaultKind::MutexDelete,
    FaultKind::MutexWipe,
    FaultKind::AdmissionDeny,
    FaultKind::SiblingReleaseAfter,
    FaultKind::Repoint,
    FaultKind::DeleteReserved,
];

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ControllerKill => "controller-kill",
            FaultKind::ControllerReplica => "controller-replica",
            FaultKind::ControllerPause => "controller-pause",
            FaultKind::ApiserverRestart => "apiserver-restart",
            FaultKind::EtcdRestart => "etcd-restart",
            FaultKind::UserCancel => "user-cancel",
            FaultKind::UserDeleteRun => "user-delete-run",
            FaultKind::UserDeleteLockRun => "user-delete-lock-run",
            FaultKind::MutexDelete => "mutex-delete",
            FaultKind::MutexWipe => "mutex-wipe",
            FaultKind::AdmissionDeny => "admission-deny",
            FaultKind::SiblingReleaseAfter => "sibling-release-after",
            FaultKind::Repoint => "repoint",
            FaultKind::DeleteReserved => "delete-reserved",
        }
    }

    fn category(self) -> &'static str {
        match self {
            FaultKind::ControllerKill
            | FaultKind::ControllerReplica
            | FaultKind::ControllerPause => "controller",
            FaultKind::ApiserverRestart | FaultKind::EtcdRestart => "apiserver",
            FaultKind::UserCancel
            | FaultKind::UserDeleteRun
            | FaultKind::UserDeleteLockRun
            | FaultKind::SiblingReleaseAfter
            | FaultKind::Repoint
            | FaultKind::DeleteReserved => "users",
            FaultKind::MutexDelete | FaultKind::MutexWipe => "mutex",
            FaultKind::AdmissionDeny => "admission",
        }
    }
}

/// Parses `--faults`: a comma list of categories (`controller`, `apiserver`, `users`, `mutex`,
/// `admission`), single kinds (`etcd-restart`, ...), `all` or `none`.
pub fn parse_faults(text: &str) -> Result<BTreeSet<FaultKind>, String> {
    let mut out = BTreeSet::new();
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let matched: Vec<_> = ALL_FAULTS
            .iter()
            .copied()
            .filter(|k| word == "all" || k.name() == word || k.category() == word)
            .collect();
        if matched.is_empty() && word != "none" {
            let kinds: Vec<_> = ALL_FAULTS.iter().map(|k| k.name()).collect();
            return Err(format!(
                "unknown fault {word:?}: use all, none, a category (controller, apiserver, users, \
                 mutex, admission) or a kind ({})",
                kinds.join(", ")
            ));
        }
        out.extend(matched);
    }
    Ok(out)
}

/// One fault at a time offset.
#[derive(Clone, Debug)]
pub struct FaultPlan {
    pub at_ms: u64,
    pub kind: FaultKind,
    /// How long it lasts (downtime, pause, second replica, denial), where that applies.
    pub for_ms: u64,
    /// The run it targets (index into `runs`), for user faults.
    pub run: usize,
    /// The key it targets, for Mutex faults.
    pub key: usize,
    /// The cancel mode, for a user cancel.
    pub mode: &'static str,
}

#[derive(Clone, Debug)]
pub struct Knobs {
    pub min_runs: usize,
    pub max_runs: usize,
    pub faults: BTreeSet<FaultKind>,
    pub unguarded: bool,
}

#[derive(Clone, Debug)]
pub struct RoundPlan {
    pub seed: u64,
    pub unguarded: bool,
    pub keys: Vec<KeyPlan>,
    pub groups: Vec<GroupPlan>,
    pub runs: Vec<RunPlan>,
    pub faults: Vec<FaultPlan>,
}

impl RoundPlan {
    pub fn key_of(&self, run: &RunPlan) -> &KeyPlan {
        &self.keys[self.groups[run.group].key]
    }

    /// The keys a run takes: its group's, and a second one for a multi-key run.
    pub fn keys_of(&self, run: &RunPlan) -> Vec<usize> {
        let own = self.groups[run.group].key;
        match run.shape {
            Shape::MultiKey(other) => vec![own, other],
            Shape::Plain | Shape::Sibling | Shape::Queued => vec![own],
        }
    }

    /// How long every run may take at most before it counts as stuck: per key, the deploys
    /// one after another plus each run's overhead, plus the longest lock wait, the faults'
    /// downtime and a margin. The round's bound is the largest over keys, after the last
    /// creation.
    pub fn liveness_bound_ms(&self) -> u64 {
        const PER_RUN_OVERHEAD_MS: u64 = 6_000;
        const MARGIN_MS: u64 = 90_000;
        let per_key = (0..self.keys.len()).map(|k| {
            let runs = self.runs.iter().filter(|r| self.keys_of(r).contains(&k));
            let work: u64 = runs
                .clone()
                .map(|r| r.deploy_ms + r.term_extra_ms + PER_RUN_OVERHEAD_MS)
                .sum();
            let wait = runs
                .map(|r| r.lock_timeout_s.unwrap_or(0) * 1000 * (u64::from(r.retries) + 1))
                .max()
                .unwrap_or(0);
            work + wait
        });
        let downtime: u64 = self.faults.iter().map(|f| f.for_ms).sum();
        let last_created = self.runs.iter().map(|r| r.at_ms).max().unwrap_or(0);
        last_created + per_key.max().unwrap_or(0) + downtime + MARGIN_MS
    }
}

/// Draws a round.
pub fn draw(seed: u64, knobs: &Knobs) -> RoundPlan {
    let mut rng = rng(seed);
    let keys: Vec<KeyPlan> = (1..=3)
        .map(|i| KeyPlan {
            name: format!("k{i}"),
            capacity: if rng.random_bool(0.25) { 2 } else { 1 },
        })
        .collect();
    let supersedes = [Supersede::Pending, Supersede::None, Supersede::Running];
    let groups: Vec<GroupPlan> = (0..rng.random_range(4..=6usize))
        .map(|i| GroupPlan {
            name: format!("g{}", i + 1),
            key: if i < keys.len() {
                i
            } else {
                rng.random_range(0..keys.len())
            },
            supersede: supersedes[rng.random_range(0..supersedes.len())],
        })
        .collect();
    let mut runs = draw_runs(&mut rng, &groups, knobs);
    let faults = draw_faults(&mut rng, &runs, keys.len(), knobs);
    draw_shapes(&mut rng, &mut runs, &groups, &faults, keys.len());
    RoundPlan {
        seed,
        unguarded: knobs.unguarded,
        keys,
        groups,
        runs,
        faults,
    }
}

fn draw_runs(rng: &mut TestRng, groups: &[GroupPlan], knobs: &Knobs) -> Vec<RunPlan> {
    let n = rng.random_range(knobs.min_runs..=knobs.max_runs.max(knobs.min_runs));
    let mut bursts: Vec<u64> = (0..rng.random_range(3..=6))
        .map(|_| rng.random_range(0..40_000))
        .collect();
    bursts[0] = 0;
    bursts.sort_unstable();
    let mut times: Vec<u64> = (0..n)
        .map(|_| bursts[rng.random_range(0..bursts.len())])
        .collect();
    times.sort_unstable();
    let mut next_seq = vec![100i64; groups.len()];
    times
        .into_iter()
        .enumerate()
        .map(|(i, at_ms)| {
            let group = rng.random_range(0..groups.len());
            let sequence = rng.random_bool(0.7).then(|| {
                next_seq[group] += 1;
                if rng.random_bool(0.2) {
                    next_seq[group] - rng.random_range(1..=3) // out of order: an older build
                } else {
                    next_seq[group]
                }
            });
            let lock_timeout_s = rng.random_bool(0.25).then(|| rng.random_range(5..=20));
            RunPlan {
                name: format!("c{i:02}-{}", groups[group].name),
                group,
                at_ms,
                sequence,
                priority: if rng.random_bool(0.2) {
                    rng.random_range(1..=3)
                } else {
                    0
                },
                wait: !rng.random_bool(0.1),
                cancel_mode: CANCEL_MODES[rng.random_range(0..CANCEL_MODES.len())],
                retries: if lock_timeout_s.is_some() && rng.random_bool(0.4) {
                    rng.random_range(1..=2)
                } else {
                    0
                },
                lock_timeout_s,
                pipeline_timeout_s: rng.random_bool(0.1).then(|| rng.random_range(20..=60)),
                deploy_ms: rng.random_range(1_000..=6_000),
                term_extra_ms: if rng.random_bool(0.4) {
                    rng.random_range(2_000..=5_000)
                } else {
                    0
                },
                shape: Shape::Plain,
            }
        })
        .collect()
}

fn draw_faults(rng: &mut TestRng, runs: &[RunPlan], keys: usize, knobs: &Knobs) -> Vec<FaultPlan> {
    let kinds: Vec<FaultKind> = knobs.faults.iter().copied().collect();
    if kinds.is_empty() {
        return vec![];
    }
    let mut faults: Vec<FaultPlan> = (0..rng.random_range(4..=8))
        .map(|_| {
            let kind = kinds[rng.random_range(0..kinds.len())];
            let at_ms = rng.random_range(3_000..50_000);
            let for_ms = match kind {
                FaultKind::ControllerKill => rng.random_range(1_000..=6_000),
                FaultKind::ControllerReplica => rng.random_range(10_000..=30_000),
                FaultKind::ControllerPause => rng.random_range(3_000..=10_000),
                FaultKind::ApiserverRestart | FaultKind::EtcdRestart => rng.random_range(0..=3_000),
                FaultKind::AdmissionDeny => rng.random_range(5_000..=20_000),
                _ => 0,
            };
            // A user acts on a run that exists by then.
            let created = runs.iter().filter(|r| r.at_ms <= at_ms).count().max(1);
            FaultPlan {
                at_ms,
                kind,
                for_ms,
                run: rng.random_range(0..created),
                key: rng.random_range(0..keys),
                mode: CANCEL_MODES[rng.random_range(0..CANCEL_MODES.len())],
            }
        })
        .collect();
    faults.sort_by_key(|f| f.at_ms);
    faults
}

/// The shape faults: a `sibling-release-after` fault gives its run the sibling shape; with
/// `delete-reserved` on, its run and about one run in six take two keys, so that keys keep
/// reservations for the fault to find.
fn draw_shapes(
    rng: &mut TestRng,
    runs: &mut [RunPlan],
    groups: &[GroupPlan],
    faults: &[FaultPlan],
    keys: usize,
) {
    let multi_key = |run: &mut RunPlan, rng: &mut TestRng| {
        let own = groups[run.group].key;
        run.shape = Shape::MultiKey((own + rng.random_range(1..keys)) % keys);
        run.wait = true; // `keys` refuses `wait: "false"`
    };
    if faults.iter().any(|f| f.kind == FaultKind::DeleteReserved) {
        for run in runs.iter_mut() {
            if rng.random_bool(1.0 / 6.0) {
                multi_key(run, rng);
            }
        }
    }
    for f in faults {
        match f.kind {
            FaultKind::SiblingReleaseAfter => runs[f.run].shape = Shape::Sibling,
            FaultKind::DeleteReserved => multi_key(&mut runs[f.run], rng),
            _ => {}
        }
    }
    draw_queued(rng, runs, faults);
}

/// About one run in six is queued as a whole, of those that wait and that no fault on a lock
/// run aims at (a queued PipelineRun has none). Its `timeout` is its `queue-timeout`; retries
/// are a lock task's.
fn draw_queued(rng: &mut TestRng, runs: &mut [RunPlan], faults: &[FaultPlan]) {
    let aimed_at_its_lock_run = |i: usize| {
        faults.iter().any(|f| {
            f.run == i
                && matches!(
                    f.kind,
                    FaultKind::UserDeleteLockRun | FaultKind::Repoint | FaultKind::DeleteReserved
                )
        })
    };
    for (i, run) in runs.iter_mut().enumerate() {
        if run.shape == Shape::Plain
            && run.wait
            && !aimed_at_its_lock_run(i)
            && rng.random_bool(1.0 / 6.0)
        {
            run.shape = Shape::Queued;
            run.retries = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn knobs() -> Knobs {
        Knobs {
            min_runs: 20,
            max_runs: 40,
            faults: ALL_FAULTS.iter().copied().collect(),
            unguarded: false,
        }
    }

    #[test]
    fn a_seed_gives_the_same_round() {
        let (a, b) = (draw(42, &knobs()), draw(42, &knobs()));
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_ne!(format!("{a:?}"), format!("{:?}", draw(43, &knobs())));
    }

    #[test]
    fn rounds_cover_what_the_campaign_promises() {
        let plans: Vec<_> = (0..50).map(|s| draw(s, &knobs())).collect();
        for p in &plans {
            assert!((20..=40).contains(&p.runs.len()));
            assert!(p.runs.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        }
        let runs = || plans.iter().flat_map(|p| p.runs.iter());
        assert!(runs().any(|r| r.sequence.is_none()));
        assert!(runs().any(|r| !r.wait));
        assert!(runs().any(|r| r.retries > 0));
        assert!(runs().any(|r| r.term_extra_ms > 0));
        for mode in CANCEL_MODES {
            assert!(runs().any(|r| r.cancel_mode == mode));
        }
        let faults: BTreeSet<_> = plans
            .iter()
            .flat_map(|p| &p.faults)
            .map(|f| f.kind)
            .collect();
        assert_eq!(faults.len(), ALL_FAULTS.len());
        assert!(plans.iter().any(|p| p.keys.iter().any(|k| k.capacity == 2)));
        assert!(runs().any(|r| r.shape == Shape::Sibling));
        assert!(runs().any(|r| matches!(r.shape, Shape::MultiKey(_)) && r.wait));
        assert!(runs().any(|r| r.shape == Shape::Queued && r.wait && r.retries == 0));
    }

    #[test]
    fn fault_lists_parse() {
        let f = parse_faults("controller,etcd-restart").unwrap();
        assert!(f.contains(&FaultKind::ControllerPause) && f.contains(&FaultKind::EtcdRestart));
        assert!(!f.contains(&FaultKind::ApiserverRestart));
        assert_eq!(parse_faults("all").unwrap().len(), ALL_FAULTS.len());
        assert!(parse_faults("none").unwrap().is_empty());
        assert!(
            parse_faults("kubelet")
                .unwrap_err()
                .contains("unknown fault")
        );
    }
}
