//! Per-key reconcile, in four steps: fetch the Mutex, its runs and their
//! PipelineRuns; view them as the decision core's facts ([`crate::core::view`]);
//! decide; apply. Applying writes the Mutex status (compare-and-swap), cancels
//! superseded PipelineRuns and patches the runs' statuses, in that order. The
//! Mutex status is written first so that a crash never leaves a run told
//! something the lock state does not back.

use crate::controller::apply::acknowledge;
use crate::controller::apply::events;
use crate::controller::apply::multi_key_commit;
use crate::controller::apply::writes;
use crate::controller::cache::index::{Indexed, Tag};
use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::controller::context::Fault;
use crate::controller::reconcile::finalizer;
use crate::controller::reconcile::pipeline_runs::{fetch_parent, pods_alive};
use crate::controller::reconcile::release_after_progress;
use crate::core::decide::{self};
use crate::core::model::{Decision, Input, MultiKeyRun, MutexFacts, Outcome, Phase, RunView};
use crate::core::observe::{Observe, ObservedRun};
use crate::core::params::RunConfig;
use crate::core::run_status;
use crate::core::view::{self, FetchedParent, MemberView};
use crate::model::mutex::{Mutex, MutexStatus, RunKind, RunRef};
use crate::model::tekton::RunStatus;
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use chrono::{DateTime, Utc};
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

/// A safety net, not the hand-over path: hand-over is driven by watch events.
const RESYNC: Duration = Duration::from_secs(300);
const MAX_ATTEMPTS: usize = 5;

pub async fn reconcile(mutex: Arc<Mutex>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = mutex.namespace().unwrap_or_default();
    let key = mutex.name_any();
    caches_ready(&ctx).await;
    // The cached Mutex first; after a conflict, the API server's.
    let mut cached = Some(mutex);
    for _ in 0..MAX_ATTEMPTS {
        match sync_key(&ctx, &ns, &key, cached.take()).await {
            Err(Error::Conflict) => continue,
            other => return other,
        }
    }
    Err(Error::Conflict)
}

/// A run or PipelineRun missing from a cache that has not had its first list
/// yet proves nothing: the sync would read each from the API, one by one.
async fn caches_ready(ctx: &Context) {
    crate::controller::cache::shared::all_listed(&ctx.listed).await;
}

/// The Mutex to decide on: the cached one if given, else the API server's.
/// Deciding on a cached one is safe where the lock state changes (its write is
/// a compare-and-swap); where only runs would be told, it is checked first.
async fn read_mutex(
    ctx: &Context,
    ns: &str,
    key: &str,
    cached: Option<Arc<Mutex>>,
) -> Result<Option<Mutex>, Error> {
    match cached {
        Some(m) => Ok(Some(ctx.written.newest(m).as_ref().clone())),
        None => Ok(Api::<Mutex>::namespaced(ctx.client.clone(), ns)
            .get_opt(key)
            .await?),
    }
}

/// Is the cached Mutex still the API server's? A decision that tells runs
/// something without changing the lock state must not rest on an old one.
async fn still_current(ctx: &Context, mutex: &Mutex) -> Result<bool, Error> {
    let api: Api<Mutex> =
        Api::namespaced(ctx.client.clone(), &mutex.namespace().unwrap_or_default());
    let fresh = api.get_metadata_opt(&mutex.name_any()).await?;
    Ok(fresh.is_some_and(|f| f.resource_version() == mutex.resource_version()))
}

async fn sync_key(
    ctx: &Context,
    ns: &str,
    key: &str,
    cached: Option<Arc<Mutex>>,
) -> Result<Action, Error> {
    let from_cache = cached.is_some();
    let Some(mutex) = read_mutex(ctx, ns, key, cached).await? else {
        return Ok(Action::await_change());
    };
    let mut fetched = fetch_runs(ctx, &mutex).await?;
    let current = mutex.status.clone().unwrap_or_default();
    mark_draining_holders(ctx, ns, &current, &mut fetched).await?;
    mark_done_sections(ctx, ns, &mut fetched).await?;
    let now = Utc::now();
    let mut members: Vec<Member> = fetched.iter().map(|f| Member::view(f, now)).collect();
    members.extend(deleted_holders(ctx, ns, &current, &members).await?);
    for m in &mut members {
        if let Some(tokens) = m.multi.as_ref().and_then(|x| x.acquired.as_ref()) {
            m.facts.view.acquired_token = tokens.get(key).copied(); // this key's token
        }
    }
    let views: Vec<RunView> = members.iter().map(|m| m.facts.view.clone()).collect();
    let facts = MutexFacts {
        deleting: mutex.meta().deletion_timestamp.is_some(),
        token_floor: ctx
            .token_floors
            .floor(ns, key, mutex.uid().as_deref(), current.last_token),
    };
    let requests = crate::core::requests::requests_from(mutex.annotations());
    let multi = multi_key_commit::keys_of(key, members.iter().map(|m| (m.run(), m.multi.as_ref())));
    let decision = decide::decide(&Input {
        spec: &mutex.spec,
        status: &current,
        runs: &views,
        now,
        facts,
        requests: &requests,
        multi: &multi,
    });
    if decision.status.last_token == i64::MAX && !decision.status.queue.is_empty() {
        warn!(
            key,
            namespace = ns,
            "fencing tokens are exhausted (lastToken is the largest i64): nothing more is granted on this key"
        );
    }
    let unchanged = decision.status == current;
    if from_cache
        && unchanged
        && (facts.deleting || writes_runs(key, &members, &decision, now))
        && !still_current(ctx, &mutex).await?
    {
        return Err(Error::Conflict);
    }
    let spec = mutex.spec.clone();
    // Only a Mutex with requests on it is needed again after the write.
    let asked = (!requests.is_empty()).then(|| mutex.clone());
    apply(ctx, mutex, &current, &decision, &members, now).await?;
    if let Some(asked) = asked {
        acknowledge::acknowledge(ctx, &asked, &current, &decision, &requests).await?;
    }
    if facts.deleting && !finalizer::in_use(&decision) {
        hand_over_to_new_mutex(ctx, ns, key, &spec, &decision).await?;
    }
    Ok(next_wake(&members, &decision, now))
}

/// A Mutex marked for deletion that is now empty goes; the runs it kept out
/// (told it is being deleted) get a new one, whose lock state is rebuilt
/// from the runs.
async fn hand_over_to_new_mutex(
    ctx: &Context,
    ns: &str,
    key: &str,
    spec: &crate::model::mutex::MutexSpec,
    decision: &Decision,
) -> Result<(), Error> {
    if !finalizer::release(ctx, ns, key).await? {
        return Ok(());
    }
    let kept_out = decision
        .outcomes
        .iter()
        .any(|(_, o)| *o == Outcome::MutexDeleting);
    if !kept_out {
        return Ok(());
    }
    match writes::ensure_mutex(ctx, ns, key, spec).await {
        Ok(writes::Ensured::Created) => {
            info!(
                key,
                namespace = ns,
                "created the Mutex again for the runs that wait for it"
            );
        }
        Ok(writes::Ensured::Existing(_)) => {}
        // Say a namespace being deleted: the next run event tries again.
        Err(e) => warn!(key, namespace = ns, error = %e, "could not create the Mutex again"),
    }
    Ok(())
}

/// A run of this key, as fetched: the object, its config and its PipelineRun.
struct Fetched {
    run: AnyRun,
    config: RunConfig,
    parent: Option<ParentFetched>,
}

/// A PipelineRun as fetched: the object unless it is gone, and whether a pod
/// of it still runs (looked up only once it has ended and holds a slot).
struct ParentFetched {
    name: String,
    uid: String,
    object: Option<Arc<PipelineRun>>,
    pods_alive: bool,
    /// Its `release-after` tasks are done (looked up only for a run told Acquired).
    section_done: bool,
}

impl ParentFetched {
    fn as_view(&self) -> FetchedParent<'_> {
        FetchedParent {
            name: &self.name,
            uid: &self.uid,
            object: self.object.as_deref(),
            pods_alive: self.pods_alive,
            section_done: self.section_done,
        }
    }

    fn ended(&self) -> bool {
        self.object.as_ref().is_none_or(|p| p.is_done())
    }
}

/// A run of either protocol.
enum AnyRun {
    Custom(Arc<CustomRun>),
    Legacy(Arc<Run>),
}

impl AnyRun {
    fn observe(&self) -> ObservedRun<'_> {
        match self {
            AnyRun::Custom(r) => r.observe(),
            AnyRun::Legacy(r) => r.observe(),
        }
    }
}

/// A member run as the core sees it, plus what patching its status needs.
struct Member {
    facts: MemberView,
    resource_version: Option<String>,
    status: RunStatus,
    /// For a run of several keys: its epoch and tokens.
    multi: Option<MultiKeyRun>,
}

impl Member {
    fn view(f: &Fetched, now: DateTime<Utc>) -> Member {
        let o = f.run.observe();
        let parent = f.parent.as_ref().map(ParentFetched::as_view);
        Member {
            facts: view::member_view(&o, &f.config, parent, now),
            resource_version: o.resource_version.clone(),
            multi: multi_key_commit::run_of(&f.config, &o.status),
            status: o.status.clone(),
        }
    }

    fn run(&self) -> &RunRef {
        &self.facts.view.run
    }
}

/// Every live or done run of this key, plus any run the status names that the
/// cache does not show (read from the API: absence in a cache proves nothing).
async fn fetch_runs(ctx: &Context, mutex: &Mutex) -> Result<Vec<Fetched>, Error> {
    let status = mutex.status.clone().unwrap_or_default();
    let named: Vec<&RunRef> = status
        .holders
        .iter()
        .map(|h| &h.run)
        .chain(status.queue.iter().map(|w| &w.run))
        .chain(status.reservations.iter().map(|r| &r.waiter.run))
        .collect();
    let mut runs = Vec::new();
    if let Some(crs) = &ctx.custom_runs {
        let wrap = AnyRun::Custom;
        runs.extend(fetch_kind(ctx, crs, RunKind::CustomRun, wrap, mutex, &named).await?);
    }
    if let Some(legacy) = &ctx.runs {
        let wrap = AnyRun::Legacy;
        runs.extend(fetch_kind(ctx, legacy, RunKind::Run, wrap, mutex, &named).await?);
    }
    Ok(runs)
}

/// The runs of one kind that belong to this key. A new run whose embedded spec
/// disagrees with the Mutex never joins: intake fails it as InvalidParams.
async fn fetch_kind<K>(
    ctx: &Context,
    cache: &Indexed<K>,
    kind: RunKind,
    wrap: fn(Arc<K>) -> AnyRun,
    mutex: &Mutex,
    named: &[&RunRef],
) -> Result<Vec<Fetched>, Error>
where
    K: Observe + Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let (ns, key) = (&mutex.namespace().unwrap_or_default(), &mutex.name_any());
    let known = |uid: &str| named.iter().any(|r| r.uid == uid);
    let mut found = Vec::new();
    let add = async |obj: Arc<K>, found: &mut Vec<Fetched>| -> Result<(), Error> {
        let o = obj.observe();
        if o.namespace == *ns
            && o.is_mutex()
            && !o.deleting
            && let Ok(config) = o.config()
            && config.keys.contains(key)
            && (known(&o.uid) || config.for_key(key).spec_conflict(&mutex.spec).is_none())
        {
            let parent = match &o.parent {
                Some((name, uid)) => Some(ParentFetched {
                    name: name.clone(),
                    uid: uid.clone(),
                    object: fetch_parent(ctx, ns, name, uid).await?,
                    pods_alive: false,
                    section_done: false,
                }),
                None => None,
            };
            let parent_object = parent.as_ref().map(|p| p.object.as_deref());
            if !known(&o.uid)
                && !release_after_progress::enrols(&config, obj.as_ref(), parent_object)
            {
                return Ok(()); // intake fails it as InvalidParams
            }
            found.push(Fetched {
                run: wrap(obj),
                config,
                parent,
            });
        }
        Ok(())
    };
    for obj in cache.get(&Tag::key(ns, key)) {
        add(obj, &mut found).await?;
    }
    let missing: Vec<&RunRef> = named
        .iter()
        .filter(|r| r.kind == kind && !found.iter().any(|f| f.run.observe().uid == r.uid))
        .copied()
        .collect();
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    for r in missing {
        if let Some(obj) = api
            .get_opt(&r.name)
            .await?
            .filter(|o| o.uid().as_deref() == Some(&r.uid))
        {
            add(Arc::new(obj), &mut found).await?;
        }
    }
    Ok(found)
}

/// Write the decision: the lock state first (its compare-and-swap failing ends
/// the sync), then the new holders, then cancels, then the other runs. A failed
/// write of a run or a cancel is reported and does not stop the others; the
/// first such error is returned at the end, so the key is retried with backoff.
async fn apply(
    ctx: &Context,
    mutex: Mutex,
    current: &MutexStatus,
    decision: &Decision,
    members: &[Member],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let (ns, key) = (mutex.namespace().unwrap_or_default(), mutex.name_any());
    // Protected before anyone is written into it: a delete then only marks it.
    let deleting = mutex.meta().deletion_timestamp.is_some();
    let mutex = if finalizer::in_use(decision) && !deleting && !finalizer::protected(&mutex) {
        finalizer::protect(ctx, mutex).await?
    } else {
        mutex
    };
    write_lock_state(ctx, mutex, current, decision, now).await?;
    if ctx.fault == Some(Fault::ExitAfterLockWrite)
        && decision
            .outcomes
            .iter()
            .any(|(_, o)| matches!(o, Outcome::Superseded { .. }))
    {
        tracing::error!(
            "fault injection: exiting after recording a supersede, before cancelling or marking"
        );
        std::process::exit(86);
    }
    let (grants, others): (Vec<_>, Vec<_>) = decision
        .outcomes
        .iter()
        .partition(|(_, o)| matches!(o, Outcome::Acquired { .. }));
    let mut first_error = None;
    commit_and_revoke(ctx, &ns, &key, decision, members, now, &mut first_error).await;
    let tell = Tell {
        ctx,
        ns: &ns,
        key: &key,
        members,
        now,
    };
    // A grant is what a waiting PipelineRun waits for: it is told first.
    tell.runs(&grants, &mut first_error).await;
    // Cancel before marking the run: once its lock task has failed, the PipelineRun
    // may finish before the cancel lands, and tasks running beside the lock would
    // never get the cancel-mode. Both steps are re-derived from state on every sync.
    for c in &decision.cancels {
        if let Err(e) = writes::cancel_pipeline_run(ctx, &ns, &key, c).await {
            let what = format!(
                "cancel PipelineRun {} (superseded on mutex {key})",
                c.pipeline_run
            );
            events::write_failed(
                ctx,
                writes::pipeline_run_reference(&ns, &c.pipeline_run, &c.pipeline_run_uid),
                &what,
                &e,
            );
            first_error.get_or_insert(e);
        }
    }
    acknowledge::cancel_all(ctx, &ns, &key, &decision.control_cancels, &mut first_error).await;
    tell.runs(&others, &mut first_error).await;
    first_error.map_or(Ok(()), Err)
}

/// Runs of several keys: tell `Acquired` those every key keeps a slot for, and
/// give back the slots the decision revokes (see [`multikey`]).
async fn commit_and_revoke(
    ctx: &Context,
    ns: &str,
    key: &str,
    decision: &Decision,
    members: &[Member],
    now: DateTime<Utc>,
    first_error: &mut Option<Error>,
) {
    let candidates: Vec<multi_key_commit::Candidate> = members
        .iter()
        .filter_map(|m| {
            Some(multi_key_commit::Candidate {
                run: m.run(),
                multi: m.multi.as_ref()?,
                resource_version: m.resource_version.as_deref(),
                status: &m.status,
                waiting_since: m.facts.view.waiting_since,
            })
        })
        .collect();
    if candidates.is_empty() {
        return;
    }
    let committed =
        multi_key_commit::commit_reserved(ctx, ns, key, &decision.status, &candidates, now).await;
    let revoked = multi_key_commit::revoke(ctx, ns, &decision.revokes, &candidates).await;
    for e in [committed.err(), revoked.err()].into_iter().flatten() {
        first_error.get_or_insert(e);
    }
}

/// The Mutex status, with a compare-and-swap on the resourceVersion we read.
async fn write_lock_state(
    ctx: &Context,
    mut mutex: Mutex,
    current: &MutexStatus,
    decision: &Decision,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    if decision.status == *current {
        return Ok(());
    }
    mutex.status = Some(decision.status.clone());
    writes::mutex_status(ctx, &mutex).await?;
    let (ns, key) = (mutex.namespace().unwrap_or_default(), mutex.name_any());
    events::status_written(ctx, &ns, &key, current, &decision.status, now);
    for h in decision
        .status
        .holders
        .iter()
        .filter(|h| !current.holders.contains(h))
    {
        info!(
            key,
            namespace = ns,
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
    ns: &'a str,
    key: &'a str,
    members: &'a [Member],
    now: DateTime<Utc>,
}

impl Tell<'_> {
    /// Patch each live run whose status does not yet say its outcome. A failed
    /// patch is reported and kept (the first) in `first_error`; the rest go on.
    async fn runs(&self, outcomes: &[&(RunRef, Outcome)], first_error: &mut Option<Error>) {
        for (run, outcome) in outcomes.iter().map(|o| (&o.0, &o.1)) {
            if let Err(e) = self.run(run, outcome).await {
                let what = format!("update the status of {} on mutex {}", run.name, self.key);
                events::write_failed(self.ctx, events::run_reference(self.ns, run), &what, &e);
                first_error.get_or_insert(e);
            }
        }
    }

    async fn run(&self, run: &RunRef, outcome: &Outcome) -> Result<(), Error> {
        let (ctx, ns, key) = (self.ctx, self.ns, self.key);
        let Some(m) = self.members.iter().find(|m| m.run().uid == run.uid) else {
            return Ok(());
        };
        if !matches!(m.facts.view.phase, Phase::Live { .. }) {
            return Ok(());
        }
        let rv = m.resource_version.as_deref();
        let patch = match &m.multi {
            Some(multi) => {
                multi_key_commit::patch(run.kind, multi, outcome, &m.status, rv, self.now)
            }
            None => run_status::patch(run.kind, key, outcome, &m.status, rv, self.now),
        };
        let Some(patch) = patch else {
            return Ok(());
        };
        // Our last patch of this version landed; its watch event brings the key back.
        if ctx.told.pending(&run.uid, rv) {
            return Ok(());
        }
        debug!(key, run = %run.name, ?outcome, "updating run status");
        if !writes::run_status(ctx, run.kind, ns, &run.name, &patch).await? {
            return Ok(());
        }
        ctx.told.patched(&run.uid, rv);
        // Counted once: only the write that recorded it (a swallowed 409 is redone later).
        if let Outcome::Superseded { by, group } = outcome {
            writes::superseded_event(ctx, ns, key, run, by, group).await;
        }
        events::run_transition(ctx, ns, key, run, outcome, &m.status);
        Ok(())
    }
}

/// Would applying the decision write anything besides the lock state: a cancel,
/// or a run whose status does not yet say its outcome?
fn writes_runs(key: &str, members: &[Member], decision: &Decision, now: DateTime<Utc>) -> bool {
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

/// Wake up for the first waiting timeout; otherwise wait for events.
fn next_wake(members: &[Member], decision: &Decision, now: DateTime<Utc>) -> Action {
    let next = members
        .iter()
        .filter(|m| {
            let st = &decision.status;
            st.queue.iter().any(|w| w.run.uid == m.run().uid)
                || st
                    .reservations
                    .iter()
                    .any(|r| r.waiter.run.uid == m.run().uid)
        })
        .filter_map(|m| m.facts.deadline)
        .min();
    match next {
        Some(t) => {
            Action::requeue((t - now).to_std().unwrap_or_default() + Duration::from_millis(20))
        }
        None => Action::requeue(RESYNC),
    }
}

/// A holder's slot stays taken while a pod of its ended PipelineRun still runs:
/// a cancelled or timed-out step gets SIGTERM and a grace period, and may still
/// be deploying. Asked of the API (not a cache) since a release depends on it.
async fn mark_draining_holders(
    ctx: &Context,
    ns: &str,
    status: &MutexStatus,
    fetched: &mut [Fetched],
) -> Result<(), Error> {
    for f in fetched.iter_mut() {
        let o = f.run.observe();
        let uid = o.uid.clone();
        // A grant the status does not know of (it was wiped or replaced) is
        // rebuilt as a hold: it drains like one.
        let unknown_grant =
            run_status::acquired_token(&o.status).is_some_and(|t| t > status.last_token);
        let holds = unknown_grant || status.holders.iter().any(|h| h.run.uid == uid);
        if let Some(p) = f.parent.as_mut().filter(|p| holds && p.ended()) {
            p.pods_alive = pods_alive(ctx, ns, &p.name, &p.uid).await?;
        }
    }
    Ok(())
}

/// A run told Acquired with `release-after`, whose PipelineRun still runs:
/// is its section over? Then it holds nothing more.
async fn mark_done_sections(ctx: &Context, ns: &str, fetched: &mut [Fetched]) -> Result<(), Error> {
    for f in fetched.iter_mut() {
        let names = &f.config.release_after;
        let told = run_status::acquired_token(&f.run.observe().status).is_some();
        let parent = f.parent.as_mut().filter(|p| told && !p.ended());
        if let Some(p) = parent.filter(|_| !names.is_empty()) {
            let pr = p
                .object
                .clone()
                .expect("a PipelineRun that has not ended is present");
            p.section_done = release_after_progress::done(ctx, ns, &pr, names).await?;
        }
    }
    Ok(())
}

/// Holders whose lock run was deleted while their PipelineRun still runs (or
/// drains). The slot belongs to the PipelineRun, not to the run object.
async fn deleted_holders(
    ctx: &Context,
    ns: &str,
    status: &MutexStatus,
    members: &[Member],
) -> Result<Vec<Member>, Error> {
    let mut ghosts = Vec::new();
    for h in &status.holders {
        if members.iter().any(|m| m.run().uid == h.run.uid) {
            continue;
        }
        // A standalone run, or a record from before uids were kept: released as before.
        let (Some(name), Some(uid)) = (&h.pipeline_run, &h.pipeline_run_uid) else {
            continue;
        };
        let object = fetch_parent(ctx, ns, name, uid).await?;
        let ended = object.as_ref().is_none_or(|p| p.is_done());
        let parent = ParentFetched {
            name: name.clone(),
            uid: uid.clone(),
            pods_alive: ended && pods_alive(ctx, ns, name, uid).await?,
            section_done: false,
            object,
        };
        ghosts.push(Member {
            facts: view::deleted_holder_view(h, parent.as_view()),
            resource_version: None,
            status: RunStatus::default(),
            multi: None,
        });
    }
    Ok(ghosts)
}
