//! ClusterMutex: the same lock as a Mutex, shared by the namespaces an
//! administrator allows (src/cluster_mutex.rs). Intake refuses runs it cannot
//! serve (reason `Forbidden` for a namespace that is not allowed); the sync
//! fetches the runs of every allowed namespace, views them with
//! namespace-qualified names, asks the same decision core, and applies it:
//! the status by compare-and-swap first, then grants, cancels, the other runs.

use crate::controller::apply::events;
use crate::controller::apply::writes;
use crate::controller::cache::index::Tag;
use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::controller::reconcile::cluster_feeds;
use crate::controller::reconcile::pipeline_runs;
use crate::controller::reconcile::release_after_progress;
use crate::core::decide::{self};
use crate::core::model::{Decision, MutexFacts, Outcome, Phase, RunView};
use crate::core::observe::{Observe, ObservedRun};
use crate::core::params::RunConfig;
use crate::core::release_after::Verdict;
use crate::core::run_status::{self, Reason};
use crate::core::view::{self, FetchedParent, MemberView};
use crate::model::cluster_mutex::{self, ClusterMutex, ClusterMutexSpec, qualify, unqualify};
use crate::model::mutex::{MutexStatus, RunRef};
use crate::model::tekton::RunStatus;
use chrono::{DateTime, Utc};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::PostParams;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tracing::{info, warn};

/// Reason of a run whose namespace may not use the ClusterMutex.
pub const FORBIDDEN: &str = "Forbidden";
const RESYNC: Duration = Duration::from_secs(300);
const MAX_ATTEMPTS: usize = 5;

/// Intake of a live run (see `intake::needs_intake`) that refers to a
/// ClusterMutex; None if it does not.
pub async fn intake<K: Observe + Resource>(
    obj: &K,
    ctx: &Context,
) -> Result<Option<Action>, Error> {
    let o = obj.observe();
    let Some(target) = crate::core::observe::cluster_mutex_target(&o) else {
        return Ok(None);
    };
    let refused = match target {
        Err(message) => Some((Reason::InvalidParams.as_str(), message)),
        Ok(name) => match admission(ctx, &o, obj, &name).await? {
            Admission::Admitted => None,
            Admission::NotYet => return Ok(Some(Action::requeue(release_after_progress::RECHECK))),
            Admission::Refused(reason, message) => Some((reason, message)),
        },
    };
    if let Some((reason, message)) = refused {
        warn!(run = %o.name, namespace = %o.namespace, reason, %message, "ClusterMutex run refused");
        let mut patch = run_status::invalid_params_patch(&message, &o.status, Utc::now());
        patch["status"]["conditions"][0]["reason"] = reason.into();
        if writes::run_status(ctx, o.kind, &o.namespace, &o.name, &patch).await? {
            events::invalid(ctx, &o, &message);
        }
    }
    Ok(Some(Action::await_change()))
}

enum Admission {
    Admitted,
    NotYet,
    Refused(&'static str, String),
}

async fn admission<K: Observe>(
    ctx: &Context,
    o: &ObservedRun<'_>,
    obj: &K,
    name: &str,
) -> Result<Admission, Error> {
    let invalid = |m: String| Admission::Refused(Reason::InvalidParams.as_str(), m);
    let cfg = match o.config() {
        Ok(cfg) => cfg,
        Err(m) => return Ok(invalid(m)),
    };
    let api: Api<ClusterMutex> = Api::all(ctx.client.clone());
    let found = match api.get_opt(name).await {
        // The namespace-scoped install: a Role cannot grant a cluster-scoped kind.
        Err(kube::Error::Api(e)) if e.code == 403 => {
            return Ok(invalid(format!(
                "tekton-mutex may not read ClusterMutexes (it runs with the namespace-scoped install): \
                 ClusterMutex {name} needs the cluster-wide install"
            )));
        }
        other => other?,
    };
    let Some(cm) = found else {
        return Ok(invalid(format!(
            "ClusterMutex {name} does not exist: an administrator creates it (runs never do)"
        )));
    };
    if !allowed(ctx, &cm.spec, &o.namespace, &mut HashMap::new()).await? {
        let message = cluster_mutex::forbidden(name, &o.namespace);
        return Ok(Admission::Refused(FORBIDDEN, message));
    }
    Ok(
        match release_after_progress::check(ctx, o, obj, &cfg).await? {
            Verdict::Fine => Admission::Admitted,
            Verdict::NotYet => Admission::NotYet,
            Verdict::Invalid(m) => invalid(m),
        },
    )
}

/// Namespace labels read during one sync (only when a selector needs them).
type Labels = HashMap<String, BTreeMap<String, String>>;

async fn allowed(
    ctx: &Context,
    spec: &ClusterMutexSpec,
    ns: &str,
    seen: &mut Labels,
) -> Result<bool, Error> {
    if !spec.needs_labels(ns) {
        return Ok(spec.allows(ns, &BTreeMap::new()));
    }
    if !seen.contains_key(ns) {
        let api: Api<Namespace> = Api::all(ctx.client.clone());
        let labels = api
            .get_opt(ns)
            .await?
            .map(|n| n.labels().clone())
            .unwrap_or_default();
        seen.insert(ns.to_string(), labels);
    }
    Ok(spec.allows(ns, &seen[ns]))
}

pub async fn reconcile(cm: Arc<ClusterMutex>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = cm.name_any();
    for _ in 0..MAX_ATTEMPTS {
        match sync_cluster(&ctx, &name).await {
            Err(Error::Conflict) => continue,
            other => return other,
        }
    }
    Err(Error::Conflict)
}

/// A run of this ClusterMutex as fetched, with its view.
struct Member {
    namespace: String,
    name: String,
    facts: MemberView,
    resource_version: Option<String>,
    status: RunStatus,
}

async fn sync_cluster(ctx: &Context, name: &str) -> Result<Action, Error> {
    let api: Api<ClusterMutex> = Api::all(ctx.client.clone());
    let Some(cm) = api.get_opt(name).await? else {
        return Ok(Action::await_change());
    };
    let current = cm.status.clone().unwrap_or_default();
    let now = Utc::now();
    let mut members = fetch_members(ctx, &cm, &current, now).await?;
    members.extend(deleted_holders(ctx, &current, &members).await?);
    let views: Vec<RunView> = members.iter().map(|m| m.facts.view.clone()).collect();
    let spec = cm.spec.lock_spec();
    let decision = decide::decide(&crate::core::model::Input {
        spec: &spec,
        status: &current,
        runs: &views,
        now,
        facts: MutexFacts::default(),
        requests: &[],
        multi: &Default::default(),
    });
    if decision.status != current {
        let mut cm = cm.clone();
        cm.status = Some(decision.status.clone());
        ctx.metrics.api_write("update", "clustermutexes/status");
        match api.replace_status(name, &PostParams::default(), &cm).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => return Err(Error::Conflict),
            Err(e) => return Err(e.into()),
        }
        log_grants(name, &current, &decision.status);
    }
    apply(ctx, name, &decision, &members, now).await?;
    Ok(next_wake(&members, &decision, now))
}

/// Every run of an allowed namespace that refers to this ClusterMutex, plus
/// those its status names (an entry stays even if its namespace was dropped).
async fn fetch_members(
    ctx: &Context,
    cm: &ClusterMutex,
    status: &MutexStatus,
    now: DateTime<Utc>,
) -> Result<Vec<Member>, Error> {
    let named: Vec<&RunRef> = status
        .holders
        .iter()
        .map(|h| &h.run)
        .chain(status.queue.iter().map(|w| &w.run))
        .collect();
    let mut objects: Vec<cluster_feeds::AnyRun> = Vec::new();
    let tag = Tag::cluster_mutex(&cm.name_any());
    if let Some(s) = &ctx.custom_runs {
        objects.extend(s.get(&tag).into_iter().map(cluster_feeds::AnyRun::Custom));
    }
    if let Some(s) = &ctx.runs {
        objects.extend(s.get(&tag).into_iter().map(cluster_feeds::AnyRun::Legacy));
    }
    objects.extend(cluster_feeds::missing(ctx, &named, &objects).await?);
    let mut labels = Labels::new();
    let mut members = Vec::new();
    for obj in &objects {
        let o = obj.observe();
        let known = named.iter().any(|r| r.uid == o.uid);
        let Some(Ok(target)) = crate::core::observe::cluster_mutex_target(&o) else {
            continue;
        };
        let Ok(cfg) = o.config() else {
            continue;
        };
        if target != cm.name_any() || o.deleting {
            continue;
        }
        if !known && !allowed(ctx, &cm.spec, &o.namespace, &mut labels).await? {
            continue; // intake fails it as Forbidden
        }
        if let Some(m) = member(ctx, cm, obj, &o, &cfg, known, now).await? {
            members.push(m);
        }
    }
    Ok(members)
}

/// One run's view: parent fetched, drained and sectioned as for a Mutex, then
/// names qualified by namespace and the group by the ClusterMutex's rule.
async fn member(
    ctx: &Context,
    cm: &ClusterMutex,
    obj: &cluster_feeds::AnyRun,
    o: &ObservedRun<'_>,
    cfg: &RunConfig,
    known: bool,
    now: DateTime<Utc>,
) -> Result<Option<Member>, Error> {
    let ns = o.namespace.as_str();
    let parent = match &o.parent {
        Some((name, uid)) => Some((
            name.as_str(),
            uid.as_str(),
            pipeline_runs::fetch_parent(ctx, ns, name, uid).await?,
        )),
        None => None,
    };
    let parent_object = parent.as_ref().map(|(_, _, p)| p.as_deref());
    if !known && !obj.enrols(cfg, parent_object) {
        return Ok(None);
    }
    let told = run_status::acquired_token(&o.status).is_some();
    let holds = told
        || cm
            .status
            .as_ref()
            .is_some_and(|s| s.holders.iter().any(|h| h.run.uid == o.uid));
    let mut fetched = None;
    if let Some((name, uid, object)) = &parent {
        let ended = object.as_ref().is_none_or(|p| p.is_done());
        let pods_alive = holds && ended && pipeline_runs::pods_alive(ctx, ns, name, uid).await?;
        let section_done = match object.as_deref() {
            Some(pr) if told && !ended && !cfg.release_after.is_empty() => {
                release_after_progress::done(ctx, ns, pr, &cfg.release_after).await?
            }
            _ => false,
        };
        fetched = Some((pods_alive, section_done));
    }
    let view_parent =
        parent
            .as_ref()
            .zip(fetched)
            .map(
                |((name, uid, object), (pods_alive, section_done))| FetchedParent {
                    name,
                    uid,
                    object: object.as_deref(),
                    pods_alive,
                    section_done,
                },
            );
    let mut facts = view::member_view(o, cfg, view_parent, now);
    qualify_view(&mut facts.view, ns, &cm.spec);
    Ok(Some(Member {
        namespace: ns.to_string(),
        name: o.name.clone(),
        facts,
        resource_version: o.resource_version.clone(),
        status: o.status.clone(),
    }))
}

fn qualify_view(v: &mut RunView, ns: &str, spec: &ClusterMutexSpec) {
    v.run.name = qualify(ns, &v.run.name);
    if let Some(p) = v.parent.as_mut() {
        p.name = qualify(ns, &p.name);
    }
    v.age.name = qualify(ns, &v.age.name);
    v.group = spec.group(ns, &v.group);
}

/// Holders whose lock run was deleted: the PipelineRun keeps the slot until
/// nothing of it runs, as for a Mutex.
async fn deleted_holders(
    ctx: &Context,
    status: &MutexStatus,
    members: &[Member],
) -> Result<Vec<Member>, Error> {
    let mut ghosts = Vec::new();
    for h in &status.holders {
        if members.iter().any(|m| m.facts.view.run.uid == h.run.uid) {
            continue;
        }
        let (Some(qualified), Some(uid)) = (&h.pipeline_run, &h.pipeline_run_uid) else {
            continue;
        };
        let Some((ns, name)) = unqualify(qualified) else {
            continue;
        };
        let object = pipeline_runs::fetch_parent(ctx, ns, name, uid).await?;
        let ended = object.as_ref().is_none_or(|p| p.is_done());
        let parent = FetchedParent {
            name: qualified,
            uid,
            object: object.as_deref(),
            pods_alive: ended && pipeline_runs::pods_alive(ctx, ns, name, uid).await?,
            section_done: false,
        };
        let run_name = unqualify(&h.run.name).map_or(h.run.name.as_str(), |(_, n)| n);
        ghosts.push(Member {
            namespace: ns.to_string(),
            name: run_name.to_string(),
            facts: view::deleted_holder_view(h, parent),
            resource_version: None,
            status: RunStatus::default(),
        });
    }
    Ok(ghosts)
}

fn log_grants(name: &str, before: &MutexStatus, after: &MutexStatus) {
    for h in after.holders.iter().filter(|h| !before.holders.contains(h)) {
        let holder = h.pipeline_run.as_deref().unwrap_or(&h.run.name);
        info!(cluster_mutex = name, token = h.token, holder, "granted");
    }
}

/// Grants first, then cancels, then every other run; the first error is kept
/// and returned once all were tried.
async fn apply(
    ctx: &Context,
    name: &str,
    decision: &Decision,
    members: &[Member],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let (grants, others): (Vec<_>, Vec<_>) = decision
        .outcomes
        .iter()
        .partition(|(_, o)| matches!(o, Outcome::Acquired { .. }));
    let mut first_error = None;
    for (run, outcome) in &grants {
        if let Err(e) = tell(ctx, name, run, outcome, members, now).await {
            first_error.get_or_insert(e);
        }
    }
    for c in &decision.cancels {
        let Some((ns, pr)) = unqualify(&c.pipeline_run) else {
            continue;
        };
        let local = crate::core::model::Cancel {
            pipeline_run: pr.to_string(),
            ..c.clone()
        };
        if let Err(e) = writes::cancel_pipeline_run(ctx, ns, name, &local).await {
            first_error.get_or_insert(e);
        }
    }
    for (run, outcome) in &others {
        if let Err(e) = tell(ctx, name, run, outcome, members, now).await {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Patch a live run whose status does not yet say its outcome.
async fn tell(
    ctx: &Context,
    name: &str,
    run: &RunRef,
    outcome: &Outcome,
    members: &[Member],
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let Some(m) = members.iter().find(|m| m.facts.view.run.uid == run.uid) else {
        return Ok(());
    };
    if !matches!(m.facts.view.phase, Phase::Live { .. }) {
        return Ok(());
    }
    let rv = m.resource_version.as_deref();
    let Some(patch) = run_status::patch(run.kind, name, outcome, &m.status, rv, now) else {
        return Ok(());
    };
    if writes::run_status(ctx, run.kind, &m.namespace, &m.name, &patch).await? {
        let local = RunRef {
            name: m.name.clone(),
            ..run.clone()
        };
        events::run_transition(ctx, &m.namespace, name, &local, outcome, &m.status);
    }
    Ok(())
}

/// Wake up for the first waiting timeout; otherwise wait for events.
fn next_wake(members: &[Member], decision: &Decision, now: DateTime<Utc>) -> Action {
    let queued = |m: &&Member| {
        let uid = &m.facts.view.run.uid;
        decision.status.queue.iter().any(|w| w.run.uid == *uid)
    };
    match members
        .iter()
        .filter(queued)
        .filter_map(|m| m.facts.deadline)
        .min()
    {
        Some(t) => {
            Action::requeue((t - now).to_std().unwrap_or_default() + Duration::from_millis(20))
        }
        None => Action::requeue(RESYNC),
    }
}
