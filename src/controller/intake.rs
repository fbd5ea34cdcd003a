//! Per-run reconcile: reject bad input, make sure the key's Mutex object exists.
//! Everything about waiting and holding is the Mutex reconcile's job.

use super::{Context, Error, events, writes};
use crate::observe::Observe;
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
    match o.config() {
        Err(message) => {
            warn!(run = %o.name, namespace = %o.namespace, %message, "invalid Mutex run");
            writes::invalid_params(&ctx, &o, &message).await?;
            events::invalid(&ctx, &o, &message);
        }
        Ok(cfg) => {
            if ctx
                .mutexes
                .get(&ObjectRef::new(&cfg.key).within(&o.namespace))
                .is_none()
                && writes::ensure_mutex(&ctx, &o.namespace, &cfg.key, &cfg.spec).await?
            {
                info!(key = %cfg.key, namespace = %o.namespace, run = %o.name, "created Mutex");
            }
        }
    }
    Ok(Action::await_change())
}
