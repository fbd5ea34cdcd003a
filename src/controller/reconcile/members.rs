//! The fetch and view steps of a lock's sync: every run of the lock, as cached
//! or (when the status names one the cache lacks) as the API server has it;
//! their PipelineRuns; whether an ended holder's pods still run and whether a
//! `release-after` section is over; and holders whose lock run was deleted. Each
//! becomes a [`Member`]: the decision core's view of it, plus what telling it needs.

use crate::controller::apply::multi_key_commit;
use crate::controller::context::{Context, Error};
use crate::controller::lock_object::{LockObject, NamespaceLabels};
use crate::controller::reconcile::pipeline_runs::{fetch_parent, pods_alive};
use crate::controller::reconcile::release_after_progress;
use crate::controller::reconcile::selection;
use crate::core::model::{MultiKeyRun, Phase};
use crate::core::observe::pending::{self, PendingRun};
use crate::core::observe::{Observe, ObservedRun};
use crate::core::params::RunConfig;
use crate::core::run_status;
use crate::core::scope::Scope;
use crate::core::view::{self, FetchedParent, MemberView};
use crate::model::mutex::{MutexStatus, RunKind, RunRef};
use crate::model::tekton::RunStatus;
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use jiff::Timestamp;
use kube::{Api, ResourceExt};
use std::sync::Arc;

/// A member run as the core sees it, plus what patching its status needs.
pub struct Member {
    /// Where the run lives, and its own name (the view may qualify it).
    pub namespace: String,
    pub name: String,
    pub facts: MemberView,
    pub resource_version: Option<String>,
    pub status: RunStatus,
    /// For a run of several keys: its epoch and tokens.
    pub multi: Option<MultiKeyRun>,
    /// Its `release-after` task names, recorded in its status at the first tell.
    pub release_after: Vec<String>,
}

impl Member {
    /// The run as the lock's status names it.
    pub fn run(&self) -> &RunRef {
        &self.facts.view.run
    }

    /// The run in its own namespace, under its own name.
    pub fn local_run(&self) -> RunRef {
        RunRef {
            name: self.name.clone(),
            ..self.run().clone()
        }
    }
}

/// The members of `lock` now: fetched, marked and viewed.
pub async fn gather<L: LockObject>(
    ctx: &Context,
    lock: &L,
    status: &MutexStatus,
    now: Timestamp,
) -> Result<Vec<Member>, Error> {
    let key = lock.name_any();
    let mut fetched = fetch_runs(ctx, lock, status).await?;
    mark_draining_holders(ctx, status, &key, &mut fetched).await?;
    mark_done_sections(ctx, &mut fetched).await?;
    let sharers = hold_sharers(ctx, lock, &fetched).await?;
    fetched.extend(sharers);
    let mut members: Vec<Member> = fetched.iter().map(|f| view_of(lock, f, now)).collect();
    members.extend(deleted_holders(ctx, &lock.scope(), status, &members).await?);
    let kind = L::kind(&());
    for m in &mut members {
        // A queued PipelineRun's record is its author's: the status says what it holds.
        crate::core::decide::vouch_queued_record(&mut m.facts.view, status);
        if let Some(tokens) = m.multi.as_ref().and_then(|x| x.acquired.as_ref()) {
            m.facts.view.acquired_token = tokens.get(&key).copied(); // this key's token
        } else if run_status::told_by_another_lock(&m.status, &kind, &key) {
            // Re-pointed after its grant: that hold is the other lock's, never this one's.
            m.facts.view.acquired_token = None;
        }
    }
    Ok(members)
}

/// A run of this lock, as fetched: the object, its config and its PipelineRun.
struct Fetched {
    run: AnyRun,
    config: RunConfig,
    parent: Option<ParentFetched>,
    /// A waiter the lock no longer admits, and why: its wait ends.
    revoked: Option<String>,
}

/// A PipelineRun as fetched: the object unless it is gone, and whether a pod
/// of it still runs (looked up only once it has ended and holds a slot).
#[derive(Clone)]
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

/// A run of either protocol, or a PipelineRun queued as a whole.
enum AnyRun {
    Custom(Arc<CustomRun>),
    Legacy(Arc<Run>),
    Queued(Arc<PendingRun>),
}

impl AnyRun {
    fn observe(&self) -> ObservedRun<'_> {
        match self {
            AnyRun::Custom(r) => r.observe(),
            AnyRun::Legacy(r) => r.observe(),
            AnyRun::Queued(r) => r.observe(),
        }
    }

    /// May the sync enrol it, as far as `release-after` goes (a queued
    /// PipelineRun has none)?
    fn enrols(&self, cfg: &RunConfig, parent: Option<Option<&PipelineRun>>) -> bool {
        match self {
            AnyRun::Custom(r) => release_after_progress::enrols(cfg, r.as_ref(), parent),
            AnyRun::Legacy(r) => release_after_progress::enrols(cfg, r.as_ref(), parent),
            AnyRun::Queued(_) => true,
        }
    }

    /// A queued PipelineRun of this lock, unless Tekton started it before the lock saw it.
    fn queued(pr: Arc<PipelineRun>) -> Option<AnyRun> {
        let queued = PendingRun::of(pr)?;
        (!queued.started_unqueued()).then(|| AnyRun::Queued(Arc::new(queued)))
    }
}

/// Every live run of this lock, plus any run the status names that the cache
/// does not show (read from the API: absence in a cache proves nothing).
async fn fetch_runs<L: LockObject>(
    ctx: &Context,
    lock: &L,
    status: &MutexStatus,
) -> Result<Vec<Fetched>, Error> {
    let named: Vec<&RunRef> = status
        .holders
        .iter()
        .map(|h| &h.run)
        .chain(status.queue.iter().map(|w| &w.run))
        .chain(status.reservations.iter().map(|r| &r.waiter.run))
        .collect();
    let tag = lock.runs_tag();
    let mut objects: Vec<AnyRun> = Vec::new();
    if let Some(crs) = &ctx.custom_runs {
        objects.extend(crs.get(&tag).into_iter().map(AnyRun::Custom));
    }
    if let Some(runs) = &ctx.runs {
        objects.extend(runs.get(&tag).into_iter().map(AnyRun::Legacy));
    }
    let queued = ctx.queued_runs.get(&tag, &ctx.pipeline_runs);
    objects.extend(queued.into_iter().filter_map(AnyRun::queued));
    objects.extend(missing(ctx, &lock.scope(), &named, &objects).await?);
    let mut labels = NamespaceLabels::new();
    let objects = without_refused(ctx, objects, &mut labels).await?;
    let waiting: Vec<&str> = status.queue.iter().map(|w| w.run.uid.as_str()).collect();
    let mut found = Vec::new();
    for obj in objects {
        if let Some(mut f) = fetched(ctx, lock, obj, &named, &mut labels).await? {
            f.revoked = revoked(ctx, lock, &f, &waiting, &mut labels).await?;
            found.push(f);
        }
    }
    Ok(found)
}

/// The runs less the queued PipelineRuns that selection refuses: they wait, told why, and no
/// lock grants them.
async fn without_refused(
    ctx: &Context,
    objects: Vec<AnyRun>,
    seen: &mut NamespaceLabels,
) -> Result<Vec<AnyRun>, Error> {
    let mut kept = Vec::with_capacity(objects.len());
    for run in objects {
        if let AnyRun::Queued(q) = &run
            && selection::refuses(ctx, &q.object, seen).await?
        {
            continue;
        }
        kept.push(run);
    }
    Ok(kept)
}

/// Why a waiter may no longer wait here: its namespace left a ClusterMutex's
/// `spec.namespaces` (or selector) while it waited (issue 37 item 12). Holders keep their slot.
async fn revoked<L: LockObject>(
    ctx: &Context,
    lock: &L,
    f: &Fetched,
    waiting: &[&str],
    labels: &mut NamespaceLabels,
) -> Result<Option<String>, Error> {
    let o = f.run.observe();
    if !waiting.contains(&o.uid.as_str()) || lock.admits(ctx, &o.namespace, labels).await? {
        return Ok(None);
    }
    Ok(Some(format!(
        "namespace {} is no longer allowed to use {} {} (its spec.namespaces or namespaceSelector changed)",
        o.namespace,
        L::kind(&()),
        lock.name_any()
    )))
}

/// The run as a member, with its PipelineRun; None if it is not one of this
/// lock's, or may not join it (intake fails it as InvalidParams or Forbidden).
async fn fetched<L: LockObject>(
    ctx: &Context,
    lock: &L,
    obj: AnyRun,
    named: &[&RunRef],
    labels: &mut NamespaceLabels,
) -> Result<Option<Fetched>, Error> {
    let o = obj.observe();
    let Ok(config) = o.config() else {
        return Ok(None);
    };
    let known = named.iter().any(|r| r.uid == o.uid);
    // A waiting run re-pointed at another lock belongs to neither: intake fails it.
    if o.deleting || o.repointed().is_some() || !lock.claims(&o, &config, known) {
        return Ok(None);
    }
    if !known && !lock.admits(ctx, &o.namespace, labels).await? {
        return Ok(None);
    }
    let parent = match &o.parent {
        Some((name, uid)) => Some(ParentFetched {
            name: name.clone(),
            uid: uid.clone(),
            object: fetch_parent(ctx, &o.namespace, name, uid).await?,
            pods_alive: false,
            section_done: false,
        }),
        None => None,
    };
    let parent_object = parent.as_ref().map(|p| p.object.as_deref());
    if !known && !obj.enrols(&config, parent_object) {
        return Ok(None);
    }
    Ok(Some(Fetched {
        run: obj,
        config,
        parent,
        revoked: None,
    }))
}

/// The runs the status names that the caches do not show, read from the API.
async fn missing(
    ctx: &Context,
    scope: &Scope,
    named: &[&RunRef],
    have: &[AnyRun],
) -> Result<Vec<AnyRun>, Error> {
    let mut found = Vec::new();
    for r in named {
        if have.iter().any(|o| o.observe().uid == r.uid) {
            continue;
        }
        let Some((ns, name)) = scope.local(&r.name) else {
            continue;
        };
        let same = |uid: Option<String>| uid.as_deref() == Some(r.uid.as_str());
        match r.kind {
            RunKind::CustomRun => {
                let api: Api<CustomRun> = Api::namespaced(ctx.client.clone(), ns);
                if let Some(o) = api.get_opt(name).await?.filter(|o| same(o.uid())) {
                    found.push(AnyRun::Custom(Arc::new(o)));
                }
            }
            RunKind::Run => {
                let api: Api<Run> = Api::namespaced(ctx.client.clone(), ns);
                if let Some(o) = api.get_opt(name).await?.filter(|o| same(o.uid())) {
                    found.push(AnyRun::Legacy(Arc::new(o)));
                }
            }
            RunKind::PipelineRun => {
                let api: Api<PipelineRun> = Api::namespaced(ctx.client.clone(), ns);
                if let Some(o) = api.get_opt(name).await?.filter(|o| same(o.uid())) {
                    found.extend(AnyRun::queued(Arc::new(o)));
                }
            }
        }
    }
    Ok(found)
}

/// The run as the decision core sees it, named as the lock's status names it.
fn view_of<L: LockObject>(lock: &L, f: &Fetched, now: Timestamp) -> Member {
    let o = f.run.observe();
    let parent = f.parent.as_ref().map(ParentFetched::as_view);
    let mut facts = view::member_view(&o, &f.config, parent, now);
    lock.qualify(&o.namespace, &mut facts.view);
    if let (Some(why), &Phase::Live { timeout, .. }) = (&f.revoked, &facts.view.phase) {
        facts.view.phase = Phase::Live {
            cancel_requested: true,
            timeout,
        };
        facts.view.cancel_message = Some(why.clone());
    }
    Member {
        namespace: o.namespace.clone(),
        name: o.name.clone(),
        facts,
        resource_version: o.resource_version.clone(),
        multi: multi_key_commit::run_of(&f.config, &o.status),
        status: o.status.clone(),
        release_after: f.config.release_after.clone(),
    }
}

/// A holder's slot stays taken while a pod of its ended PipelineRun still runs:
/// a cancelled or timed-out step gets SIGTERM and a grace period, and may still
/// be deploying. Asked of the API (not a cache) since a release depends on it.
async fn mark_draining_holders(
    ctx: &Context,
    status: &MutexStatus,
    key: &str,
    fetched: &mut [Fetched],
) -> Result<(), Error> {
    for f in fetched.iter_mut() {
        let holds = may_hold(f, status, key);
        let o = f.run.observe();
        let ns = o.namespace.clone();
        if let Some(p) = f.parent.as_mut().filter(|p| holds && p.ended()) {
            p.pods_alive = pods_alive(ctx, &ns, &p.name, &p.uid).await?;
        }
    }
    Ok(())
}

/// Could this run hold a slot of the key, so that its pods must be asked for
/// before the slot goes? A holder; a run the key keeps a reservation for (a run
/// of several keys may have been told `Acquired` by the commit, and the key turns
/// the slot into a hold and judges its release in one sync); a sibling lock run
/// told `Acquired` with a holder's token; and a grant the status does not know of
/// (it was wiped or replaced), which is rebuilt as a hold.
fn may_hold(f: &Fetched, status: &MutexStatus, key: &str) -> bool {
    let o = f.run.observe();
    let uid = o.uid.as_str();
    let told = match multi_key_commit::run_of(&f.config, &o.status) {
        Some(m) => m.acquired.and_then(|t| t.get(key).copied()), // this key's token
        None if o.kind == RunKind::PipelineRun => {
            pending::vouched_token(run_status::acquired_token(&o.status), uid, status)
        }
        None => run_status::acquired_token(&o.status),
    };
    status.holders.iter().any(|h| h.run.uid == uid)
        || status.reservations.iter().any(|r| r.waiter.run.uid == uid)
        || told
            .is_some_and(|t| t > status.last_token || status.holders.iter().any(|h| h.token == t))
}

/// A run told Acquired with `release-after`, whose PipelineRun still runs:
/// is its section over? Then it holds nothing more.
async fn mark_done_sections(ctx: &Context, fetched: &mut [Fetched]) -> Result<(), Error> {
    for f in fetched.iter_mut() {
        let names = &f.config.release_after;
        let o = f.run.observe();
        let told = run_status::acquired_token(&o.status).is_some();
        let ns = o.namespace.clone();
        let parent = f.parent.as_mut().filter(|p| told && !p.ended());
        if let Some(p) = parent.filter(|_| !names.is_empty()) {
            let pr = p
                .object
                .clone()
                .expect("a PipelineRun that has not ended is present");
            p.section_done = release_after_progress::done(ctx, &ns, &pr, names).await?;
        }
    }
    Ok(())
}

/// The lock runs that share a hold whose `release-after` section is over, read from the API
/// server. The status names one run per hold, so a sibling lock task's run that still holds is
/// seen only if the cache shows it and it still names this lock; one hidden by a lagging cache
/// or a re-pointed `key` would let the slot go while the sibling's tasks run (found by the model
/// checker, config A-sibling). Only the PipelineRun's runs this lock told, with the same token.
async fn hold_sharers<L: LockObject>(
    ctx: &Context,
    lock: &L,
    fetched: &[Fetched],
) -> Result<Vec<Fetched>, Error> {
    let (kind, key) = (L::kind(&()), lock.name_any());
    let mut found: Vec<Fetched> = Vec::new();
    for f in fetched
        .iter()
        .filter(|f| f.parent.as_ref().is_some_and(|p| p.section_done))
    {
        let o = f.run.observe();
        let (Some(p), Some(token)) = (&f.parent, run_status::acquired_token(&o.status)) else {
            continue;
        };
        let api: Api<CustomRun> = Api::namespaced(ctx.client.clone(), &o.namespace);
        let selector = format!("tekton.dev/pipelineRun={}", p.name);
        let runs = api
            .list(&kube::api::ListParams::default().labels(&selector))
            .await?;
        for run in runs.items {
            let r = run.observe();
            let seen = |g: &Fetched| g.run.observe().uid == r.uid;
            let ours = run_status::written_by(&r.status)
                .is_some_and(|(k, name)| name == key && k.is_none_or(|k| k == kind));
            let shares = ours && run_status::acquired_token(&r.status) == Some(token);
            if !shares || fetched.iter().chain(&found).any(seen) {
                continue;
            }
            let config = r.config().unwrap_or_else(|_| f.config.clone());
            let parent = Some(ParentFetched {
                section_done: false,
                ..p.clone()
            });
            found.push(Fetched {
                run: AnyRun::Custom(Arc::new(run)),
                config,
                parent,
                revoked: None,
            });
        }
    }
    Ok(found)
}

/// The holders, and the runs slots are reserved for, whose lock runs were
/// deleted: the status names them, the API no longer has them. Each stands in
/// as its PipelineRun (is it running, does a pod of it still run?), which
/// decides when its slot is free. A reserved run may have been told `Acquired`
/// by another key before it went, so its slot is kept the same way.
async fn deleted_holders(
    ctx: &Context,
    scope: &Scope,
    status: &MutexStatus,
    members: &[Member],
) -> Result<Vec<Member>, Error> {
    let held = status.holders.iter().map(|h| (h.as_waiter(), h.since));
    let reserved = status
        .reservations
        .iter()
        .map(|r| (r.waiter.clone(), r.waiter.age.created));
    let mut ghosts: Vec<Member> = Vec::new();
    for (entry, since) in held.chain(reserved) {
        if members
            .iter()
            .chain(&ghosts)
            .any(|m| m.run().uid == entry.run.uid)
        {
            continue;
        }
        // A standalone run, or a record from before uids were kept: released as before.
        let (Some(name), Some(uid)) = (&entry.pipeline_run, &entry.pipeline_run_uid) else {
            continue;
        };
        let Some((ns, local)) = scope.local(name) else {
            continue;
        };
        let object = fetch_parent(ctx, ns, local, uid).await?;
        let ended = object.as_ref().is_none_or(|p| p.is_done());
        let parent = ParentFetched {
            name: name.clone(),
            uid: uid.clone(),
            pods_alive: ended && pods_alive(ctx, ns, local, uid).await?,
            section_done: false,
            object,
        };
        let run = &entry.run.name;
        let run_name = scope.local(run).map_or(run.as_str(), |(_, n)| n);
        ghosts.push(Member {
            namespace: ns.to_string(),
            name: run_name.to_string(),
            facts: view::deleted_member_view(&entry, since, parent.as_view()),
            resource_version: None,
            status: RunStatus::default(),
            multi: None,
            release_after: Vec::new(),
        });
    }
    Ok(ghosts)
}
