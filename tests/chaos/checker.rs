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
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::Exclusion => "exclusion",
            Invariant::Fencing => "fencing",
            Invariant::StaleDeploy => "no-stale-deploy",
            Invariant::Liveness => "liveness",
            Invariant::Reasons => "reasons",
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
}

pub fn check(round: &Round) -> Vec<Violation> {
    let mut out = Vec::new();
    for (key, &capacity) in round.capacity {
        let deploys: Vec<&Deploy> = round.deploys.iter().filter(|d| &d.key == key).collect();
        out.extend(promise(key, capacity, &deploys, round.runs));
    }
    out.extend(liveness(round.runs, round.stuck));
    out.extend(reasons(round.runs));
    out
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
