//! The scenarios: each walks the controller through some of its reconcile
//! paths, phase by phase (each phase runs until the system is quiet, so a
//! fault changes when things happen within a phase, never which phase they
//! belong to). Together they reach every write point.
//!
//! Each has one right outcome, so that any run of it can be compared with its
//! fault-free run: runs that could be granted at once arrive in phases of their
//! own (a fault may delay when the controller sees an arrival; it must not be
//! able to change which of two arrivals a free slot goes to).

use super::oracle::Facts;
use super::store::{Kind, ObjKey, stamp};
use super::world::{Action, Lock, LockId, NS, Pr, World};
use crate::controller::apply::writes::{MANAGED_BY, MANAGER};
use crate::controller::reconcile::finalizer::IDLE_SINCE;
use crate::controller::reconcile::token_floor::LEDGER;
use serde_json::json;
use std::collections::BTreeMap;

pub struct Scenario {
    pub name: &'static str,
    pub phases: Vec<Vec<Action>>,
    /// Each lock's capacity, where it is not 1.
    pub capacity: BTreeMap<LockId, u32>,
    /// The last token of a lock before the scenario (what its ledger says).
    pub prior: BTreeMap<LockId, i64>,
}

impl Scenario {
    fn new(name: &'static str, phases: Vec<Vec<Action>>) -> Scenario {
        Scenario {
            name,
            phases,
            capacity: BTreeMap::new(),
            prior: BTreeMap::new(),
        }
    }

    pub fn facts<'a>(&'a self, world: &'a World) -> Facts<'a> {
        Facts {
            world,
            capacity: &self.capacity,
            prior: &self.prior,
        }
    }
}

pub fn all() -> Vec<Scenario> {
    vec![
        first_grant(),
        queue_and_handover(),
        supersede_pending(),
        supersede_running(),
        capacity_two(),
        several_keys(),
        deleted_lock_run(),
        deleted_mutex(),
        idle_mutex_deleted(),
        idle_mutex_stamped(),
        selecting_mutex_labelled(),
        queue_control_release(),
        queue_control_clear(),
        frozen(),
        cluster_mutex(),
        cluster_mutex_deleted(),
    ]
}

fn pr(name: &'static str, key: &'static str) -> Pr {
    Pr::new(name, Lock::Key(key))
}

/// One run creates its Mutex, is granted, finishes; the Mutex goes idle. A run
/// with a bad param beside it is failed by intake.
fn first_grant() -> Scenario {
    let bad = Pr {
        params: &[("supersede", "sometimes")],
        ..pr("bad", "k")
    };
    Scenario::new(
        "first-grant",
        vec![
            vec![Action::Create(pr("a", "k")), Action::Create(bad)],
            vec![Action::Finish("a")],
        ],
    )
}

/// A queue behind a holder: one waiter times out, one is cancelled by a person,
/// the slot goes to the others in turn; the key goes idle, is used again, goes idle again.
fn queue_and_handover() -> Scenario {
    let impatient = Pr {
        timeout: Some("1s"),
        ..pr("t", "k")
    };
    Scenario::new(
        "queue-and-handover",
        vec![
            vec![Action::Create(pr("a", "k"))],
            vec![
                Action::Create(pr("b", "k")),
                Action::Create(pr("c", "k")),
                Action::Create(pr("e", "k")),
                Action::Create(impatient),
            ],
            vec![Action::Cancel("e"), Action::Finish("a")],
            vec![Action::Finish("b")],
            vec![Action::Finish("c")],
            vec![Action::Create(pr("d", "k"))],
            vec![Action::Finish("d")],
        ],
    )
}

fn grouped(name: &'static str, supersede: &'static [(&'static str, &'static str)]) -> Pr {
    Pr {
        group: "deploy",
        params: supersede,
        ..pr(name, "k")
    }
}

/// supersede: pending. A newer waiter of the group supersedes an older waiter
/// (its PipelineRun is cancelled), never the holder.
fn supersede_pending() -> Scenario {
    let p = &[("supersede", "pending")];
    Scenario::new(
        "supersede-pending",
        vec![
            vec![Action::Create(grouped("a", p))],
            vec![Action::Create(grouped("b", p))],
            vec![Action::Create(grouped("c", p))],
            vec![Action::Finish("a")],
            vec![Action::Finish("c")],
        ],
    )
}

/// supersede: running. A newer run cancels the running holder; the slot goes
/// free once the holder's pod has ended.
fn supersede_running() -> Scenario {
    let p = &[("supersede", "running")];
    Scenario::new(
        "supersede-running",
        vec![
            vec![Action::Create(grouped("a", p))],
            vec![Action::Create(grouped("b", p))],
            vec![Action::Finish("b")],
        ],
    )
}

/// A Mutex a person applied with capacity 2: two hold at once.
fn capacity_two() -> Scenario {
    let wide = json!({"spec": {"capacity": 2}});
    let mut s = Scenario::new(
        "capacity-two",
        vec![
            vec![Action::Apply(ObjKey::new(Kind::Mutex, NS, "wide"), wide)],
            vec![Action::Create(pr("a", "wide"))],
            vec![Action::Create(pr("b", "wide"))],
            vec![Action::Create(pr("c", "wide"))],
            vec![Action::Finish("a")],
            vec![Action::Finish("b"), Action::Finish("c")],
        ],
    );
    s.capacity.insert(LockId::mutex("wide"), 2);
    s
}

/// A run of keys a and b: a keeps a slot for it while b is held, gives it back
/// to a run that goes first (higher priority), and the commit grants both keys at once.
fn several_keys() -> Scenario {
    let both = Pr::new("x", Lock::Keys("a,b"));
    let urgent = Pr {
        params: &[("priority", "10")],
        ..pr("z", "a")
    };
    Scenario::new(
        "several-keys",
        vec![
            vec![Action::Create(pr("y", "b"))],
            vec![Action::Create(both)],
            vec![Action::Create(urgent)],
            vec![Action::Finish("y")],
            vec![Action::Finish("z")],
            vec![Action::Finish("x")],
        ],
    )
}

/// The holder's lock run is deleted: its PipelineRun keeps the slot until it
/// ends. A waiter's PipelineRun is deleted, and its run with it; another one is
/// deleted right after Tekton created its run.
fn deleted_lock_run() -> Scenario {
    Scenario::new(
        "deleted-lock-run",
        vec![
            vec![Action::Create(pr("a", "k"))],
            vec![Action::Create(pr("b", "k")), Action::DeleteLockRun("a")],
            vec![Action::Finish("a")],
            vec![Action::Create(pr("c", "k"))],
            vec![Action::DeletePr("c")],
            vec![Action::Create(pr("d", "k")), Action::Abandon("d")],
            vec![Action::Finish("b")],
        ],
    )
}

/// The Mutex is deleted while held: it keeps its holder, keeps the newcomer
/// out, records its last token, goes once empty, and is created again for the
/// newcomer, whose token continues above the ledger's.
fn deleted_mutex() -> Scenario {
    Scenario::new(
        "deleted-mutex",
        vec![
            vec![Action::Create(pr("a", "k"))],
            vec![
                Action::DeleteLock(LockId::mutex("k")),
                Action::Create(pr("b", "k")),
            ],
            vec![Action::Finish("a")],
            vec![Action::Finish("b")],
        ],
    )
}

/// A Mutex the controller created, idle for longer than idleDeleteDays, is
/// deleted; its key comes back and continues above the ledger's token.
fn idle_mutex_deleted() -> Scenario {
    let old = json!({
        "metadata": {"labels": {MANAGED_BY: MANAGER}, "annotations": {IDLE_SINCE: stamp(jiff::SignedDuration::ZERO)}},
        "spec": {}, "status": {"lastToken": 5}});
    let ledger = json!({"data": {"mutex.old": "5"}});
    let mut s = Scenario::new(
        "idle-mutex-deleted",
        vec![
            vec![
                Action::Apply(ObjKey::new(Kind::ConfigMap, NS, LEDGER), ledger),
                Action::Apply(ObjKey::new(Kind::Mutex, NS, "old"), old),
            ],
            vec![Action::Create(pr("a", "old"))],
            vec![Action::Finish("a")],
        ],
    );
    s.prior.insert(LockId::mutex("old"), 5);
    s
}

/// A Mutex the controller created, idle from before idle-since stamps were kept (restored
/// from a backup, say), gets its stamp; its key comes back and continues above its token.
fn idle_mutex_stamped() -> Scenario {
    let old = json!({
        "metadata": {"labels": {MANAGED_BY: MANAGER}},
        "spec": {}, "status": {"lastToken": 3}});
    let mut s = Scenario::new(
        "idle-mutex-stamped",
        vec![
            vec![Action::Apply(ObjKey::new(Kind::Mutex, NS, "old"), old)],
            vec![Action::Create(pr("a", "old"))],
            vec![Action::Finish("a")],
        ],
    );
    s.prior.insert(LockId::mutex("old"), 3);
    s
}

/// A Mutex with a selector written before the admission policy that labels selecting locks
/// (an upgrade): the controller labels it, so that PipelineRun creates see its selector, and it
/// serves its key as any Mutex. (Its selector takes none of the scenario's runs.)
fn selecting_mutex_labelled() -> Scenario {
    let selecting = json!({"spec": {"selector": {"pipelines": ["not-the-scenarios"]}}});
    Scenario::new(
        "selecting-mutex-labelled",
        vec![
            vec![Action::Apply(ObjKey::new(Kind::Mutex, NS, "k"), selecting)],
            vec![Action::Create(pr("a", "k"))],
            vec![Action::Finish("a")],
        ],
    )
}

/// `tkn mutex release --force`: the holder's PipelineRun is cancelled, the
/// slot goes to the waiter, the request is acknowledged and removed.
fn queue_control_release() -> Scenario {
    let release = json!({"action": "release", "pipelineRun": "a", "by": "alice", "force": true, "reason": "stuck"});
    Scenario::new(
        "queue-control-release",
        vec![
            vec![Action::Create(pr("a", "k"))],
            vec![Action::Create(pr("b", "k"))],
            vec![Action::Request(
                LockId::mutex("k"),
                "20250101t000000000-00000001",
                release,
            )],
            vec![Action::Finish("b")],
        ],
    )
}

/// `tkn mutex clear`: every waiter is let go and its PipelineRun cancelled;
/// the holder stays. A run with `wait: "false"` finds the key taken.
fn queue_control_clear() -> Scenario {
    let clear = json!({"action": "clear", "by": "alice", "reason": "bad batch"});
    let no_wait = Pr {
        params: &[("wait", "false")],
        ..pr("n", "k")
    };
    Scenario::new(
        "queue-control-clear",
        vec![
            vec![Action::Create(pr("a", "k"))],
            vec![Action::Create(pr("b", "k")), Action::Create(no_wait)],
            vec![Action::Create(pr("c", "k"))],
            vec![Action::Request(
                LockId::mutex("k"),
                "20250101t000000000-00000002",
                clear,
            )],
            vec![Action::Finish("a")],
        ],
    )
}

/// A frozen key grants nothing new: the holder keeps it, a waiter waits
/// `Frozen` past the holder's end, and is granted once the key thaws.
fn frozen() -> Scenario {
    let k = LockId::mutex("k");
    Scenario::new(
        "frozen",
        vec![
            vec![Action::Create(pr("a", "k"))],
            vec![
                Action::Freeze(k.clone(), true),
                Action::Create(pr("b", "k")),
            ],
            vec![Action::Finish("a")],
            vec![Action::Freeze(k, false)],
            vec![Action::Finish("b")],
        ],
    )
}

/// A ClusterMutex deleted while held: it keeps its holder, keeps the newcomer
/// out, records its last token in the controller's namespace and goes. Nothing
/// creates a ClusterMutex but an administrator, so the newcomer, looked at
/// again by intake, fails (`InvalidParams`: it does not exist). The
/// administrator creates it again, and the next run's token continues above.
fn cluster_mutex_deleted() -> Scenario {
    let shared = || json!({"spec": {"namespaces": ["ns-a", "ns-b"]}});
    let key = ObjKey::new(Kind::ClusterMutex, "", "shared");
    let in_ns = |name, namespace| Pr {
        namespace,
        ..Pr::new(name, Lock::Cluster("shared"))
    };
    Scenario::new(
        "cluster-mutex-deleted",
        vec![
            vec![Action::Apply(key.clone(), shared())],
            vec![Action::Create(in_ns("a", "ns-a"))],
            vec![
                Action::DeleteLock(LockId::cluster("shared")),
                Action::Create(in_ns("b", "ns-b")),
            ],
            vec![Action::Finish("a")],
            vec![
                Action::Apply(key, shared()),
                Action::Create(in_ns("c", "ns-a")),
            ],
            vec![Action::Finish("c")],
        ],
    )
}

/// A ClusterMutex shared by two namespaces: handover across them, and its
/// ledger in kube-system.
fn cluster_mutex() -> Scenario {
    let shared = json!({"spec": {"namespaces": ["ns-a", "ns-b"]}});
    let in_ns = |name, namespace| Pr {
        namespace,
        ..Pr::new(name, Lock::Cluster("shared"))
    };
    Scenario::new(
        "cluster-mutex",
        vec![
            vec![Action::Apply(
                ObjKey::new(Kind::ClusterMutex, "", "shared"),
                shared,
            )],
            vec![Action::Create(in_ns("a", "ns-a"))],
            vec![Action::Create(in_ns("b", "ns-b"))],
            vec![Action::Finish("a")],
            vec![Action::Finish("b")],
        ],
    )
}
