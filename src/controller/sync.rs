//! Per-key reconcile: read the key's runs and their PipelineRuns, decide, then
//! write the Mutex status (compare-and-swap), the runs' statuses and cancels,
//! in that order. The Mutex status is written first so that a crash never
//! leaves a run told something the lock state does not back.

use super::{Context, Error, Fault, writes};
use crate::decide::{self, Outcome, Parent, ParentState, Phase, RunView, Timeout};
use crate::mutex::{Age, Mutex, RunKind};
use crate::observe::{Observe, ObservedRun, PIPELINE_LABEL, to_chrono};
use crate::run_status;
use crate::tekton::RunStatus;
use crate::tekton::customrun::CustomRun;
use crate::tekton::pipelinerun::PipelineRun;
use crate::tekton::run::Run;
use chrono::{DateTime, Utc};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use std::collections::HashSet;
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
    let members = gather(ctx, ns, key, &mutex).await?;
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
    // Cancel before marking: a PipelineRun whose lock task already failed would end
    // Failed instead of Cancelled. Both steps are re-derived from state on every sync.
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
async fn gather(ctx: &Context, ns: &str, key: &str, mutex: &Mutex) -> Result<Vec<Member>, Error> {
    let now = Utc::now();
    let mut members = Vec::new();
    let in_key = |o: &ObservedRun| {
        o.namespace == ns && o.is_mutex() && !o.deleting && o.config().is_ok_and(|c| c.key == key)
    };

    let crs = ctx.custom_runs.state();
    for cr in crs.iter() {
        let o = cr.observe();
        if in_key(&o) {
            members.push(member(ctx, &o, now).await?);
        }
    }
    if let Some(store) = &ctx.runs {
        let runs = store.state();
        for r in runs.iter() {
            let o = r.observe();
            if in_key(&o) {
                members.push(member(ctx, &o, now).await?);
            }
        }
    }

    let seen: HashSet<String> = members.iter().map(|m| m.view.run.uid.clone()).collect();
    let status = mutex.status.clone().unwrap_or_default();
    let named = status
        .holders
        .iter()
        .map(|h| &h.run)
        .chain(status.queue.iter().map(|w| &w.run));
    for r in named.filter(|r| !seen.contains(&r.uid)) {
        match r.kind {
            RunKind::CustomRun => {
                let fresh = Api::<CustomRun>::namespaced(ctx.client.clone(), ns)
                    .get_opt(&r.name)
                    .await?;
                if let Some(cr) = fresh.filter(|c| c.uid().as_deref() == Some(&r.uid)) {
                    let o = cr.observe();
                    if in_key(&o) {
                        members.push(member(ctx, &o, now).await?);
                    }
                }
            }
            RunKind::Run => {
                let fresh = Api::<Run>::namespaced(ctx.client.clone(), ns)
                    .get_opt(&r.name)
                    .await?;
                if let Some(run) = fresh.filter(|c| c.uid().as_deref() == Some(&r.uid)) {
                    let o = run.observe();
                    if in_key(&o) {
                        members.push(member(ctx, &o, now).await?);
                    }
                }
            }
        }
    }
    Ok(members)
}

async fn member(ctx: &Context, o: &ObservedRun<'_>, now: DateTime<Utc>) -> Result<Member, Error> {
    let cfg = o.config().expect("members are valid runs");
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
    let deadline = cfg.timeout.map(|t| o.attempt_start() + t);
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
