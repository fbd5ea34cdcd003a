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
    /// `spec.order`, when the round sets one (the matrix shape needs keys of different order).
    pub order: Option<&'static str>,
    /// Its Mutex takes the round's `Shape::Selected` runs by `spec.selector` (issue 46).
    pub selecting: bool,
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
    /// A lock task matrixed over two keys of different `order` (issue 37): two lock runs of one
    /// PipelineRun that each decide alone, so PipelineRuns may deadlock across the keys.
    Matrix(usize, usize),
    /// Two lock tasks, the first key's, then the second's (issue 37): runs taking the same two
    /// keys in opposite orders may deadlock.
    Opposite(usize, usize),
    /// As a Trigger creates it (issue 46): a `pipelineRef` to the round's selected Pipeline, no
    /// lock task, no annotation, not Pending. The selecting Mutex's `spec.selector` takes it and
    /// the queue-at-create admission policy makes it Pending; once the selector no longer takes
    /// it, it runs unlocked. Its deploy reads the token annotation, as a queued run's does.
    Selected,
}

impl Shape {
    /// A shape whose PipelineRun takes keys in separate lock runs: the controller may end its
    /// wait with reason `Deadlock` (the youngest of a cycle).
    pub fn cross(self) -> bool {
        matches!(self, Shape::Matrix(..) | Shape::Opposite(..))
    }
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
    RerunCopy,
    RequeuedCopy,
    MatrixKeys,
    OppositeOrders,
    MutexRestore,
    AuthorStart,
    SelectorEdit,
    /// A round shape, not a fault of the round's namespace: two tenant namespaces share a
    /// ClusterMutex under a cluster-wide controller (issue 46; tests/chaos/tenants.rs).
    ClusterTenants,
    /// Issue 49's API-level faults (tests/chaos/api_faults.rs), drawn apart (`draw_api`).
    ApfThrottle,
    WatchExpiry,
    RefuseRunWrites,
    /// etcd restored from a snapshot taken earlier in the round (tests/chaos/restore.rs).
    EtcdRestore,
}

pub const ALL_FAULTS: [FaultKind; 26] = [
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
    FaultKind::RerunCopy,
    FaultKind::RequeuedCopy,
    FaultKind::MatrixKeys,
    FaultKind::OppositeOrders,
    FaultKind::MutexRestore,
    FaultKind::AuthorStart,
    FaultKind::SelectorEdit,
    FaultKind::ClusterTenants,
    FaultKind::ApfThrottle,
    FaultKind::WatchExpiry,
    FaultKind::RefuseRunWrites,
    FaultKind::EtcdRestore,
];

/// The API-level kinds (issue 49), category `api`. A new kind goes last: each draws from the
/// same RNG in this order, so the kinds before it keep every seed's draws.
pub const API_FAULTS: [FaultKind; 4] = [
    FaultKind::ApfThrottle,
    FaultKind::WatchExpiry,
    FaultKind::RefuseRunWrites,
    FaultKind::EtcdRestore,
];

/// How a `selector-edit` changes the selecting Mutex: its selector edited so that it takes
/// none of the round's runs, or the Mutex deleted.
pub const SELECTOR_EDITS: [&str; 2] = ["edit", "delete"];

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
            FaultKind::RerunCopy => "rerun-copy",
            FaultKind::RequeuedCopy => "requeued-copy",
            FaultKind::MatrixKeys => "matrix-keys",
            FaultKind::OppositeOrders => "opposite-orders",
            FaultKind::MutexRestore => "mutex-restore",
            FaultKind::AuthorStart => "author-start",
            FaultKind::SelectorEdit => "selector-edit",
            FaultKind::ClusterTenants => "cluster-tenants",
            FaultKind::ApfThrottle => "apf-throttle",
            FaultKind::WatchExpiry => "watch-expiry",
            FaultKind::RefuseRunWrites => "refuse-run-writes",
            FaultKind::EtcdRestore => "etcd-restore",
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
            | FaultKind::DeleteReserved
            | FaultKind::RerunCopy
            | FaultKind::RequeuedCopy
            | FaultKind::MatrixKeys
            | FaultKind::OppositeOrders
            | FaultKind::AuthorStart => "users",
            FaultKind::SelectorEdit => "selector",
            FaultKind::MutexDelete | FaultKind::MutexWipe | FaultKind::MutexRestore => "mutex",
            FaultKind::AdmissionDeny => "admission",
            FaultKind::ClusterTenants => "tenants",
            FaultKind::ApfThrottle
            | FaultKind::WatchExpiry
            | FaultKind::RefuseRunWrites
            | FaultKind::EtcdRestore => "api",
        }
    }

    /// Drawn with an RNG of their own, so that adding them changed no seed's other faults.
    fn drawn_apart(self) -> bool {
        self == FaultKind::ClusterTenants || API_FAULTS.contains(&self)
    }

    /// Restarts the control plane: once per round at most.
    fn once(self) -> bool {
        matches!(self, FaultKind::WatchExpiry | FaultKind::EtcdRestore)
    }

    /// Needs the controller to run with an identity of its own (api_faults::Identity).
    pub fn needs_identity(self) -> bool {
        matches!(self, FaultKind::ApfThrottle | FaultKind::RefuseRunWrites)
    }

    /// A fault the main round (its one namespace) draws; `cluster-tenants` is a round of its own
    /// (drawn apart, so adding it changed no seed's main round).
    pub fn in_main_round(self) -> bool {
        self != FaultKind::ClusterTenants
    }
}

/// Parses `--faults`: a comma list of categories (`controller`, `apiserver`, `users`, `mutex`,
/// `admission`, `selector`, `tenants`, `api`), single kinds (`etcd-restart`, ...), `all` or `none`.
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
                 mutex, admission, selector, tenants, api) or a kind ({})",
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
    /// How long it lasts (downtime, pause, second replica, denial), where that applies; for a
    /// Mutex restore, how long the controller is down around it (0: restored under its eyes).
    pub for_ms: u64,
    /// The run it targets (index into `runs`), for user faults; for a Mutex restore, its probe
    /// (index into `probes`).
    pub run: usize,
    /// The key it targets, for Mutex faults.
    pub key: usize,
    /// The cancel mode, for a user cancel; for a selector edit, one of [`SELECTOR_EDITS`].
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
    /// One run per Mutex restore, created once the restore is done (its own group, supersede
    /// none): the key hands out a token after the restore, which the checker orders.
    pub probes: Vec<RunPlan>,
    /// The `cluster-tenants` round, after the main one (or alone, when it is the only kind).
    pub tenants: Option<Box<super::tenants::TenantsPlan>>,
}

impl FaultPlan {
    /// A Mutex restore's snapshot of the lock object, early in the round.
    pub fn snapshot_ms(&self) -> u64 {
        self.at_ms / 3
    }

    /// A copy of a run (a Dashboard "Rerun" or the same copy queued Pending again).
    pub fn copies(&self) -> bool {
        matches!(self.kind, FaultKind::RerunCopy | FaultKind::RequeuedCopy)
    }
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
            Shape::Matrix(a, b) | Shape::Opposite(a, b) => vec![a, b],
            Shape::Plain | Shape::Sibling | Shape::Queued | Shape::Selected => vec![own],
        }
    }

    /// Every run the round may create: the planned ones, then for each copy fault its original
    /// again (a copy takes what it takes), then the restores' probes.
    fn all_runs(&self) -> impl Iterator<Item = &RunPlan> + Clone {
        let copies = self
            .faults
            .iter()
            .filter(|f| f.copies())
            .filter_map(|f| self.runs.get(f.run));
        self.runs.iter().chain(copies).chain(&self.probes)
    }

    /// How long every run may take at most before it counts as stuck: per key, the deploys
    /// one after another plus each run's overhead, plus the longest lock wait, the faults'
    /// downtime and a margin. The round's bound is the largest over keys, after the last
    /// creation.
    pub fn liveness_bound_ms(&self) -> u64 {
        const PER_RUN_OVERHEAD_MS: u64 = 6_000;
        const MARGIN_MS: u64 = 90_000;
        let per_key = (0..self.keys.len()).map(|k| {
            let runs = self.all_runs().filter(|r| self.keys_of(r).contains(&k));
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
        // A restore may wait up to 120 s for its key to be idle and 60 s for its deletion
        // before its probe is created.
        const RESTORE_WAIT_MS: u64 = 180_000;
        // An etcd restore stops and starts etcd and the API server; then every watch lists
        // again, Tekton's included, after its backoff.
        const ETCD_RESTORE_MS: u64 = 120_000;
        let downtime: u64 = self
            .faults
            .iter()
            .map(|f| match f.kind {
                FaultKind::MutexRestore => f.for_ms + RESTORE_WAIT_MS,
                FaultKind::EtcdRestore => f.for_ms + ETCD_RESTORE_MS,
                _ => f.for_ms,
            })
            .sum();
        let last_created = self.all_runs().map(|r| r.at_ms).max().unwrap_or(0);
        last_created + per_key.max().unwrap_or(0) + downtime + MARGIN_MS
    }
}

/// Draws a round.
pub fn draw(seed: u64, knobs: &Knobs) -> RoundPlan {
    let mut rng = rng(seed);
    let mut keys: Vec<KeyPlan> = (1..=3)
        .map(|i| KeyPlan {
            name: format!("k{i}"),
            capacity: if rng.random_bool(0.25) { 2 } else { 1 },
            order: None,
            selecting: false,
        })
        .collect();
    let supersedes = [Supersede::Pending, Supersede::None, Supersede::Running];
    let mut groups: Vec<GroupPlan> = (0..rng.random_range(4..=6usize))
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
    let mut faults = draw_faults(&mut rng, &runs, keys.len(), knobs);
    draw_shapes(&mut rng, &mut runs, &groups, &mut faults, keys.len());
    if faults.iter().any(|f| f.kind == FaultKind::MatrixKeys) {
        // The matrix shape's keys, k1 and k2, queue in different orders (every order said).
        for (i, k) in keys.iter_mut().enumerate() {
            k.order = Some(if i == MATRIX_KEYS.1 {
                "newest-first"
            } else {
                "oldest-first"
            });
        }
    }
    draw_selected(&mut rng, &mut keys, &mut groups, &mut runs, &mut faults);
    let probes = draw_probes(&mut faults, &mut groups, &keys);
    faults.extend(draw_api(seed, &runs, knobs));
    faults.sort_by_key(|f| f.at_ms);
    let tenants = super::tenants::draw(seed, knobs).map(Box::new);
    if tenants.is_some() {
        // Its marker, so that the fault lists and the CI seeds' check see it drawn.
        faults.push(FaultPlan {
            at_ms: 0,
            kind: FaultKind::ClusterTenants,
            for_ms: 0,
            run: 0,
            key: 0,
            mode: "",
        });
        if knobs.faults.iter().all(|k| !k.in_main_round()) {
            runs.clear(); // `--faults cluster-tenants`: the tenants' round alone
        }
    }
    RoundPlan {
        seed,
        unguarded: knobs.unguarded,
        keys,
        groups,
        runs,
        faults,
        probes,
        tenants,
    }
}

/// Issue 49's API-level faults, from an RNG of their own: each kind asked for once in about
/// half the rounds, or once or twice (a watch expiry once) in every round when only API-level
/// kinds are asked for.
/// A `refuse-run-writes` or `watch-expiry` aims at a plain run created by then (one with a lock
/// task, whose lock run the controller writes); an `etcd-restore` snapshots etcd at its time
/// and restores it `for_ms` later.
fn draw_api(seed: u64, runs: &[RunPlan], knobs: &Knobs) -> Vec<FaultPlan> {
    draw_api_salted(seed ^ API_SALT, runs, knobs)
}

/// Salts the API-level faults' RNG; picked so that the CI seeds draw each API-level kind once
/// (`the_ci_seeds_draw_every_kind`).
const API_SALT: u64 = 0x6170_695f_6661_7504;

/// Salts the etcd restore's own RNG: a restore costs a minute or two, so among other kinds it is
/// drawn in a quarter of the rounds, and of the CI seeds by one (`the_ci_seeds_draw_every_kind`).
const RESTORE_SALT: u64 = 1;

fn draw_api_salted(seed: u64, runs: &[RunPlan], knobs: &Knobs) -> Vec<FaultPlan> {
    let mut shared = rng(seed);
    let mut own = rng(seed ^ RESTORE_SALT);
    let only_api = knobs.faults.iter().all(|k| API_FAULTS.contains(k));
    let mut out = vec![];
    for kind in API_FAULTS.into_iter().filter(|k| knobs.faults.contains(k)) {
        let (rng, odds) = match kind {
            FaultKind::EtcdRestore => (&mut own, 0.25),
            _ => (&mut shared, 0.5),
        };
        // A watch expiry or an etcd restore stops the schedule for a while (the API server
        // restarts): once.
        let n = match (only_api, kind) {
            (true, k) if k.once() => 1,
            (true, _) => rng.random_range(1..=2),
            (false, _) => usize::from(rng.random_bool(odds)),
        };
        for _ in 0..n {
            // A refusal while runs still wait for their grants.
            let at_ms = match kind {
                FaultKind::RefuseRunWrites => rng.random_range(5_000..25_000),
                _ => rng.random_range(5_000..45_000),
            };
            // For a restore: from the snapshot to the restore (grants happen meanwhile).
            let for_ms = match kind {
                FaultKind::ApfThrottle => rng.random_range(5_000..=15_000),
                FaultKind::RefuseRunWrites => rng.random_range(10_000..=25_000),
                FaultKind::EtcdRestore => rng.random_range(8_000..=20_000),
                _ => 0,
            };
            let plain: Vec<usize> = (0..runs.len())
                .filter(|&i| runs[i].at_ms < at_ms && runs[i].shape == Shape::Plain)
                .collect();
            let run = match plain.len() {
                0 => 0,
                n => plain[rng.random_range(0..n)],
            };
            out.push(FaultPlan {
                at_ms,
                kind,
                for_ms,
                run,
                key: 0,
                mode: "",
            });
        }
    }
    out
}

/// The keys of the matrix shape (of different order) and of the opposite-orders shape.
pub const MATRIX_KEYS: (usize, usize) = (0, 1);
pub const OPPOSITE_KEYS: (usize, usize) = (0, 2);

/// A probe per Mutex restore: a plain run of a group of its own (supersede none) on the
/// restored key, created once the restore is done.
fn draw_probes(
    faults: &mut [FaultPlan],
    groups: &mut Vec<GroupPlan>,
    keys: &[KeyPlan],
) -> Vec<RunPlan> {
    let mut probes = vec![];
    for f in faults
        .iter_mut()
        .filter(|f| f.kind == FaultKind::MutexRestore)
    {
        let i = probes.len();
        groups.push(GroupPlan {
            name: format!("restore{}", i + 1),
            key: f.key,
            supersede: Supersede::None,
        });
        probes.push(RunPlan {
            name: format!("p{i:02}-restore{}-{}", i + 1, keys[f.key].name),
            group: groups.len() - 1,
            at_ms: f.at_ms,
            sequence: None,
            priority: 0,
            wait: true,
            cancel_mode: CANCEL_MODES[0],
            lock_timeout_s: None,
            retries: 0,
            pipeline_timeout_s: None,
            deploy_ms: 1_000,
            term_extra_ms: 0,
            shape: Shape::Plain,
        });
        f.run = i;
    }
    probes
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
    let kinds: Vec<FaultKind> = knobs
        .faults
        .iter()
        .copied()
        .filter(|k| !k.drawn_apart())
        .collect();
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
                // Half the restores happen while the controller is down.
                FaultKind::MutexRestore if rng.random_bool(0.5) => rng.random_range(1_000..=6_000),
                _ => 0,
            };
            let mode = match kind {
                FaultKind::SelectorEdit => {
                    SELECTOR_EDITS[rng.random_range(0..SELECTOR_EDITS.len())]
                }
                _ => CANCEL_MODES[rng.random_range(0..CANCEL_MODES.len())],
            };
            // A user acts on a run that exists by then.
            let created = runs.iter().filter(|r| r.at_ms <= at_ms).count().max(1);
            FaultPlan {
                at_ms,
                kind,
                for_ms,
                run: rng.random_range(0..created),
                key: rng.random_range(0..keys),
                mode,
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
    faults: &mut [FaultPlan],
    keys: usize,
) {
    // With the matrix shape, k2 queues newest first: `keys` refuses keys of different order,
    // so a multi-key run takes k1 and k3, and a run of k2 stays as it is.
    let mixed = faults.iter().any(|f| f.kind == FaultKind::MatrixKeys);
    let multi_key = |run: &mut RunPlan, rng: &mut TestRng| {
        let own = groups[run.group].key;
        let other = if !mixed {
            (own + rng.random_range(1..keys)) % keys
        } else if own == MATRIX_KEYS.1 {
            return;
        } else {
            (0..keys)
                .find(|&k| k != own && k != MATRIX_KEYS.1)
                .unwrap_or(own)
        };
        run.shape = Shape::MultiKey(other);
        run.wait = true; // `keys` refuses `wait: "false"`
    };
    if faults.iter().any(|f| f.kind == FaultKind::DeleteReserved) {
        for run in runs.iter_mut() {
            if rng.random_bool(1.0 / 6.0) {
                multi_key(run, rng);
            }
        }
    }
    for f in faults.iter() {
        match f.kind {
            FaultKind::SiblingReleaseAfter => runs[f.run].shape = Shape::Sibling,
            FaultKind::DeleteReserved => multi_key(&mut runs[f.run], rng),
            _ => {}
        }
    }
    draw_cross(rng, runs, groups, faults);
    draw_queued(rng, runs, faults);
    draw_author_starts(runs, faults);
    draw_copied(rng, runs, faults);
}

/// The cross-key shapes: a `matrix-keys` or `opposite-orders` fault gives its run the shape, and
/// about one plain run in five takes it too, so that cycles can form. They wait (no `wait:
/// "false"`, no retries), like the runs they deadlock with.
fn draw_cross(rng: &mut TestRng, runs: &mut [RunPlan], groups: &[GroupPlan], faults: &[FaultPlan]) {
    let opposite = |run: &RunPlan, rng: &mut TestRng| {
        let (a, b) = OPPOSITE_KEYS;
        let own = groups[run.group].key;
        if own == b || (own != a && rng.random_bool(0.5)) {
            Shape::Opposite(b, a)
        } else {
            Shape::Opposite(a, b)
        }
    };
    for kind in [FaultKind::MatrixKeys, FaultKind::OppositeOrders] {
        let aimed: Vec<usize> = faults
            .iter()
            .filter(|f| f.kind == kind)
            .map(|f| f.run)
            .collect();
        if aimed.is_empty() {
            continue;
        }
        for (i, run) in runs.iter_mut().enumerate() {
            let take = aimed.contains(&i) || (run.shape == Shape::Plain && rng.random_bool(0.2));
            if !take || run.shape.cross() {
                continue;
            }
            run.shape = match kind {
                FaultKind::MatrixKeys => Shape::Matrix(MATRIX_KEYS.0, MATRIX_KEYS.1),
                _ => opposite(run, rng),
            };
            run.wait = true;
            run.retries = 0;
        }
    }
}

/// A copy fault copies a run queued as a whole: a `requeued-copy` always (queued Pending again,
/// only a run queued as a whole can be), a `rerun-copy` mostly (else a lock task's run, whose copy
/// is a new member with a lock task of its own). The run it aims at is made queued if plain,
/// else the fault aims at the latest queued run created by then, if any.
fn draw_copied(rng: &mut TestRng, runs: &mut [RunPlan], faults: &mut [FaultPlan]) {
    for f in faults.iter_mut().filter(|f| f.copies()) {
        if f.kind == FaultKind::RerunCopy && rng.random_bool(0.3) {
            continue;
        }
        let run = &mut runs[f.run];
        if run.shape == Shape::Plain {
            run.shape = Shape::Queued;
            run.wait = true;
            run.retries = 0;
        } else if run.shape != Shape::Queued
            && let Some(q) = (0..f.run).rev().find(|&i| runs[i].shape == Shape::Queued)
        {
            f.run = q;
        }
    }
}

/// About one run in six is queued as a whole, of those that wait and that no fault on a lock
/// run aims at (a queued PipelineRun has none). Its `timeout` is its `queue-timeout`; retries
/// are a lock task's.
fn draw_queued(rng: &mut TestRng, runs: &mut [RunPlan], faults: &[FaultPlan]) {
    for (i, run) in runs.iter_mut().enumerate() {
        if run.shape == Shape::Plain
            && run.wait
            && !aimed_at_its_lock_run(faults, i)
            && rng.random_bool(1.0 / 6.0)
        {
            run.shape = Shape::Queued;
            run.retries = 0;
        }
    }
}

/// Whether a fault on a lock run (delete, re-point, a reserved slot's) aims at run `i`: it needs
/// a lock task, so the run keeps its shape.
fn aimed_at_its_lock_run(faults: &[FaultPlan], i: usize) -> bool {
    faults.iter().any(|f| {
        f.run == i
            && matches!(
                f.kind,
                FaultKind::UserDeleteLockRun | FaultKind::Repoint | FaultKind::DeleteReserved
            )
    })
}

/// An `author-start` fault aims at a run queued as a whole: the run it aims at is made queued if
/// plain (and no lock-run fault needs its lock task), else it aims at the latest queued run
/// created before it, if any. At its time the round picks another queued run still waiting if
/// this one is not.
fn draw_author_starts(runs: &mut [RunPlan], faults: &mut [FaultPlan]) {
    for i in 0..faults.len() {
        if faults[i].kind != FaultKind::AuthorStart {
            continue;
        }
        let target = faults[i].run;
        let run = &mut runs[target];
        if run.shape == Shape::Plain && !aimed_at_its_lock_run(faults, target) {
            run.shape = Shape::Queued;
            run.wait = true;
            run.retries = 0;
        } else if run.shape != Shape::Queued
            && let Some(q) = (0..target).rev().find(|&j| runs[j].shape == Shape::Queued)
        {
            faults[i].run = q;
        }
    }
}

/// The selecting key of a round with a `selector-edit` fault.
pub const SELECTING_KEY: &str = "k4";
/// The supersede group of the selected runs: their Pipeline's name, the default group.
pub const SELECTED_GROUP: &str = "selected";

/// With a `selector-edit` fault, a fourth key whose Mutex selects (capacity 1), and about one
/// plain waiting run in four (at least three), of those no lock-run fault aims at, created as a
/// Trigger creates it (`Shape::Selected`): the default group (its Pipeline's) and policy, no
/// sequence, priority or timeout (no lock params at all).
fn draw_selected(
    rng: &mut TestRng,
    keys: &mut Vec<KeyPlan>,
    groups: &mut Vec<GroupPlan>,
    runs: &mut [RunPlan],
    faults: &mut [FaultPlan],
) {
    if !faults.iter().any(|f| f.kind == FaultKind::SelectorEdit) {
        return;
    }
    keys.push(KeyPlan {
        name: SELECTING_KEY.into(),
        capacity: 1,
        order: None,
        selecting: true,
    });
    groups.push(GroupPlan {
        name: SELECTED_GROUP.into(),
        key: keys.len() - 1,
        supersede: Supersede::Pending,
    });
    let group = groups.len() - 1;
    let eligible: Vec<usize> = (0..runs.len())
        .filter(|&i| runs[i].shape == Shape::Plain && runs[i].wait)
        .filter(|&i| !aimed_at_its_lock_run(faults, i))
        .collect();
    let mut chosen: Vec<usize> = eligible
        .iter()
        .copied()
        .filter(|_| rng.random_bool(0.25))
        .collect();
    // At least three: one to hold, one to wait at an edit, one to come after it.
    for &i in &eligible {
        if chosen.len() < 3 && !chosen.contains(&i) {
            chosen.push(i);
        }
    }
    chosen.sort_unstable();
    for &i in &chosen {
        let run = &mut runs[i];
        run.name = format!("c{i:02}-{SELECTED_GROUP}");
        (run.group, run.shape, run.wait, run.retries) = (group, Shape::Selected, true, 0);
        (run.sequence, run.priority, run.lock_timeout_s) = (None, 0, None);
        run.cancel_mode = CANCEL_MODES[1]; // the default, CancelledRunFinally
    }
    // Each edit comes as a selected run other than the first is created (its burst): runs of
    // the key wait, the admission policy and the controller may each see either selector.
    for f in faults
        .iter_mut()
        .filter(|f| f.kind == FaultKind::SelectorEdit)
    {
        f.key = keys.len() - 1;
        if chosen.len() > 1 {
            f.at_ms = runs[chosen[rng.random_range(1..chosen.len())]].at_ms;
        }
    }
    faults.sort_by_key(|f| f.at_ms);
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

    /// `--faults api`: each API-level kind in every round, once or twice; a refusal lasts a
    /// while, and a refusal or a watch expiry aims at a plain run created before it. Asked for
    /// with every kind, the other faults are those of the same seed without them.
    #[test]
    fn api_faults_aim_at_plain_runs_and_leave_the_other_faults_as_they_were() {
        let api = Knobs {
            faults: API_FAULTS.into(),
            ..knobs()
        };
        for seed in 1..40 {
            let p = draw(seed, &api);
            for kind in API_FAULTS {
                let n = p.faults.iter().filter(|f| f.kind == kind).count();
                let most = if kind.once() { 1 } else { 2 };
                assert!((1..=most).contains(&n), "seed {seed}: {n} {kind:?}");
            }
            for f in p.faults.iter().filter(|f| f.kind != FaultKind::ApfThrottle) {
                let run = &p.runs[f.run];
                assert!(run.shape == Shape::Plain && run.at_ms < f.at_ms, "{f:?}");
            }
            let refusals = p
                .faults
                .iter()
                .filter(|f| f.kind == FaultKind::RefuseRunWrites);
            assert!(refusals.clone().all(|f| f.for_ms >= 10_000));
            let restores = p.faults.iter().filter(|f| f.kind == FaultKind::EtcdRestore);
            assert!(restores.clone().all(|f| f.for_ms >= 8_000));
            let all = draw(seed, &knobs());
            let without: Vec<FaultKind> = all
                .faults
                .iter()
                .map(|f| f.kind)
                .filter(|k| !k.drawn_apart())
                .collect();
            let before = Knobs {
                faults: ALL_FAULTS
                    .into_iter()
                    .filter(|k| !k.drawn_apart())
                    .collect(),
                ..knobs()
            };
            let old: Vec<FaultKind> = draw(seed, &before).faults.iter().map(|f| f.kind).collect();
            assert_eq!(without, old, "seed {seed}");
        }
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
        assert!(runs().any(|r| matches!(r.shape, Shape::Matrix(..))));
        assert!(runs().any(|r| matches!(r.shape, Shape::Opposite(..))));
        assert!(runs().any(|r| r.shape == Shape::Selected));
    }

    /// Issue 46: a selector edit comes with a selecting key, its group (supersede pending, the
    /// default) and at least three runs as a Trigger creates them, the edit as one but the first
    /// is created; both kinds of edit are drawn. An author start aims at a run queued as a whole, mostly (not when none
    /// is created before it: the round then picks one still waiting at its time).
    #[test]
    fn selector_edits_have_selected_runs_and_author_starts_queued_ones() {
        let plans: Vec<_> = (0..80).map(|s| draw(s, &knobs())).collect();
        let mut edits = BTreeSet::new();
        let (mut starts, mut at_queued) = (0, 0);
        for p in &plans {
            let selecting: Vec<_> = p.keys.iter().filter(|k| k.selecting).collect();
            let has = |k| p.faults.iter().any(|f| f.kind == k);
            assert_eq!(selecting.len(), usize::from(has(FaultKind::SelectorEdit)));
            for r in p.runs.iter().filter(|r| r.shape == Shape::Selected) {
                let g = &p.groups[r.group];
                assert_eq!(
                    (g.name.as_str(), g.supersede),
                    (SELECTED_GROUP, Supersede::Pending)
                );
                assert!(p.keys[g.key].selecting && p.keys[g.key].capacity == 1);
                assert!(
                    r.wait && r.retries == 0 && r.lock_timeout_s.is_none(),
                    "{r:?}"
                );
                assert!(r.sequence.is_none() && r.priority == 0);
                assert!(r.name.ends_with(SELECTED_GROUP));
            }
            for f in &p.faults {
                match f.kind {
                    FaultKind::SelectorEdit => {
                        assert!(p.keys[f.key].selecting);
                        let selected: Vec<_> = p
                            .runs
                            .iter()
                            .filter(|r| r.shape == Shape::Selected)
                            .collect();
                        assert!(selected.len() >= 3);
                        assert!(selected[1..].iter().any(|r| r.at_ms == f.at_ms), "{f:?}");
                        edits.insert(f.mode);
                    }
                    FaultKind::AuthorStart => {
                        starts += 1;
                        at_queued += usize::from(p.runs[f.run].shape == Shape::Queued);
                    }
                    _ => {}
                }
            }
            assert!(p.keys.iter().filter(|k| !k.selecting).count() == 3);
        }
        assert_eq!(edits.len(), SELECTOR_EDITS.len());
        assert!(
            starts > 0 && at_queued * 10 >= starts * 8,
            "{at_queued} of {starts}"
        );
    }

    /// Issue 37: the cross-key shapes. A matrix is over two keys of different order; opposite
    /// orders take the same two keys both ways; both wait, with no retries.
    #[test]
    fn cross_key_runs_take_two_keys_of_different_order_or_both_ways() {
        let plans: Vec<_> = (0..50).map(|s| draw(s, &knobs())).collect();
        let mut directions = BTreeSet::new();
        for p in &plans {
            for r in p.runs.iter().filter(|r| r.shape.cross()) {
                assert!(r.wait && r.retries == 0, "{r:?}");
                let keys = p.keys_of(r);
                assert_eq!(keys.len(), 2);
                assert_ne!(keys[0], keys[1]);
                match r.shape {
                    Shape::Matrix(a, b) => {
                        assert_ne!(p.keys[a].order, p.keys[b].order, "{:?}", p.keys);
                        assert!(p.keys[a].order.is_some() && p.keys[b].order.is_some());
                    }
                    Shape::Opposite(a, b) => {
                        directions.insert((a, b));
                    }
                    _ => unreachable!(),
                }
            }
            let has = |k| p.faults.iter().any(|f| f.kind == k);
            let shaped = |m: fn(&Shape) -> bool| p.runs.iter().any(|r| m(&r.shape));
            for r in &p.runs {
                if let Shape::MultiKey(other) = r.shape {
                    let own = p.groups[r.group].key;
                    assert_ne!(own, other);
                    assert_eq!(
                        p.keys[own].order, p.keys[other].order,
                        "`keys` of one order"
                    );
                }
            }
            if has(FaultKind::MatrixKeys) {
                assert!(shaped(|s| matches!(s, Shape::Matrix(..))));
            } else {
                assert!(!shaped(|s| matches!(s, Shape::Matrix(..))));
                assert!(p.keys.iter().all(|k| k.order.is_none()));
            }
            assert_eq!(
                has(FaultKind::OppositeOrders),
                shaped(|s| matches!(s, Shape::Opposite(..)))
            );
        }
        assert_eq!(directions.len(), 2, "both orders of the same two keys");
    }

    /// Issue 37: copies aim at a run that exists by then; a re-queued copy at a run queued as a
    /// whole when there is one; a Dashboard rerun also at a lock task's run.
    #[test]
    fn copies_aim_at_created_runs_mostly_queued_ones() {
        let plans: Vec<_> = (0..80).map(|s| draw(s, &knobs())).collect();
        let copies = || {
            plans
                .iter()
                .flat_map(|p| p.faults.iter().filter(|f| f.copies()).map(move |f| (p, f)))
        };
        for (p, f) in copies() {
            let run = &p.runs[f.run];
            assert!(run.at_ms <= f.at_ms.max(p.runs[0].at_ms), "{f:?} {run:?}");
        }
        let queued = |kind| {
            copies()
                .filter(|(_, f)| f.kind == kind)
                .map(|(p, f)| p.runs[f.run].shape == Shape::Queued)
                .collect::<Vec<_>>()
        };
        let requeued = queued(FaultKind::RequeuedCopy);
        assert!(!requeued.is_empty());
        let n = requeued.iter().filter(|q| **q).count();
        assert!(n * 10 >= requeued.len() * 9, "{n} of {}", requeued.len());
        let reruns = queued(FaultKind::RerunCopy);
        assert!(reruns.contains(&true) && reruns.contains(&false));
        // A copy's work counts in the liveness bound (where its key is the busiest one).
        let raised = copies().map(|(p, _)| {
            let mut without = p.clone();
            without.faults.retain(|f| !f.copies());
            p.liveness_bound_ms().cmp(&without.liveness_bound_ms())
        });
        assert!(raised.clone().all(|o| o.is_ge()) && raised.clone().any(|o| o.is_gt()));
    }

    /// Issue 37: a restore snapshots the Mutex early and restores it later, half of the time
    /// with the controller down; each has a probe run on its key, in a group of its own
    /// (supersede none), created once the restore is done.
    #[test]
    fn restores_snapshot_early_and_probe_the_key_afterwards() {
        let plans: Vec<_> = (0..60).map(|s| draw(s, &knobs())).collect();
        let mut down = BTreeSet::new();
        for p in &plans {
            let restores: Vec<_> = p
                .faults
                .iter()
                .filter(|f| f.kind == FaultKind::MutexRestore)
                .collect();
            assert_eq!(restores.len(), p.probes.len());
            for (i, f) in restores.iter().enumerate() {
                assert!(f.snapshot_ms() < f.at_ms && f.snapshot_ms() >= 1_000);
                assert_eq!(f.run, i);
                let probe = &p.probes[i];
                let group = &p.groups[probe.group];
                assert_eq!((group.key, group.supersede), (f.key, Supersede::None));
                assert!(p.runs.iter().all(|r| r.group != probe.group));
                assert!(probe.wait && probe.shape == Shape::Plain);
                down.insert(f.for_ms > 0);
            }
        }
        assert_eq!(down.len(), 2, "restores with the controller up and down");
    }

    /// hack/chaos.sh --ci's seeds (CI_SEEDS, CI_RUNS, and CI_TENANTS_SEED for the tenants'
    /// round) draw every kind of fault between them: a CI run meets each of them at least once.
    #[test]
    fn the_ci_seeds_draw_every_kind() {
        let script =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/chaos.sh")).unwrap();
        let default = |var: &str| {
            let line = script
                .lines()
                .find(|l| l.starts_with(&format!("{var}=")))
                .unwrap_or_else(|| panic!("{var} in hack/chaos.sh"));
            let (_, rest) = line.split_once(":-").unwrap();
            rest.trim_end_matches('}').to_string()
        };
        let runs = default("CI_RUNS");
        let (min, max) = runs.split_once('-').unwrap();
        let knobs = Knobs {
            min_runs: min.parse().unwrap(),
            max_runs: max.parse().unwrap(),
            ..knobs()
        };
        let mut drawn: BTreeSet<FaultKind> = default("CI_SEEDS")
            .split(',')
            .flat_map(|s| draw(s.parse().unwrap(), &knobs).faults)
            .map(|f| f.kind)
            .collect();
        // The tenants' round has a CI step of its own (CI_TENANTS_SEED, that kind alone).
        let tenants = Knobs {
            faults: [FaultKind::ClusterTenants].into(),
            ..knobs.clone()
        };
        let seed = default("CI_TENANTS_SEED").parse().unwrap();
        drawn.extend(draw(seed, &tenants).faults.iter().map(|f| f.kind));
        let missing: Vec<_> = ALL_FAULTS.iter().filter(|k| !drawn.contains(k)).collect();
        assert!(missing.is_empty(), "the CI seeds never draw {missing:?}");
    }

    /// Prints the kinds a few seeds draw (for picking CI seeds): `cargo test --test chaos
    /// kinds_of_seeds -- --ignored --nocapture` with CHAOS_SEEDS and CHAOS_RUNS.
    #[test]
    #[ignore = "a tool, not a test"]
    fn kinds_of_seeds() {
        let seeds = std::env::var("CHAOS_SEEDS").unwrap_or("101,202,303".into());
        let runs = std::env::var("CHAOS_RUNS").unwrap_or("20-24".into());
        let (min, max) = runs.split_once('-').unwrap();
        let knobs = Knobs {
            min_runs: min.parse().unwrap(),
            max_runs: max.parse().unwrap(),
            ..knobs()
        };
        for seed in seeds.split(',') {
            let p = draw(seed.parse().unwrap(), &knobs);
            let kinds: Vec<_> = p.faults.iter().map(|f| f.kind.name()).collect();
            println!("{seed}: {} runs, {kinds:?}", p.runs.len());
        }
    }

    #[test]
    fn fault_lists_parse() {
        let f = parse_faults("controller,etcd-restart").unwrap();
        assert!(f.contains(&FaultKind::ControllerPause) && f.contains(&FaultKind::EtcdRestart));
        assert!(!f.contains(&FaultKind::ApiserverRestart));
        assert_eq!(parse_faults("all").unwrap().len(), ALL_FAULTS.len());
        let mutex = parse_faults("mutex").unwrap();
        assert!(mutex.contains(&FaultKind::MutexRestore));
        let users = parse_faults("users").unwrap();
        for k in [
            FaultKind::RerunCopy,
            FaultKind::RequeuedCopy,
            FaultKind::MatrixKeys,
            FaultKind::OppositeOrders,
        ] {
            assert!(users.contains(&k));
            assert_eq!(parse_faults(k.name()).unwrap(), BTreeSet::from([k]));
        }
        let selector = parse_faults("selector").unwrap();
        assert_eq!(selector, BTreeSet::from([FaultKind::SelectorEdit]));
        assert!(users.contains(&FaultKind::AuthorStart));
        assert!(parse_faults("none").unwrap().is_empty());
        assert!(
            parse_faults("kubelet")
                .unwrap_err()
                .contains("unknown fault")
        );
    }
}
