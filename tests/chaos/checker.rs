//! The checker: pure functions over what was observed independently of the controller.
//!
//! Evidence: each deploy step's own start and end marks (its token, key, group, sequence and
//! the step's clock), the removal of its pod as a fallback end, the final state of every
//! PipelineRun and lock run, and what the campaign itself did (user actions). Nothing is read
//! from the controller's log or the Mutex status.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use tekton_mutex::promise::{Rule, Section, replay};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    Exclusion,
    Fencing,
    StaleDeploy,
    Liveness,
    Reasons,
    /// A copy started unguarded (a Dashboard "Rerun" of a queued PipelineRun) was granted.
    Copy,
    /// An author started its own PipelineRun while it waited for its grant (the cluster
    /// install's admission policy lets no one but the controller do that).
    GrantOnly,
    /// A selected PipelineRun that no lock took (it runs unlocked) was granted.
    Unlocked,
    /// A ClusterMutex's tenant was passed by more runs of another tenant, created after its
    /// own, than the fair-share rule lets through (tests/chaos/tenants.rs).
    FairShare,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::Exclusion => "exclusion",
            Invariant::Fencing => "fencing",
            Invariant::StaleDeploy => "no-stale-deploy",
            Invariant::Liveness => "liveness",
            Invariant::Reasons => "reasons",
            Invariant::Copy => "unguarded-copy",
            Invariant::GrantOnly => "only-a-grant-starts",
            Invariant::Unlocked => "unlocked-run",
            Invariant::FairShare => "fair-share",
        })
    }
}

#[derive(Clone, Debug)]
pub struct Violation {
    pub invariant: Invariant,
    pub key: String,
    /// When it happened (ms since the round started), for the timeline excerpt.
    pub at_ms: u64,
    pub detail: String,
}

/// How a deploy's end is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndSeen {
    /// The step's own end mark (after its work, or after SIGTERM and its extra work).
    Mark,
    /// No end mark, but its pod object went away (the stand-in kubelet removes it only once
    /// its processes have ended).
    PodGone,
    /// Neither: counted as alive until the round's end.
    Unknown,
}

/// One deploy step, from its marks. Times are ms since the round started.
#[derive(Clone, Debug)]
pub struct Deploy {
    pub pr: String,
    pub key: String,
    pub group: String,
    pub token: i64,
    pub start_ms: u64,
    pub end_ms: u64,
    pub end_seen: EndSeen,
}

/// What "newer" means for supersede: a sequence beats none, then the higher sequence, then the
/// later creation second, then the name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Age {
    pub has_sequence: bool,
    pub sequence: i64,
    pub created_s: i64,
    pub name: String,
}

/// One PipelineRun of the round and how it ended.
#[derive(Clone, Debug, Default)]
pub struct RunFacts {
    pub name: String,
    pub key: String,
    pub group: String,
    pub supersede_on: bool,
    /// `supersede: running`: a holder is cancelled (lock run stays Acquired) by a newer run.
    pub supersede_running: bool,
    pub cancel_mode: String,
    /// Some run of its group is newer.
    pub newer_in_group: bool,
    pub age: Option<Age>,
    pub has_pipeline_timeout: bool,
    /// What the campaign did to it.
    pub user_cancelled: bool,
    pub lock_run_deleted: bool,
    /// A user patched its lock run's key: InvalidParams is then the documented answer.
    pub repointed: bool,
    /// The PipelineRun at the end (None: it is gone).
    pub done: Option<bool>,
    pub reason: Option<String>,
    pub spec_status: Option<String>,
    /// Its `tekton-mutex.dev/superseded-by` annotation.
    pub superseded_by: Option<String>,
    /// Its lock run at the end, if one was seen: condition status, reason, message.
    pub lock_seen: bool,
    pub lock_status: Option<String>,
    pub lock_reason: Option<String>,
    pub lock_message: Option<String>,
    /// It takes keys in separate lock runs (a matrix, opposite orders): `Deadlock` may end it.
    pub cross: bool,
    /// A copy of a run queued as a whole, created not Pending: it runs unguarded (the lock
    /// tells it so), its deploys are no sections, and it must never be granted.
    pub unguarded_copy: bool,
    /// For a copy: the `tekton-mutex.dev/token` annotation it was created with.
    pub copied_token: Option<String>,
    /// Its `tekton-mutex.dev/token` annotation at the end.
    pub token: Option<String>,
    /// When it ended (seconds), if it did.
    pub completion_s: Option<i64>,
    /// Queued as a whole (created Pending with the lock's annotations), copies included; or
    /// selected, and stamped with the key by the controller.
    pub queued: bool,
    /// Its author cleared its `spec.status` while it waited, and the API server let that
    /// through: the run started without its grant.
    pub author_started: bool,
    /// Selected (created as a Trigger creates it), but no lock took it: it carries no
    /// `tekton-mutex.dev/key` (the selector had stopped taking it, and it was let go or never
    /// made Pending). Its deploys are no sections, and it must never be granted.
    pub unlocked: bool,
    /// An admission policy refused the controller's writes to it for a while (issue 49): a
    /// grant it could not be told is taken back, and the run is told so (cancelled) once it can
    /// be.
    pub refused_writes: bool,
}

impl RunFacts {
    pub fn superseded(&self) -> bool {
        is_superseded(self.lock_reason.as_deref(), self.lock_message.as_deref())
    }
}

/// Superseded, in today's form (`Failed(Superseded)`) or issue 11's
/// (`Failed(CustomRunCancelled)` with a message starting `Superseded:`).
pub fn is_superseded(reason: Option<&str>, message: Option<&str>) -> bool {
    match reason {
        Some("Superseded") => true,
        // A PipelineRun queued as a whole records `Cancelled` (its own cancel reason).
        Some("CustomRunCancelled" | "RunCancelled" | "Cancelled") => {
            message.is_some_and(|m| m.starts_with("Superseded:"))
        }
        _ => false,
    }
}

/// Lock-run reasons of the README's table (InvalidParams is documented but right here only for a
/// run a user re-pointed: the campaign otherwise passes valid params).
/// A queued PipelineRun's record says `Cancelled` and `QueueTimeout` where a lock run says
/// `CustomRunCancelled` and `CustomRunTimedOut`.
pub const LOCK_REASONS: [&str; 7] = [
    "Acquired",
    "NotAcquired",
    "Superseded",
    "CustomRunCancelled",
    "CustomRunTimedOut",
    "Cancelled",
    "QueueTimeout",
];

pub struct Round<'a> {
    pub capacity: &'a BTreeMap<String, usize>,
    pub deploys: &'a [Deploy],
    pub runs: &'a [RunFacts],
    /// Runs still not done at the liveness bound.
    pub stuck: &'a [String],
    /// When a user wiped a Mutex's status (key, ms since the round started).
    pub wipes: &'a [(String, u64)],
    /// The round's etcd restores.
    pub restores: &'a [EtcdRestore],
}

/// An etcd snapshot and its restore (ms since the round started): from `begin` (the API server
/// stopped) to `end` (it serves again), the cluster is back as it was at `snapshot`, runs and
/// locks together.
#[derive(Clone, Copy, Debug)]
pub struct EtcdRestore {
    pub snapshot: u64,
    pub begin: u64,
    pub end: u64,
}

impl EtcdRestore {
    /// A deploy that started after the snapshot and before the restore was done: granted by a
    /// lock the restore took back to before the grant (or told its token when the API server
    /// was away). The lock cannot know it any more: what it still does after the restore began
    /// is fenced (every token handed out afterwards is higher), not excluded.
    fn forgot(&self, d: &Deploy) -> bool {
        (self.snapshot..self.end).contains(&d.start_ms)
    }
}

/// A run queued as a whole that may have been granted before a wipe of its key and whose deploy
/// starts this long after it (its pod starting) may still have held the key at the wipe.
pub const WIPE_GRACE_MS: u64 = 10_000;

/// Whether deploy `d`, of a run queued as a whole, may have been holding its key when a user
/// wiped the key's status: README Limits, such a hold is lost (the status is its one record its
/// author cannot write), so its section is not the key's any more.
pub fn lost_to_a_wipe(d: &Deploy, queued: bool, wipes: &[(String, u64)]) -> bool {
    queued
        && wipes
            .iter()
            .any(|(k, t)| *k == d.key && d.start_ms <= t + WIPE_GRACE_MS && d.end_ms >= *t)
}

pub fn check(round: &Round) -> Vec<Violation> {
    let mut out = Vec::new();
    let unguarded: BTreeSet<&str> = round
        .runs
        .iter()
        .filter(|r| r.unguarded_copy || r.unlocked)
        .map(|r| r.name.as_str())
        .collect();
    let queued: BTreeSet<&str> = round
        .runs
        .iter()
        .filter(|r| r.queued)
        .map(|r| r.name.as_str())
        .collect();
    for (key, &capacity) in round.capacity {
        let guarded: Vec<&Deploy> = round
            .deploys
            .iter()
            .filter(|d| &d.key == key && !unguarded.contains(d.pr.as_str()))
            .collect();
        let (lost, held): (Vec<&Deploy>, Vec<&Deploy>) = guarded
            .iter()
            .partition(|d| lost_to_a_wipe(d, queued.contains(d.pr.as_str()), round.wipes));
        match round.restores {
            [] => out.extend(promise(key, capacity, &held, round.runs)),
            restores => {
                out.extend(across_restores(key, capacity, &held, round.runs, restores));
                out.extend(restored_tokens(key, &guarded, restores));
            }
        }
        out.extend(lost_tokens(key, &lost, &guarded));
        if capacity > 1 {
            out.extend(token_order(key, &guarded, round.runs));
        }
    }
    out.extend(liveness(round.runs, round.stuck));
    out.extend(reasons(round.runs));
    out.extend(copies(round.runs));
    out.extend(unlocked(round.runs));
    out.extend(author_starts(round.runs));
    out
}

/// A selected run that no lock took is never granted: it has no token annotation.
pub fn unlocked(runs: &[RunFacts]) -> Vec<Violation> {
    runs.iter()
        .filter(|r| r.unlocked && r.token.is_some())
        .map(|r| Violation {
            invariant: Invariant::Unlocked,
            key: r.key.clone(),
            at_ms: u64::MAX,
            detail: format!(
                "{}, selected but taken by no lock (no key annotation), shows token {:?}",
                r.name, r.token
            ),
        })
        .collect()
}

/// Only a grant starts a waiting PipelineRun: its author's start was let through.
pub fn author_starts(runs: &[RunFacts]) -> Vec<Violation> {
    runs.iter()
        .filter(|r| r.author_started)
        .map(|r| Violation {
            invariant: Invariant::GrantOnly,
            key: r.key.clone(),
            at_ms: u64::MAX,
            detail: format!(
                "{}: its author cleared its spec.status while it waited for {}, and the API \
                 server let it through (lock record {:?})",
                r.name, r.key, r.lock_reason
            ),
        })
        .collect()
}

/// Tokens handed out after a run ended are above its token, whatever the capacity (capacity 1
/// is the promise's fencing rule already): a deploy of a PipelineRun created after another's
/// ended (to the second, both known) must carry a higher token. A Mutex deleted and restored
/// from an old copy with its status must not hand out tokens again.
pub fn token_order(key: &str, deploys: &[&Deploy], runs: &[RunFacts]) -> Vec<Violation> {
    let facts: BTreeMap<&str, &RunFacts> = runs.iter().map(|r| (r.name.as_str(), r)).collect();
    let created = |d: &Deploy| {
        facts
            .get(d.pr.as_str())
            .and_then(|r| Some(r.age.as_ref()?.created_s))
    };
    let ended = |d: &Deploy| facts.get(d.pr.as_str()).and_then(|r| r.completion_s);
    let mut out = Vec::new();
    for later in deploys.iter().filter(|d| d.token > 0) {
        let Some(born) = created(later) else { continue };
        let above = deploys
            .iter()
            .filter(|d| d.pr != later.pr && d.token >= later.token);
        if let Some(earlier) = above.clone().find(|d| ended(d).is_some_and(|e| e < born)) {
            out.push(Violation {
                invariant: Invariant::Fencing,
                key: key.into(),
                at_ms: later.start_ms,
                detail: format!(
                    "{}: token {} although {} had token {} and ended before {} was created",
                    later.pr, later.token, earlier.pr, earlier.token, later.pr
                ),
            });
        }
    }
    out
}

/// A hold lost to a wipe is no section, but its token was handed out: no other PipelineRun may
/// get it again (the Guarantees' fencing, which a wipe does not lift).
pub fn lost_tokens(key: &str, lost: &[&Deploy], all: &[&Deploy]) -> Vec<Violation> {
    let mut out = Vec::new();
    for l in lost {
        let twin = all.iter().find(|d| d.pr != l.pr && d.token == l.token);
        if let Some(d) = twin {
            out.push(Violation {
                invariant: Invariant::Fencing,
                key: key.into(),
                at_ms: d.start_ms.max(l.start_ms),
                detail: format!(
                    "{}: token {} also {}'s, whose hold a wipe of {key} lost (README Limits) \
                     but whose token was handed out",
                    d.pr, d.token, l.pr
                ),
            });
        }
    }
    out
}

/// A copy started unguarded is never granted: its token annotation stays the one it was
/// created with (none, or its original's).
pub fn copies(runs: &[RunFacts]) -> Vec<Violation> {
    runs.iter()
        .filter(|r| r.unguarded_copy && r.token.is_some() && r.token != r.copied_token)
        .map(|r| Violation {
            invariant: Invariant::Copy,
            key: r.key.clone(),
            at_ms: u64::MAX,
            detail: format!(
                "{}, a copy started unguarded, shows token {:?} (created with {:?})",
                r.name, r.token, r.copied_token
            ),
        })
        .collect()
}

/// Exclusion, fencing and no stale deploy: the key's deploys, as sections, replayed through the
/// lock's promise as the model checker states it (`tekton_mutex::promise`). Supersede counts
/// only where it is on for the run and its age is known.
pub fn promise(
    key: &str,
    capacity: usize,
    deploys: &[&Deploy],
    runs: &[RunFacts],
) -> Vec<Violation> {
    let facts: BTreeMap<&str, &RunFacts> = runs.iter().map(|r| (r.name.as_str(), r)).collect();
    let sections: Vec<Section<Age>> = deploys
        .iter()
        .map(|d| Section {
            pipeline_run: d.pr.clone(),
            key: d.key.clone(),
            token: d.token,
            start: d.start_ms,
            end: d.end_ms,
            supersede: facts
                .get(d.pr.as_str())
                .filter(|r| r.supersede_on)
                .and_then(|r| Some((d.group.clone(), r.age.clone()?))),
        })
        .collect();
    let refs: Vec<&Section<Age>> = sections.iter().collect();
    replay(key, capacity, &refs)
        .into_iter()
        .map(|b| Violation {
            invariant: match b.rule {
                Rule::Exclusion => Invariant::Exclusion,
                Rule::Fencing => Invariant::Fencing,
                Rule::Supersede => Invariant::StaleDeploy,
            },
            key: b.key,
            at_ms: b.at,
            detail: b.detail,
        })
        .collect()
}

/// The promise over a round with etcd restores. Exclusion holds over the whole round, each
/// deploy the restore made the lock forget cut where the restore began ([`EtcdRestore::forgot`]);
/// fencing and supersede, which are rules of grant order, hold between the restores (a restore
/// takes the lock's record of grants back: it may grant an older run again); across a restore,
/// [`restored_tokens`].
fn across_restores(
    key: &str,
    capacity: usize,
    deploys: &[&Deploy],
    runs: &[RunFacts],
    restores: &[EtcdRestore],
) -> Vec<Violation> {
    // A section cut to nothing (it began once the restore had begun) is none: an end and a
    // start at one instant would otherwise leave it alive to the end of the round.
    let cut: Vec<Deploy> = deploys
        .iter()
        .filter_map(|d| {
            let mut d = (*d).clone();
            if let Some(r) = restores.iter().find(|r| r.forgot(&d)) {
                d.end_ms = d.end_ms.min(r.begin.max(d.start_ms));
                if d.end_ms <= d.start_ms {
                    return None;
                }
            }
            Some(d)
        })
        .collect();
    let all: Vec<&Deploy> = cut.iter().collect();
    let mut out: Vec<Violation> = promise(key, capacity, &all, runs)
        .into_iter()
        .filter(|v| v.invariant == Invariant::Exclusion)
        .collect();
    let mut bounds: Vec<u64> = restores.iter().map(|r| r.end).collect();
    bounds.sort_unstable();
    let epoch = |d: &Deploy| bounds.iter().filter(|b| d.start_ms >= **b).count();
    for e in 0..=bounds.len() {
        let within: Vec<&Deploy> = cut.iter().filter(|d| epoch(d) == e).collect();
        let rules = promise(key, capacity, &within, runs).into_iter();
        out.extend(rules.filter(|v| v.invariant != Invariant::Exclusion));
    }
    out
}

/// Fencing across an etcd restore: every token handed out after it is above every token seen
/// before it (the restore takes the lock's `lastToken` back; only the clock, which tokens follow,
/// still knows the later ones). A deploy after the restore with a PipelineRun's token seen before
/// it is that grant again (the restore brought it back), not a token handed out again.
pub fn restored_tokens(key: &str, deploys: &[&Deploy], restores: &[EtcdRestore]) -> Vec<Violation> {
    let mut out = Vec::new();
    for r in restores {
        let before: Vec<&&Deploy> = deploys.iter().filter(|d| d.start_ms < r.end).collect();
        let Some(top) = before.iter().max_by_key(|d| d.token) else {
            continue;
        };
        let again = |d: &Deploy| before.iter().any(|b| b.pr == d.pr && b.token == d.token);
        let after = deploys.iter().filter(|d| d.start_ms >= r.end && !again(d));
        for d in after.filter(|d| d.token <= top.token) {
            out.push(Violation {
                invariant: Invariant::Fencing,
                key: key.into(),
                at_ms: d.start_ms,
                detail: format!(
                    "{}: token {} after the etcd restore at +{} ms, not above {}'s {} from before it",
                    d.pr, d.token, r.begin, top.pr, top.token
                ),
            });
        }
    }
    out
}

/// Every run ended within the bound; a stuck run waiting behind a holder that ended is named so.
pub fn liveness(runs: &[RunFacts], stuck: &[String]) -> Vec<Violation> {
    let ended: BTreeSet<&str> = runs
        .iter()
        .filter(|r| r.done != Some(false))
        .map(|r| r.name.as_str())
        .collect();
    stuck
        .iter()
        .filter_map(|name| runs.iter().find(|r| &r.name == name))
        .map(|r| {
            let msg = match (&r.lock_message, r.lock_seen) {
                (Some(m), _) => m.clone(),
                (None, true) => "no status".into(),
                (None, false) => "none seen".into(),
            };
            let behind: Vec<&str> = msg
                .split_once("held by ")
                .map(|(_, rest)| rest.split(" (").next().unwrap_or(""))
                .unwrap_or("")
                .split(", ")
                .filter(|h| ended.contains(h))
                .collect();
            let detail = if behind.is_empty() {
                format!(
                    "{} did not end within the bound (lock run: {msg:?})",
                    r.name
                )
            } else {
                format!(
                    "{} waits behind {} which ended (lock run: {msg})",
                    r.name,
                    behind.join(", ")
                )
            };
            let detail = match r.refused_writes {
                true => format!("{detail}; refuse-run-writes refused the controller its writes"),
                false => detail,
            };
            Violation {
                invariant: Invariant::Liveness,
                key: r.key.clone(),
                at_ms: u64::MAX,
                detail,
            }
        })
        .collect()
}

/// Lock runs end with a documented reason; a PipelineRun is cancelled only by a documented
/// cause: a user, a supersede where supersede is on, or a timeout.
pub fn reasons(runs: &[RunFacts]) -> Vec<Violation> {
    let mut out = Vec::new();
    for r in runs.iter().filter(|r| r.done == Some(true)) {
        let mut v = |detail: String| {
            out.push(Violation {
                invariant: Invariant::Reasons,
                key: r.key.clone(),
                at_ms: u64::MAX,
                detail: format!("{}: {detail}", r.name),
            })
        };
        let lock = r.lock_reason.as_deref();
        match lock {
            Some("InvalidParams") if r.repointed => {}
            Some("Deadlock") if r.cross => {}
            // The controller's answer to a start let through, itself a violation (author_starts).
            Some("StartedWithoutGrant") if r.author_started => {}
            Some(x) if x != "Waiting" && !LOCK_REASONS.contains(&x) => {
                v(format!("lock run ended with undocumented reason {x}"))
            }
            _ => {}
        }
        let lock_open = r.lock_status.as_deref().is_none_or(|s| s == "Unknown");
        if r.lock_seen && lock_open && !r.lock_run_deleted {
            v(format!(
                "lock run still {lock:?} although its PipelineRun ended ({:?})",
                r.reason
            ));
        }
        if r.superseded() && !r.supersede_on {
            v("superseded although its group has supersede: none".into());
        }
        let cancelled = r.spec_status.is_some()
            || matches!(
                r.reason.as_deref(),
                Some("Cancelled" | "StoppedRunFinally" | "CancelledRunFinally")
            );
        let superseded_holder = r.supersede_running
            && r.newer_in_group
            && lock == Some("Acquired")
            && r.spec_status.as_deref() == Some(r.cancel_mode.as_str());
        let annotated = r.supersede_on && r.superseded_by.is_some();
        let explained = r.user_cancelled
            || r.refused_writes
            || r.author_started
            || r.lock_run_deleted
            || r.superseded()
            || superseded_holder
            || annotated
            || lock == Some("QueueTimeout")
            || (r.has_pipeline_timeout && r.reason.as_deref() == Some("PipelineRunTimeout"));
        if cancelled && !explained {
            v(format!(
                "cancelled ({:?}, spec.status {:?}) with no documented cause; lock run {:?}",
                r.reason, r.spec_status, r.lock_reason
            ));
        }
        let failed = r.reason.as_deref() == Some("Failed");
        let failure_explained = explained
            || r.repointed
            || (r.cross && lock == Some("Deadlock"))
            || matches!(lock, Some("CustomRunTimedOut"))
            || r.has_pipeline_timeout;
        if failed && !failure_explained {
            v(format!(
                "Failed with no documented cause; lock run {lock:?} {:?}",
                r.lock_message
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deploy(pr: &str, token: i64, start_ms: u64, end_ms: u64) -> Deploy {
        Deploy {
            pr: pr.into(),
            key: "k1".into(),
            group: "g1".into(),
            token,
            start_ms,
            end_ms,
            end_seen: EndSeen::Mark,
        }
    }

    fn run(name: &str, sequence: i64) -> RunFacts {
        RunFacts {
            name: name.into(),
            key: "k1".into(),
            group: "g1".into(),
            supersede_on: true,
            age: Some(Age {
                has_sequence: true,
                sequence,
                created_s: 0,
                name: name.into(),
            }),
            done: Some(true),
            reason: Some("Succeeded".into()),
            lock_seen: true,
            lock_status: Some("True".into()),
            lock_reason: Some("Acquired".into()),
            ..Default::default()
        }
    }

    fn check_one(capacity: usize, deploys: &[Deploy], runs: &[RunFacts]) -> Vec<Violation> {
        let cap = BTreeMap::from([("k1".to_string(), capacity)]);
        check(&Round {
            capacity: &cap,
            deploys,
            runs,
            stuck: &[],
            wipes: &[],
            restores: &[],
        })
    }

    fn invariants(v: &[Violation]) -> Vec<Invariant> {
        v.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_clean_handover_passes() {
        let d = [deploy("a", 1, 0, 1000), deploy("b", 2, 1000, 2000)];
        assert!(check_one(1, &d, &[run("a", 1), run("b", 2)]).is_empty());
    }

    /// The check of the checker: an overlapping timeline (what a build that skipped the
    /// capacity check would produce) is caught, with both deploys named.
    #[test]
    fn overlapping_deploys_break_exclusion() {
        let d = [deploy("a", 1, 0, 1000), deploy("b", 2, 999, 2000)];
        let v = check_one(1, &d, &[run("a", 1), run("b", 2)]);
        assert_eq!(invariants(&v), vec![Invariant::Exclusion]);
        assert!(v[0].detail.contains("a, b") && v[0].at_ms == 999);
    }

    #[test]
    fn capacity_two_allows_two_but_not_three() {
        let two = [deploy("a", 1, 0, 1000), deploy("b", 2, 10, 1000)];
        assert!(check_one(2, &two, &[]).is_empty());
        let three = [
            deploy("a", 1, 0, 1000),
            deploy("b", 2, 10, 1000),
            deploy("c", 3, 20, 30),
        ];
        assert_eq!(
            invariants(&check_one(2, &three, &[])),
            [Invariant::Exclusion]
        );
    }

    #[test]
    fn a_deploy_with_no_known_end_overlaps_everything_after_it() {
        let mut a = deploy("a", 1, 0, 10_000);
        a.end_seen = EndSeen::Unknown;
        let v = check_one(1, &[a, deploy("b", 2, 5000, 6000)], &[]);
        assert_eq!(invariants(&v), [Invariant::Exclusion]);
    }

    #[test]
    fn reused_lowered_or_missing_tokens_break_fencing() {
        let reused = [deploy("a", 1, 0, 10), deploy("b", 1, 20, 30)];
        assert_eq!(
            invariants(&check_one(1, &reused, &[])),
            [Invariant::Fencing]
        );
        let lowered = [deploy("a", 5, 0, 10), deploy("b", 3, 20, 30)];
        assert_eq!(
            invariants(&check_one(1, &lowered, &[])),
            [Invariant::Fencing]
        );
        let none = [deploy("a", 0, 0, 10)];
        assert_eq!(invariants(&check_one(1, &none, &[])), [Invariant::Fencing]);
        // Capacity 2: two holders' deploys may start in either token order.
        let either = [deploy("a", 5, 0, 10), deploy("b", 4, 5, 30)];
        assert!(check_one(2, &either, &[]).is_empty());
    }

    #[test]
    fn an_older_deploy_after_a_newer_one_is_stale_only_with_supersede() {
        let d = [deploy("new", 1, 0, 10), deploy("old", 2, 20, 30)];
        let v = check_one(1, &d, &[run("old", 1), run("new", 2)]);
        assert_eq!(invariants(&v), [Invariant::StaleDeploy]);
        let mut plain = [run("old", 1), run("new", 2)];
        plain.iter_mut().for_each(|r| r.supersede_on = false);
        assert!(check_one(1, &d, &plain).is_empty());
    }

    #[test]
    fn a_stuck_run_behind_an_ended_holder_is_named() {
        let mut waiter = run("b", 2);
        waiter.done = Some(false);
        waiter.lock_message = Some("waiting for k1: held by a (position 1 of 1)".into());
        let runs = [run("a", 1), waiter];
        let cap = BTreeMap::from([("k1".to_string(), 1)]);
        let v = check(&Round {
            capacity: &cap,
            deploys: &[],
            runs: &runs,
            stuck: &["b".into()],
            wipes: &[],
            restores: &[],
        });
        assert_eq!(invariants(&v), [Invariant::Liveness]);
        assert!(v[0].detail.contains("waits behind a which ended"));
    }

    #[test]
    fn undocumented_cancels_and_reasons_are_caught() {
        let mut cancelled = run("a", 1);
        cancelled.reason = Some("Cancelled".into());
        cancelled.spec_status = Some("Cancelled".into());
        assert_eq!(
            invariants(&reasons(&[cancelled.clone()])),
            [Invariant::Reasons]
        );
        cancelled.user_cancelled = true;
        assert!(reasons(&[cancelled.clone()]).is_empty());

        // supersede: running cancels an older holder with its cancel-mode; its lock run stays
        // Acquired.
        let mut holder = cancelled;
        holder.user_cancelled = false;
        holder.supersede_running = true;
        holder.cancel_mode = "Cancelled".into();
        assert_eq!(
            invariants(&reasons(&[holder.clone()])),
            [Invariant::Reasons]
        );
        holder.newer_in_group = true;
        assert!(reasons(&[holder]).is_empty());

        let mut superseded = run("b", 1);
        superseded.reason = Some("Cancelled".into());
        superseded.lock_status = Some("False".into());
        superseded.lock_reason = Some("CustomRunCancelled".into());
        superseded.lock_message = Some("Superseded: newer PipelineRun c (group g1)".into());
        assert!(reasons(&[superseded.clone()]).is_empty());
        superseded.supersede_on = false;
        assert_eq!(invariants(&reasons(&[superseded])), [Invariant::Reasons]);

        let mut odd = run("c", 1);
        odd.lock_reason = Some("Exploded".into());
        assert_eq!(invariants(&reasons(&[odd])), [Invariant::Reasons]);

        let mut left_waiting = run("d", 1);
        left_waiting.reason = Some("Failed".into());
        left_waiting.lock_status = Some("Unknown".into());
        left_waiting.lock_reason = Some("Waiting".into());
        let v = reasons(&[left_waiting]);
        assert!(v.iter().any(|v| v.detail.contains("lock run still")));
    }

    /// Issue 37: the youngest PipelineRun of a cycle across keys fails with reason `Deadlock`:
    /// documented for a run that takes keys in separate lock runs, not for any other.
    #[test]
    fn a_deadlock_victim_is_explained_only_where_keys_are_taken_apart() {
        let mut victim = run("young", 2);
        victim.reason = Some("Failed".into());
        victim.lock_status = Some("False".into());
        victim.lock_reason = Some("Deadlock".into());
        victim.lock_message = Some("Deadlock: young waits for k2 held by old".into());
        victim.cross = true;
        let cap = BTreeMap::from([("k1".to_string(), 1)]);
        let round = |runs: &[RunFacts]| {
            check(&Round {
                capacity: &cap,
                deploys: &[],
                runs,
                stuck: &[],
                wipes: &[],
                restores: &[],
            })
        };
        assert!(round(&[run("old", 1), victim.clone()]).is_empty());
        victim.cross = false;
        let v = round(&[run("old", 1), victim]);
        assert_eq!(invariants(&v), [Invariant::Reasons, Invariant::Reasons]);
    }

    fn copy_of(original: &RunFacts, name: &str, unguarded: bool) -> RunFacts {
        let mut c = original.clone();
        c.name = name.into();
        c.unguarded_copy = unguarded;
        c.copied_token = Some("1".into());
        c.token = Some("1".into());
        c
    }

    /// Issue 37: a copy is its own member. One queued Pending again is a section like any other
    /// (never granted beside its original beyond capacity, never with a repeated token); one
    /// started unguarded deploys with its original's token, is no section, and is never granted.
    #[test]
    fn copies_are_their_own_members() {
        let a = run("a", 1);
        let again = copy_of(&a, "a-again", false);
        let overlap = [deploy("a", 1, 0, 1000), deploy("a-again", 2, 500, 1500)];
        let v = check_one(1, &overlap, &[a.clone(), again.clone()]);
        assert_eq!(invariants(&v), [Invariant::Exclusion]);
        let same_token = [deploy("a", 1, 0, 1000), deploy("a-again", 1, 1000, 1500)];
        let v = check_one(1, &same_token, &[a.clone(), again.clone()]);
        assert_eq!(invariants(&v), [Invariant::Fencing]);
        let after = [deploy("a", 1, 0, 1000), deploy("a-again", 2, 1000, 1500)];
        assert!(check_one(1, &after, &[a.clone(), again]).is_empty());

        let mut rerun = copy_of(&a, "a-rerun", true);
        let unguarded = [deploy("a", 1, 0, 1000), deploy("a-rerun", 1, 500, 1500)];
        assert!(check_one(1, &unguarded, &[a.clone(), rerun.clone()]).is_empty());
        rerun.token = Some("2".into());
        let v = check_one(1, &unguarded, &[a, rerun]);
        assert_eq!(invariants(&v), [Invariant::Copy]);
    }

    /// Issue 37: tokens handed out after a run ended are above its token at any capacity (a
    /// Mutex restored from an old copy with its status must not hand them out again).
    #[test]
    fn a_token_below_an_ended_runs_is_caught_at_capacity_two() {
        let timed = |name: &str, created_s: i64, completion_s: i64| {
            let mut r = run(name, 1);
            r.supersede_on = false;
            r.age.as_mut().unwrap().created_s = created_s;
            r.completion_s = Some(completion_s);
            r
        };
        let runs = [timed("a", 0, 5), timed("b", 0, 6), timed("c", 10, 20)];
        let lower = [
            deploy("a", 4, 0, 1000),
            deploy("b", 5, 0, 1000),
            deploy("c", 3, 12_000, 13_000),
        ];
        let v = check_one(2, &lower, &runs);
        assert_eq!(invariants(&v), [Invariant::Fencing]);
        assert!(v[0].detail.contains("c: token 3"), "{v:?}");
        // Created before the others ended: either order.
        let mut overlapping = runs.clone();
        overlapping[2].age.as_mut().unwrap().created_s = 5;
        assert!(check_one(2, &lower, &overlapping).is_empty());
        let higher = [
            deploy("a", 4, 0, 1000),
            deploy("b", 5, 0, 1000),
            deploy("c", 6, 12_000, 13_000),
        ];
        assert!(check_one(2, &higher, &runs).is_empty());
    }

    /// An etcd restore (snapshot at 1 s, restore from 4 s to 6 s): `b`, granted after the
    /// snapshot, deploys on past the restore beside `c`, granted after it: fenced (3 > 2), not
    /// excluded. `a`'s grant, which the restore brought back, deploys again with its own token;
    /// `b`, granted again, with a new one. A token after the restore not above every one before
    /// it, or two deploys at once that both began after it, are caught.
    #[test]
    fn a_restore_fences_what_the_lock_forgot_and_excludes_the_rest() {
        let cap = BTreeMap::from([("k1".to_string(), 1)]);
        let restores = [EtcdRestore {
            snapshot: 1_000,
            begin: 4_000,
            end: 6_000,
        }];
        let round = |deploys: &[Deploy], runs: &[RunFacts]| {
            check(&Round {
                capacity: &cap,
                deploys,
                runs,
                stuck: &[],
                wipes: &[],
                restores: &restores,
            })
        };
        // Sequences in grant order within each side of the restore (supersede is on).
        let runs = [
            run("a", 1),
            run("b", 5),
            run("c", 3),
            run("d", 4),
            run("e", 6),
        ];
        let mut clean = vec![
            deploy("a", 10, 0, 1_500),
            deploy("b", 20, 2_000, 9_000),
            deploy("a", 10, 6_500, 7_000),
            deploy("c", 30, 7_000, 8_000),
            deploy("b", 40, 8_500, 9_500),
        ];
        assert!(
            round(&clean, &runs).is_empty(),
            "{:?}",
            round(&clean, &runs)
        );
        clean.push(deploy("e", 15, 10_000, 11_000));
        let v = round(&clean, &runs);
        assert!(v.iter().all(|v| v.invariant == Invariant::Fencing), "{v:?}");
        assert!(v.iter().any(|v| v.detail.contains("etcd restore")), "{v:?}");
        clean.pop();
        // One that began while the restore went on (erased with its run) is no section.
        clean.push(deploy("f", 25, 4_500, 5_000));
        assert!(
            round(&clean, &runs).is_empty(),
            "{:?}",
            round(&clean, &runs)
        );
        clean.push(deploy("d", 35, 7_500, 8_200));
        assert_eq!(invariants(&round(&clean, &runs)), [Invariant::Exclusion]);
    }

    /// README Limits: a queued PipelineRun's hold is lost when its lock's status is wiped, so
    /// another run may deploy beside it; not a lock task's, and its token is never handed out
    /// again.
    #[test]
    fn a_queued_hold_lost_to_a_wipe_is_no_section_but_keeps_its_token() {
        let cap = BTreeMap::from([("k1".to_string(), 1)]);
        let wipes = [("k1".to_string(), 1_500)];
        let round = |deploys: &[Deploy], runs: &[RunFacts]| {
            check(&Round {
                capacity: &cap,
                deploys,
                runs,
                stuck: &[],
                wipes: &wipes,
                restores: &[],
            })
        };
        let mut q = run("q", 1);
        q.queued = true;
        q.supersede_on = false;
        let mut b = run("b", 2);
        b.supersede_on = false;
        let beside = [deploy("q", 1, 1_000, 3_000), deploy("b", 2, 2_000, 4_000)];
        assert!(round(&beside, &[q.clone(), b.clone()]).is_empty());
        let again = [deploy("q", 1, 1_000, 3_000), deploy("b", 1, 2_000, 4_000)];
        assert_eq!(
            invariants(&round(&again, &[q.clone(), b.clone()])),
            [Invariant::Fencing]
        );
        let mut lock_task = q.clone();
        lock_task.queued = false;
        assert_eq!(
            invariants(&round(&beside, &[lock_task, b.clone()])),
            [Invariant::Exclusion]
        );
        // Started after the wipe and its grace: granted after it, a section like any other.
        let later = [
            deploy("q", 1, 12_000, 13_000),
            deploy("b", 2, 12_500, 14_000),
        ];
        assert_eq!(invariants(&round(&later, &[q, b])), [Invariant::Exclusion]);
    }

    /// Issue 46: a selected run the lock took (stamped with the key) is a section like any
    /// other; one no lock took (the selector stopped taking it) runs unlocked beside the holder,
    /// is no section, and is never granted.
    #[test]
    fn a_selected_run_is_a_section_only_if_the_lock_took_it() {
        let holder = run("s1", 1);
        let mut later = run("s2", 2);
        (later.queued, later.supersede_on) = (true, false);
        let beside = [deploy("s1", 1, 0, 2_000), deploy("s2", 0, 1_000, 3_000)];
        let mut found = invariants(&check_one(1, &beside, &[holder.clone(), later.clone()]));
        found.sort();
        assert_eq!(found, [Invariant::Exclusion, Invariant::Fencing]);
        later.unlocked = true;
        assert!(check_one(1, &beside, &[holder.clone(), later.clone()]).is_empty());
        later.token = Some("2".into());
        let v = check_one(1, &beside, &[holder, later]);
        assert_eq!(invariants(&v), [Invariant::Unlocked]);
    }

    /// Issue 46: an author's start of its waiting run, let through, is caught by itself; the
    /// controller's answer (cancelled, `StartedWithoutGrant`) is then no undocumented reason,
    /// and a deploy it made beside the holder (no token: it had no grant) breaks exclusion and
    /// fencing.
    #[test]
    fn an_author_start_let_through_is_caught() {
        let mut started = run("q", 2);
        (started.queued, started.supersede_on, started.author_started) = (true, false, true);
        started.reason = Some("Cancelled".into());
        started.spec_status = Some("Cancelled".into());
        started.lock_status = Some("False".into());
        started.lock_reason = Some("StartedWithoutGrant".into());
        let v = check_one(1, &[], &[run("a", 1), started.clone()]);
        assert_eq!(invariants(&v), [Invariant::GrantOnly]);
        let beside = [deploy("a", 1, 0, 2_000), deploy("q", 0, 1_000, 1_500)];
        let v = check_one(1, &beside, &[run("a", 1), started.clone()]);
        let found = invariants(&v);
        for i in [
            Invariant::Exclusion,
            Invariant::Fencing,
            Invariant::GrantOnly,
        ] {
            assert!(found.contains(&i), "{found:?}");
        }
        // Refused (not let through): its cancel by the controller would be unexplained.
        started.author_started = false;
        let v = check_one(1, &[], &[run("a", 1), started]);
        assert!(
            invariants(&v).iter().all(|i| *i == Invariant::Reasons),
            "{v:?}"
        );
    }

    #[test]
    fn both_forms_of_superseded_count() {
        assert!(is_superseded(Some("Superseded"), None));
        assert!(is_superseded(
            Some("CustomRunCancelled"),
            Some("Superseded: newer PipelineRun x")
        ));
        assert!(!is_superseded(
            Some("CustomRunCancelled"),
            Some("left the queue")
        ));
    }
}
