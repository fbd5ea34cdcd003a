//! The one lock engine: the sync of a Mutex or a ClusterMutex, in four steps.
//! Fetch the lock object, its runs and their PipelineRuns; view them as the
//! decision core's facts ([`members`]); decide; apply. Applying writes the lock
//! status (compare-and-swap), cancels superseded PipelineRuns and patches the
//! runs' statuses, in that order: the status is written first so that a crash
//! never leaves a run told something the lock state does not back. What differs
//! between the two kinds is behind [`LockObject`].

use crate::controller::apply::{acknowledge, events, lock_meta, multi_key_commit, writes};
use crate::controller::cache::shared;
use crate::controller::context::{Context, Error, Fault};
use crate::controller::lock_object::LockObject;
use crate::controller::reconcile::members::{self, Member};
use crate::controller::reconcile::{deadlocks, finalizer, idle_deletion, token_floor, windows};
use crate::core::decide;
use crate::core::model::{Decision, Input, MutexFacts, Outcome, Phase, RunView};
use crate::core::observe::pending;
use crate::core::ready;
use crate::core::requests::{Request, Unreadable, requests_from};
use crate::core::run_status;
use crate::core::scope::Scope;
use crate::model::mutex::{MutexStatus, RunKind, RunRef, clock_floor, ledger_reserve};
use jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// A safety net, not the hand-over path: hand-over is driven by watch events.
const RESYNC: Duration = Duration::from_secs(300);
const MAX_ATTEMPTS: usize = 5;

pub async fn reconcile<L: LockObject>(lock: Arc<L>, ctx: Arc<Context>) -> Result<Action, Error> {
    let (scope, name) = (lock.scope(), lock.name_any());
    // A run or PipelineRun missing from a cache that has not had its first
    // list yet proves nothing: the sync would read each from the API, one by one.
    shared::all_listed(&ctx.listed).await;
    // The cached object first; after a conflict, the API server's.
    let mut cached = Some(lock);
    for _ in 0..MAX_ATTEMPTS {
        match sync_lock(&ctx, &scope, &name, cached.take()).await {
            Err(Error::Conflict) => continue,
            other => return other,
        }
    }
    Err(Error::Conflict)
}

async fn sync_lock<L: LockObject>(
    ctx: &Context,
    scope: &Scope,
    name: &str,
    cached: Option<Arc<L>>,
) -> Result<Action, Error> {
    let from_cache = cached.is_some();
    let Some(lock) = read_lock(ctx, scope, name, cached).await? else {
        return Ok(Action::await_change());
    };
    if lock_meta::label_selecting(ctx, &lock).await? {
        return Ok(Action::await_change()); // its change brings it back
    }
    let current = lock.lock_status().cloned().unwrap_or_default();
    let now = Timestamp::now();
    let members = members::gather(ctx, &lock, &current, now).await?;
    let requests = requests_from(lock.annotations());
    let facts = lock_facts(ctx, &lock, now).await?;
    let deadlocked = deadlocks::victims(ctx, &lock, &current).await?;
    let live = |m: &Member| matches!(m.facts.view.phase, Phase::Live { .. });
    let undelivered = ctx
        .undelivered
        .of(members.iter().map(|m| (m.run().uid.as_str(), live(m))));
    let gate = windows::gate(lock.lock_spec(), now);
    let asked = Asked {
        requests: &requests,
        deadlocked: &deadlocked,
        undelivered: &undelivered,
        closed_by_window: windows::closed_by(&gate),
        window_override: windows::overridden_by(&gate),
    };
    let decision = decide_on(&lock, &current, &members, now, facts, asked);
    let unchanged = same_lock_state(&decision.status, &current);
    if from_cache
        && unchanged
        && (facts.deleting || writes_runs(name, &members, &decision, now))
        && !still_current(ctx, &lock).await?
    {
        return Err(Error::Conflict);
    }
    // Only a lock with requests on it, or one that may lose its finalizer, is needed again after the write.
    let asked = (!requests.is_empty()).then(|| lock.clone());
    let idle = !finalizer::in_use(&decision);
    let settles = (idle && (facts.deleting || finalizer::protected(&lock))).then(|| lock.clone());
    // Idle and unchanged: a lock the controller created may have been idle long enough to go.
    let lingers = (idle && unchanged && !facts.deleting).then(|| lock.clone());
    apply(ctx, lock, &current, &decision, &members, facts, now).await?;
    if let Some(asked) = asked {
        acknowledge::acknowledge(ctx, &asked, &current, &decision, &requests).await?;
    }
    if let Some(idle) = settles {
        let gone = Gone {
            decision: &decision,
            members: &members,
            now,
        };
        hand_over(ctx, &idle, gone, facts.deleting).await?;
    }
    if let Some(idle) = lingers {
        idle_deletion::settle(ctx, &idle, now).await?;
    }
    Ok(next_wake(
        &members,
        &decision,
        now,
        windows::changes_in(&gate, now),
    ))
}

/// The last decision of a lock that is going, and the runs it was about.
struct Gone<'a> {
    decision: &'a Decision,
    members: &'a [Member],
    now: Timestamp,
}

/// An idle lock loses its finalizer (its last token recorded first), so it may
/// be deleted with no controller. One marked for deletion then goes; the runs it
/// kept out (told it is being deleted) get a new one where runs may create one (a plain
/// Mutex with defaults, as a run creates it: never the deleted object's spec), whose lock
/// state is rebuilt from the runs and whose tokens continue above the floor. Where none can
/// be created any more (the README's uninstall deletes the CRD), they are told so, for good.
async fn hand_over<L: LockObject>(
    ctx: &Context,
    idle: &L,
    gone: Gone<'_>,
    deleting: bool,
) -> Result<(), Error> {
    if !finalizer::unprotect::<L>(ctx, &idle.scope(), &idle.name_any()).await? || !deleting {
        return Ok(());
    }
    let kept_out: Vec<(RunRef, Outcome)> = gone
        .decision
        .outcomes
        .iter()
        .filter(|(_, o)| *o == Outcome::MutexDeleting)
        .map(|(run, _)| (run.clone(), Outcome::Uninstalling))
        .collect();
    if kept_out.is_empty() || L::recreate_for_waiters(ctx, idle).await {
        return Ok(());
    }
    let name = idle.name_any();
    let tell = Tell {
        ctx,
        key: &name,
        lock_kind: L::kind(&()),
        members: gone.members,
        now: gone.now,
    };
    let mut first_error = None;
    tell.runs(&kept_out.iter().collect::<Vec<_>>(), &mut first_error)
        .await;
    first_error.map_or(Ok(()), Err)
}

/// The lock object to decide on: the cached one if given, else the API
/// server's. Deciding on a cached one is safe where the lock state changes (its
/// write is a compare-and-swap); where only runs would be told, it is checked first.
async fn read_lock<L: LockObject>(
    ctx: &Context,
    scope: &Scope,
    name: &str,
    cached: Option<Arc<L>>,
) -> Result<Option<L>, Error> {
    match cached {
        Some(l) => Ok(Some(L::written(ctx).newest(l).as_ref().clone())),
        None => Ok(L::api(&ctx.client, scope).get_opt(name).await?),
    }
}

/// Is the cached object still the API server's? A decision that tells runs
/// something without changing the lock state must not rest on an old one.
async fn still_current<L: LockObject>(ctx: &Context, lock: &L) -> Result<bool, Error> {
    let api = L::api(&ctx.client, &lock.scope());
    let fresh = api.get_metadata_opt(&lock.name_any()).await?;
    Ok(fresh.is_some_and(|f| f.resource_version() == lock.resource_version()))
}

/// The lock object's own facts: whether it is being deleted, and the token
/// floor left by earlier objects of its name. The floor is read until the
/// object's status says it took it in (`ledgerReadFor` is this object's uid):
/// that write includes it (`lastToken` is never below it), and from then on the
/// API server keeps `lastToken` from going down. A status restored from a backup
/// names an earlier object's uid (or none), so the floor is read again.
async fn lock_facts<L: LockObject>(
    ctx: &Context,
    lock: &L,
    now: Timestamp,
) -> Result<MutexFacts, Error> {
    let uid = lock.uid();
    let read_for = lock.lock_status().and_then(|s| s.ledger_read_for.as_ref());
    let (token_floor, ledger_read) = match (&uid, read_for) {
        (Some(uid), Some(read)) if read == uid => (0, false),
        _ => {
            let floor = token_floor::floor(ctx, &lock.scope(), &lock.name_any()).await;
            let (what, stuck) = (
                "read the token floor from the token ledger",
                "it grants nothing until then",
            );
            let report = |e: &Error| events::ledger_failed(ctx, lock, what, stuck, e);
            match floor.inspect_err(report) {
                Ok(floor) => (floor, true),
                Err(e) => {
                    not_ready_for_the_ledger(ctx, lock, &e, now).await;
                    return Err(e);
                }
            }
        }
    };
    Ok(MutexFacts {
        deleting: lock.meta().deletion_timestamp.is_some(),
        token_floor,
        ledger_read,
        clock_floor: clock_floor(now),
        namespace_share: lock.namespace_share(),
        priority_across_namespaces: lock.priority_across_namespaces(),
    })
}

/// The lock's `Ready` condition set False while its token ledger cannot be read (it grants
/// nothing then), in the lock status write's own compare-and-swap. Best effort: the Event
/// and the retry are the report; a failed write here changes neither.
async fn not_ready_for_the_ledger<L: LockObject>(
    ctx: &Context,
    lock: &L,
    error: &Error,
    now: Timestamp,
) {
    let message = format!("the token ledger cannot be read, so nothing is granted: {error}");
    let readiness = ready::not_ready(events::LEDGER_FAILED, message);
    mark_not_ready(ctx, lock, readiness, now).await;
}

/// The lock's status as it stands, with `Ready` False as `readiness` says, written if that
/// changes it. Best effort: the Event and the retry are the report.
async fn mark_not_ready<L: LockObject>(
    ctx: &Context,
    lock: &L,
    readiness: ready::Readiness,
    now: Timestamp,
) {
    let current = lock.lock_status().cloned().unwrap_or_default();
    let mut next = current.clone();
    ready::stamp(&mut next, readiness, lock.meta().generation, now);
    if ready::condition(&next) == ready::condition(&current) {
        return;
    }
    let mut marked = lock.clone();
    marked.set_lock_status(next);
    if let Err(e) = writes::lock_status(ctx, &marked).await {
        debug!(key = %lock.name_any(), error = %e, "Ready=False not written; the retry tries again");
    }
}

/// What the decision is asked beside the lock and its runs: the queue-control requests on the
/// lock, and the waiters a deadlock across keys lets go.
#[derive(Clone, Copy)]
struct Asked<'a> {
    requests: &'a [Result<Request, Unreadable>],
    deadlocked: &'a BTreeMap<String, String>,
    undelivered: &'a BTreeMap<String, String>,
    /// A scheduled window's closing message, if one keeps the lock from granting.
    closed_by_window: Option<&'a str>,
    /// An operator's override of a window that would keep it from granting, if one is on.
    window_override: Option<&'a str>,
}

fn decide_on<L: LockObject>(
    lock: &L,
    current: &MutexStatus,
    members: &[Member],
    now: Timestamp,
    facts: MutexFacts,
    asked: Asked<'_>,
) -> Decision {
    let name = lock.name_any();
    let views: Vec<RunView> = members.iter().map(|m| m.facts.view.clone()).collect();
    let multi =
        multi_key_commit::keys_of(&name, members.iter().map(|m| (m.run(), m.multi.as_ref())));
    let mut decision = decide::decide(&Input {
        spec: lock.lock_spec(),
        status: current,
        runs: &views,
        now,
        facts,
        requests: asked.requests,
        multi: &multi,
        deadlocked: asked.deadlocked,
        undelivered: asked.undelivered,
        closed_by_window: asked.closed_by_window,
    });
    decision.status.window_override = asked.window_override.map(String::from);
    if facts.ledger_read {
        // lastToken now stands above the ledger's floor, for this very object.
        decision.status.ledger_read_for = lock.uid();
    }
    let covered = ledger_covered(current, facts);
    decision.status.ledger_covers = match ledger_reserve(covered, decision.status.last_token) {
        Some(end) => Some(end),
        None if facts.ledger_read => Some(covered),
        None => current.ledger_covers,
    };
    let readiness = ready::of(&decision.status);
    ready::stamp(&mut decision.status, readiness, lock.meta().generation, now);
    if decision.status.last_token >= crate::model::mutex::MAX_TOKEN
        && !decision.status.queue.is_empty()
    {
        warn!(
            key = name,
            namespace = lock.scope().label(),
            "fencing tokens are exhausted (lastToken is 2^53 - 1, the largest token): nothing more is granted on this key"
        );
    }
    decision
}

/// Does `next` say what `current` says? Naming the object the ledger was read for, and how far
/// it covers the tokens (status writes of its own), changes no one's place on the lock.
fn same_lock_state(next: &MutexStatus, current: &MutexStatus) -> bool {
    let stamped = MutexStatus {
        ledger_read_for: next.ledger_read_for.clone(),
        ledger_covers: next.ledger_covers,
        ..current.clone()
    };
    *next == stamped
}

/// The highest token the ledger is known to hold for this lock object. Every token goes into
/// the ledger before the lock state that hands it out: the lock's status is not the only record
/// that may be lost. It can be wiped or restored from an older copy, and the runs it is rebuilt
/// from may be gone by then (a pruned PipelineRun takes its lock run's token with it; a queued
/// PipelineRun's own annotations are its author's to write, so they are not believed). An idle
/// lock may be deleted at any time. With the token in the ledger first, the floor read after any
/// of these is above every token handed out (chaos seeds 206601710 and 85783656). Tokens are
/// reserved in blocks ([`ledger_reserve`]): `ledgerCovers` says how far, for the object that
/// `ledgerReadFor` names (a status without it was written when every token was recorded).
fn ledger_covered(current: &MutexStatus, facts: MutexFacts) -> i64 {
    match facts.ledger_read {
        true => facts.token_floor,
        false => current.ledger_covers.unwrap_or(current.last_token),
    }
}

/// Write the decision: the lock state first (its compare-and-swap failing ends
/// the sync), then the new holders, then cancels, then the other runs. A failed
/// write of a run or a cancel is reported and does not stop the others; the
/// first such error is returned at the end, so the key is retried with backoff.
async fn apply<L: LockObject>(
    ctx: &Context,
    lock: L,
    current: &MutexStatus,
    decision: &Decision,
    members: &[Member],
    facts: MutexFacts,
    now: Timestamp,
) -> Result<(), Error> {
    let (scope, name) = (lock.scope(), lock.name_any());
    let protected = finalizer::protected(&lock);
    // Protected before anyone is written into it: a delete then only marks it.
    let lock = if finalizer::in_use(decision) && !facts.deleting && !protected {
        lock_meta::protect(ctx, lock).await?
    } else {
        lock
    };
    let covered = ledger_covered(current, facts);
    if let Some(token) = ledger_reserve(covered, decision.status.last_token) {
        let what = format!("reserve tokens up to {token} in the token ledger");
        let stuck = "its lock state is not written until then";
        token_floor::record(ctx, &scope, &name, token)
            .await
            .inspect_err(|e| events::ledger_failed(ctx, &lock, &what, stuck, e))?;
    }
    write_lock_state(ctx, lock, current, decision, now).await?;
    exit_if_asked_after_lock_write(ctx, decision);
    let (grants, others): (Vec<_>, Vec<_>) = decision
        .outcomes
        .iter()
        .partition(|(_, o)| matches!(o, Outcome::Acquired { .. }));
    let mut first_error = None;
    commit_and_revoke::<L>(ctx, &scope, &name, decision, members, now, &mut first_error).await;
    let tell = Tell {
        ctx,
        key: &name,
        lock_kind: L::kind(&()),
        members,
        now,
    };
    // A grant is what a waiting PipelineRun waits for: it is told first.
    tell.runs(&grants, &mut first_error).await;
    // Cancel before marking the run: once its lock task has failed, the PipelineRun
    // may finish before the cancel lands, and tasks running beside the lock would
    // never get the cancel-mode. Both steps are re-derived from state on every sync.
    cancel_superseded(ctx, &scope, &name, decision, &mut first_error).await;
    let control_cancels: Vec<_> = decision
        .control_cancels
        .iter()
        .filter_map(|c| {
            let (ns, pr) = scope.local(&c.pipeline_run)?;
            let local = crate::core::model::ControlCancel {
                pipeline_run: pr.to_string(),
                ..c.clone()
            };
            Some((ns.to_string(), local))
        })
        .collect();
    acknowledge::cancel_all(ctx, &name, &control_cancels, &mut first_error).await;
    tell.runs(&others, &mut first_error).await;
    first_error.map_or(Ok(()), Err)
}

/// Test hook (`fault-injection` builds): exit between recording a supersede
/// and cancelling its PipelineRun.
fn exit_if_asked_after_lock_write(ctx: &Context, decision: &Decision) {
    let supersedes = decision
        .outcomes
        .iter()
        .any(|(_, o)| matches!(o, Outcome::Superseded { .. }));
    if ctx.fault == Some(Fault::ExitAfterLockWrite) && supersedes {
        tracing::error!(
            "fault injection: exiting after recording a supersede, before cancelling or marking"
        );
        std::process::exit(86);
    }
}

/// Cancel the PipelineRuns the decision superseded, each in its own namespace.
async fn cancel_superseded(
    ctx: &Context,
    scope: &Scope,
    name: &str,
    decision: &Decision,
    first_error: &mut Option<Error>,
) {
    for c in &decision.cancels {
        let Some((ns, pr)) = scope.local(&c.pipeline_run) else {
            continue;
        };
        let local = crate::core::model::Cancel {
            pipeline_run: pr.to_string(),
            ..c.clone()
        };
        if let Err(e) = writes::cancel_pipeline_run(ctx, ns, name, &local).await {
            let what = format!("cancel PipelineRun {pr} (superseded on mutex {name})");
            let reference = writes::pipeline_run_reference(ns, pr, &c.pipeline_run_uid);
            events::write_failed(ctx, reference, &what, &e);
            first_error.get_or_insert(e);
        }
    }
}

/// Runs of several keys: tell `Acquired` those every key keeps a slot for, and
/// give back the slots the decision revokes (see [`multi_key_commit`]).
async fn commit_and_revoke<L: LockObject>(
    ctx: &Context,
    scope: &Scope,
    key: &str,
    decision: &Decision,
    members: &[Member],
    now: Timestamp,
    first_error: &mut Option<Error>,
) {
    let candidates: Vec<multi_key_commit::Candidate> = members
        .iter()
        .filter_map(|m| {
            Some(multi_key_commit::Candidate {
                run: m.run(),
                namespace: &m.namespace,
                name: &m.name,
                pipeline_run_uid: m.facts.view.parent.as_ref().map(|p| p.uid.as_str()),
                multi: m.multi.as_ref()?,
                resource_version: m.resource_version.as_deref(),
                status: &m.status,
                waiting_since: m.facts.view.waiting_since,
                release_after: &m.release_after,
            })
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let ledger = &decision.status;
    let committed =
        multi_key_commit::commit_reserved::<L>(ctx, scope, key, ledger, &candidates, now).await;
    let revoked = multi_key_commit::revoke(ctx, &decision.revokes, &candidates).await;
    for e in [committed.err(), revoked.err()].into_iter().flatten() {
        first_error.get_or_insert(e);
    }
}

/// The lock status, with a compare-and-swap on the resourceVersion we read.
async fn write_lock_state<L: LockObject>(
    ctx: &Context,
    mut lock: L,
    current: &MutexStatus,
    decision: &Decision,
    now: Timestamp,
) -> Result<(), Error> {
    if decision.status == *current {
        return Ok(());
    }
    let before = lock.clone();
    lock.set_lock_status(decision.status.clone());
    if let Err(e) = writes::lock_status(ctx, &lock).await {
        if !matches!(e, Error::Conflict) {
            // Too large, refused by a policy, ...: the lock says so where people look.
            events::status_write_failed(ctx, &before, &e);
            let message = format!("the controller cannot write this lock's status: {e}");
            let readiness = ready::not_ready(events::STATUS_WRITE_FAILED, message);
            mark_not_ready(ctx, &before, readiness, now).await;
        }
        return Err(e);
    }
    let (scope, key) = (lock.scope(), lock.name_any());
    events::status_written(ctx, &scope, &key, current, &decision.status, now);
    events::window_changed(ctx, &lock, current, &decision.status);
    for h in decision
        .status
        .holders
        .iter()
        .filter(|h| !current.holders.contains(h))
    {
        info!(
            key,
            namespace = scope.label(),
            token = h.token,
            holder = h.pipeline_run.as_deref().unwrap_or(&h.run.name),
            waited_seconds = h.waited_seconds,
            "granted"
        );
    }
    Ok(())
}

/// What telling the runs needs.
struct Tell<'a> {
    ctx: &'a Context,
    key: &'a str,
    /// The lock's kind, written beside its name into every status it writes.
    lock_kind: std::borrow::Cow<'static, str>,
    members: &'a [Member],
    now: Timestamp,
}

impl Tell<'_> {
    /// Patch each live run whose status does not yet say its outcome. A failed
    /// patch is reported and kept (the first) in `first_error`; the rest go on.
    async fn runs(&self, outcomes: &[&(RunRef, Outcome)], first_error: &mut Option<Error>) {
        for (run, outcome) in outcomes.iter().map(|o| (&o.0, &o.1)) {
            let Some(m) = self.members.iter().find(|m| m.run().uid == run.uid) else {
                continue;
            };
            let told = self.run(m, outcome).await;
            if told.is_ok() && matches!(outcome, Outcome::Acquired { .. }) {
                self.ctx.undelivered.delivered(&run.uid);
            }
            if let Err(e) = told {
                if let (Outcome::Acquired { .. }, Error::Kube(refusal)) = (outcome, &e) {
                    // Taken back by a later sync if no retry can deliver it, or none has for long.
                    self.ctx
                        .undelivered
                        .note(&run.uid, refusal, Timestamp::now());
                }
                let what = format!("update the status of {} on mutex {}", m.name, self.key);
                let reference = events::run_reference(&m.namespace, &m.local_run());
                events::write_failed(self.ctx, reference, &what, &e);
                first_error.get_or_insert(e);
            }
        }
    }

    async fn run(&self, m: &Member, outcome: &Outcome) -> Result<(), Error> {
        let (ctx, key) = (self.ctx, self.key);
        if !matches!(m.facts.view.phase, Phase::Live { .. }) {
            return Ok(());
        }
        let (run, rv) = (m.run(), m.resource_version.as_deref());
        let patch = match &m.multi {
            Some(multi) => {
                multi_key_commit::patch(run.kind, multi, outcome, &m.status, rv, self.now)
            }
            None => run_status::patch(run.kind, key, outcome, &m.status, rv, self.now),
        };
        let Some(mut patch) = patch else {
            return Ok(());
        };
        // The grant (and every other word) is bound to this lock: another never adopts it.
        patch["status"]["extraFields"][run_status::LOCK_KIND_FIELD] =
            serde_json::json!(self.lock_kind.as_ref());
        run_status::record_release_after(&mut patch, &m.status, &m.release_after);
        if run.kind == RunKind::PipelineRun {
            // The record is bound to this PipelineRun: a copy of it (a rerun) is a new member.
            patch["status"]["extraFields"][pending::MEMBER_FIELD] = serde_json::json!(run.uid);
            patch = queued_patch(key, &patch, outcome, m);
        }
        // Our last patch of this version landed; its watch event brings the key back.
        let said = format!("{outcome:?}");
        if ctx.told.pending(&run.uid, rv, &said) {
            return Ok(());
        }
        debug!(key, run = %m.name, ?outcome, "updating run status");
        if !writes::run_status(ctx, run.kind, &m.namespace, &m.name, &patch).await? {
            return Ok(());
        }
        ctx.told.patched(&run.uid, rv, &said);
        let local = m.local_run();
        // Counted once: only the write that recorded it (a swallowed 409 is redone later).
        // A queued PipelineRun is its own PipelineRun: the cancel recorded its Event.
        if let Outcome::Superseded { by, group } = outcome
            && run.kind != RunKind::PipelineRun
        {
            writes::superseded_event(ctx, &m.namespace, key, &local, by, group).await;
        }
        events::run_transition(ctx, &m.namespace, key, &local, outcome, &m.status);
        Ok(())
    }
}

/// A PipelineRun queued as a whole keeps the status a lock run would get in its
/// record annotation, and the outcome acts on it: a grant starts it, an end of
/// its wait cancels it (unless someone already asked it to stop).
fn queued_patch(key: &str, run_patch: &Value, outcome: &Outcome, m: &Member) -> Value {
    // Nobody has asked the PipelineRun itself to stop (a wait ended for the lock's own
    // reasons, say a namespace no longer allowed, still cancels it).
    let running =
        |p: &crate::core::model::Parent| p.state == crate::core::model::ParentState::Running;
    let stoppable = matches!(m.facts.view.phase, Phase::Live { .. })
        && m.facts.view.parent.as_ref().is_some_and(running);
    let mode = (m.facts.view.cancel_mode, stoppable);
    run_status::queued::patch(key, run_patch, outcome, &m.status, mode)
}

/// Would applying the decision write anything besides the lock state: a cancel,
/// or a run whose status does not yet say its outcome?
fn writes_runs(key: &str, members: &[Member], decision: &Decision, now: Timestamp) -> bool {
    let tells = |(run, outcome): &(RunRef, Outcome)| {
        members
            .iter()
            .filter(|m| m.run().uid == run.uid)
            .filter(|m| matches!(m.facts.view.phase, Phase::Live { .. }))
            .any(|m| {
                let rv = m.resource_version.as_deref();
                run_status::patch(run.kind, key, outcome, &m.status, rv, now).is_some()
            })
    };
    !decision.cancels.is_empty() || decision.outcomes.iter().any(tells)
}

/// Wake up for the first waiting timeout, or when a closed window opens (`window_opens`);
/// otherwise wait for events.
fn next_wake(
    members: &[Member],
    decision: &Decision,
    now: Timestamp,
    window_opens: Option<Duration>,
) -> Action {
    let st = &decision.status;
    let waits = |m: &&Member| {
        let uid = &m.run().uid;
        st.queue.iter().any(|w| w.run.uid == *uid)
            || st.reservations.iter().any(|r| r.waiter.run.uid == *uid)
    };
    let deadline = members
        .iter()
        .filter(waits)
        .filter_map(|m| m.facts.deadline)
        .min()
        .map(|t| Duration::try_from(t.duration_since(now)).unwrap_or_default());
    match deadline
        .map(|d| d + Duration::from_millis(20))
        .into_iter()
        .chain(window_opens)
        .min()
    {
        Some(wait) => Action::requeue(wait.min(RESYNC)),
        None => Action::requeue(RESYNC),
    }
}
