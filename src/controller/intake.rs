//! Per-run reconcile: reject bad input, make sure the key's Mutex object exists.
//! Everything about waiting and holding is the Mutex reconcile's job.

use super::{Context, Error, events, section, writes};
use crate::observe::{Observe, ObservedRun};
use crate::params::RunConfig;
use crate::release_after::Verdict;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use tracing::{debug, info, warn};

pub async fn reconcile<K: Observe + Resource>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if let Some(action) = super::cluster::intake(obj.as_ref(), &ctx).await? {
        return Ok(action);
    }
    let o = obj.observe();
    if !o.is_mutex() || o.is_done() || o.deleting {
        return Ok(Action::await_change());
    }
    let problem = match o.config() {
        Err(message) => Some(message),
        Ok(cfg) => match section::check(&ctx, &o, obj.as_ref(), &cfg).await? {
            Verdict::NotYet => return Ok(Action::requeue(section::RECHECK)),
            Verdict::Invalid(message) => Some(message),
            Verdict::Fine => match mutex_for(&ctx, &o, &cfg).await {
                Err(e) if namespace_terminating(&e) => {
                    // Nothing can be created there any more, and the run goes with it.
                    debug!(run = %o.name, namespace = %o.namespace, "namespace is being deleted; run left alone");
                    return Ok(Action::await_change());
                }
                other => other?,
            },
        },
    };
    if let Some(message) = problem {
        warn!(run = %o.name, namespace = %o.namespace, %message, "invalid Mutex run");
        if writes::invalid_params(&ctx, &o, &message).await? {
            events::invalid(&ctx, &o, &message);
        }
    }
    Ok(Action::await_change())
}

/// Make sure the run's Mutex exists. Returns why the run cannot use it, if it cannot.
async fn mutex_for(
    ctx: &Context,
    o: &ObservedRun<'_>,
    cfg: &RunConfig,
) -> Result<Option<String>, Error> {
    if cfg.keys.len() > 1 {
        return super::multikey::mutexes_for(ctx, o, cfg).await;
    }
    let cached = ctx
        .mutexes
        .get(&ObjectRef::new(&cfg.key).within(&o.namespace));
    let existing = match cached {
        Some(m) => m.spec.clone(),
        None => match writes::ensure_mutex(ctx, &o.namespace, &cfg.key, &cfg.spec).await? {
            writes::Ensured::Created => {
                info!(key = %cfg.key, namespace = %o.namespace, run = %o.name, "created Mutex");
                return Ok(None);
            }
            writes::Ensured::Existing(spec) => spec,
        },
    };
    Ok(cfg.spec_conflict(&existing))
}

/// The API server's answer to a create in a namespace that is being deleted.
pub fn namespace_terminating(e: &Error) -> bool {
    matches!(e, Error::Kube(kube::Error::Api(s))
        if s.code == 403 && s.message.contains("because it is being terminated"))
}
