//! Per-key reconcile: read the key's runs and their PipelineRuns, decide, then
//! write the Mutex status (compare-and-swap), cancel superseded PipelineRuns and
//! patch the runs' statuses, in that order. The Mutex status is written first so
//! that a crash never leaves a run told something the lock state does not back.

use super::{Context, Error, Fault, events, writes};
use crate::decide::{self, Outcome, Parent, ParentState, Phase, RunView, Timeout};
use crate::mutex::{Age, Mutex, RunKind, RunRef};
use crate::observe::{Observe, ObservedRun, PIPELINE_LABEL, to_chrono};
use crate::params::RunConfig;
use crate::run_status;
use crate::tekton::RunStatus;
use crate::tekton::pipelinerun::PipelineRun;
use chrono::{DateTime, Utc};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info};

/// A safety net, not the hand-over path: hand-over is driven by watch events.
const RESYNC: Duration = Duration::from_secs(300);
const MAX_ATTEMPTS: usize = 5;

pub async fn reconcile(mutex: Arc<Mutex>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = mutex.namespace().unwrap_or_default();
    let key = mutex.name_any();
    for _ in 0..MAX_ATTEMPTS {
        match sync_key(&ctx, &ns, &key).await {
            Err(Error::Conflict) => continue,
            other => return other,
        }
    }
    Err(Error::Conflict)
}

/// A member run with what applying a decision to it needs.
struct Member {
    view: RunView,
    resource_version: Option<String>,
    status: RunStatus,
    deadline: Option<DateTime<Utc>>,
}

async fn sync_key(ctx: &Context, ns: &str, key: &str) -> Result<Action, Error> {
    let api: Api<Mutex> = Api::namespaced(ctx.client.clone(), ns);
    // Read the lock state from the API server, not the cache: the CAS below needs it fresh.
    let Some(mut mutex) = api.get_opt(key).await? else {
        return Ok(Action::await_change());
    };
    let now = Utc::now();
    let members = gather(ctx, ns, key, &mutex, now).await?;
    let views: Vec<RunView> = members.iter().map(|m| m.view.clone()).collect();
    let current = mutex.status.clone().unwrap_or_default();
    let decision = decide::decide(&mutex.spec, &current, &views, now);

    if decision.status != current {
        let granted: Vec<_> = decision
            .status
            .holders
            .iter()
            .filter(|h| !current.holders.contains(h))
            .collect();
        mutex.status = Some(decision.status.clone());
        writes::mutex_status(ctx, &mutex).await?;
        events::status_written(ctx, ns, key, &current, &decision.status, now);
        for h in granted {
            info!(
                key,
                namespace = ns,
                token = h.token,
                holder = h.pipeline_run.as_deref().unwrap_or(&h.run.name),
                waited_seconds = h.waited_seconds,
                "granted"
            );
        }
    }

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
    // Cancel before marking the run: once its lock task has failed, the PipelineRun
    // may finish before the cancel lands, and tasks running beside the lock would
    // never get the cancel-mode. Both steps are re-derived from state on every sync.
    for c in &decision.cancels {
        writes::cancel_pipeline_run(ctx, ns, key, c).await?;
    }
    for (run, outcome) in &decision.outcomes {
        let Some(m) = members.iter().find(|m| m.view.run.uid == run.uid) else {
            continue;
        };
        if !matches!(m.view.phase, Phase::Live { .. }) {
            continue;
        }
        if let Some(patch) = run_status::patch(
            run.kind,
            key,
            outcome,
            &m.status,
            m.resource_version.as_deref(),
            now,
        ) {
            debug!(key, run = %run.name, ?outcome, "updating run status");
            writes::run_status(ctx, run.kind, ns, &run.name, &patch).await?;
            events::run_transition(ctx, ns, key, run, outcome, &m.status);
        }
    }

    // Wake up for the first waiting timeout; otherwise wait for events.
    let next = members
        .iter()
        .filter(|m| {
            decision
                .status
                .queue
                .iter()
                .any(|w| w.run.uid == m.view.run.uid)
        })
        .filter_map(|m| m.deadline)
        .min();
    Ok(match next {
        Some(t) => {
            Action::requeue((t - now).to_std().unwrap_or_default() + Duration::from_millis(20))
        }
        None => Action::requeue(RESYNC),
    })
}

/// Every live or done run of this key, plus any run the status names that the
/// cache does not show (read from the API: absence in a cache proves nothing).
async fn gather(
    ctx: &Context,
    ns: &str,
    key: &str,
    mutex: &Mutex,
    now: DateTime<Utc>,
) -> Result<Vec<Member>, Error> {
    let status = mutex.status.clone().unwrap_or_default();
    let named: Vec<&RunRef> = status
        .holders
        .iter()
        .map(|h| &h.run)
        .chain(status.queue.iter().map(|w| &w.run))
        .collect();
    let mut members = Vec::new();
    if let Some(crs) = &ctx.custom_runs {
        members.extend(members_of(ctx, crs, RunKind::CustomRun, ns, key, &named, now).await?);
    }
    if let Some(runs) = &ctx.runs {
        members.extend(members_of(ctx, runs, RunKind::Run, ns, key, &named, now).await?);
    }
    Ok(members)
}

/// The runs of one kind that belong to this key.
async fn members_of<K>(
    ctx: &Context,
    store: &Store<K>,
    kind: RunKind,
    ns: &str,
    key: &str,
    named: &[&RunRef],
    now: DateTime<Utc>,
) -> Result<Vec<Member>, Error>
where
    K: Observe + Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut members = Vec::new();
    let add = async |obj: &K, members: &mut Vec<Member>| -> Result<(), Error> {
        let o = obj.observe();
        if o.namespace == ns
            && o.is_mutex()
            && !o.deleting
            && let Ok(cfg) = o.config()
            && cfg.key == key
        {
            members.push(member(ctx, &o, cfg, now).await?);
        }
        Ok(())
    };
    for obj in store.state() {
        add(&obj, &mut members).await?;
    }
    let missing = named
        .iter()
        .filter(|r| r.kind == kind && !members.iter().any(|m| m.view.run.uid == r.uid));
    let api: Api<K> = Api::namespaced(ctx.client.clone(), ns);
    for r in missing.collect::<Vec<_>>() {
        if let Some(obj) = api
            .get_opt(&r.name)
            .await?
            .filter(|o| o.uid().as_deref() == Some(&r.uid))
        {
            add(&obj, &mut members).await?;
        }
    }
    Ok(members)
}

async fn member(
    ctx: &Context,
    o: &ObservedRun<'_>,
    cfg: RunConfig,
    now: DateTime<Utc>,
) -> Result<Member, Error> {
    let pr = match &o.parent {
        Some((name, uid)) => Some((name.clone(), parent(ctx, &o.namespace, name, uid).await?)),
        None => None,
    };
    let pr_obj = pr.as_ref().and_then(|(_, p)| p.as_ref());
    let age = match (&o.parent, pr_obj) {
        (Some((name, _)), Some(p)) => Age {
            sequence: cfg.sequence,
            created: p
                .creation_timestamp()
                .map(|t| to_chrono(t.0))
                .unwrap_or(o.created),
            name: name.clone(),
        },
        (Some((name, _)), None) => Age {
            sequence: cfg.sequence,
            created: o.created,
            name: name.clone(),
        },
        (None, _) => Age {
            sequence: cfg.sequence,
            created: o.created,
            name: o.name.clone(),
        },
    };
    let group = cfg
        .group
        .clone()
        .or_else(|| o.pipeline_label.clone())
        .or_else(|| pr_obj.and_then(|p| p.labels().get(PIPELINE_LABEL).cloned()))
        .unwrap_or_else(|| age.name.clone());
    // A timeout too large for a date is no timeout at all.
    let deadline = cfg
        .timeout
        .and_then(|t| chrono::TimeDelta::from_std(t).ok())
        .and_then(|t| o.attempt_start().checked_add_signed(t));
    let phase = if o.is_done() {
        Phase::Done {
            reason: o
                .status
                .succeeded()
                .and_then(|c| c.reason.clone())
                .unwrap_or_default(),
        }
    } else {
        let timeout = match deadline {
            Some(d) if d <= now && (o.status.retries_status.len() as u32) < cfg.retries => {
                Timeout::Retry
            }
            Some(d) if d <= now => Timeout::Final,
            _ => Timeout::NotYet,
        };
        Phase::Live {
            cancel_requested: o.cancel_requested,
            timeout,
        }
    };
    let parent = pr.map(|(name, p)| Parent {
        name,
        state: match p {
            None => ParentState::Gone,
            Some(p) if p.is_done() => ParentState::Done,
            Some(p) if p.stop_requested() => ParentState::StopRequested,
            Some(_) => ParentState::Running,
        },
    });
    Ok(Member {
        view: RunView {
            run: o.run_ref(),
            parent,
            group,
            age,
            priority: cfg.priority,
            supersede: cfg.supersede,
            cancel_mode: cfg.cancel_mode,
            wait: cfg.wait,
            phase,
        },
        resource_version: o.resource_version.clone(),
        status: o.status.clone(),
        deadline,
    })
}

/// The run's PipelineRun, from the cache when it has it, else from the API.
/// None means it is gone (deleted, being deleted, or replaced under the same name).
async fn parent(
    ctx: &Context,
    ns: &str,
    name: &str,
    uid: &str,
) -> Result<Option<Arc<PipelineRun>>, Error> {
    let cached = ctx.pipeline_runs.get(&ObjectRef::new(name).within(ns));
    let pr = match cached.filter(|p| p.uid().as_deref() == Some(uid)) {
        Some(p) => Some(p),
        None => Api::<PipelineRun>::namespaced(ctx.client.clone(), ns)
            .get_opt(name)
            .await?
            .filter(|p| p.uid().as_deref() == Some(uid))
            .map(Arc::new),
    };
    Ok(pr.filter(|p| {
        kube::Resource::meta(p.as_ref())
            .deletion_timestamp
            .is_none()
    }))
}
