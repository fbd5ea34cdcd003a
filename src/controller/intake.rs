//! Per-run reconcile: reject bad input, make sure the key's Mutex object exists.
//! Everything about waiting and holding is the Mutex reconcile's job.

use super::{Context, Error, events, writes};
use crate::observe::{Observe, ObservedRun};
use crate::params::RunConfig;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use tracing::{info, warn};

pub async fn reconcile<K: Observe + Resource>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let o = obj.observe();
    if !o.is_mutex() || o.is_done() || o.deleting {
        return Ok(Action::await_change());
    }
    let problem = match o.config() {
        Err(message) => Some(message),
        Ok(cfg) => mutex_for(&ctx, &o, &cfg).await?,
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
