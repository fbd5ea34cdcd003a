//! Which runs a ClusterMutex serves: intake refuses a run it cannot serve
//! (reason `Forbidden` for a namespace that is not allowed, `InvalidParams`
//! for a ClusterMutex that does not exist or cannot be read), and the lock's
//! sync asks [`allowed`] before a run of a namespace joins.

use crate::controller::apply::events;
use crate::controller::apply::writes;
use crate::controller::context::{Context, Error};
use crate::controller::lock_object::NamespaceLabels;
use crate::controller::reconcile::release_after_progress;
use crate::core::observe::{Observe, ObservedRun};
use crate::core::release_after::NamesCheck;
use crate::core::run_status::{self, Reason};
use crate::model::cluster_mutex::{self, ClusterMutex, ClusterMutexSpec};
use jiff::Timestamp;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use std::collections::BTreeMap;
use tracing::warn;

/// Reason of a run whose namespace may not use the ClusterMutex.
pub const FORBIDDEN: &str = "Forbidden";

/// Intake of a live run (see `intake::needs_intake`) that refers to a
/// ClusterMutex; None if it does not.
pub async fn intake<K: Observe + Resource<DynamicType = ()>>(
    obj: &K,
    ctx: &Context,
) -> Result<Option<Action>, Error> {
    let o = obj.observe();
    let Some(targets) = crate::core::observe::cluster_mutex_targets(&o) else {
        return Ok(None);
    };
    let refused = match targets {
        Err(message) => Some((Reason::InvalidParams.as_str(), message)),
        Ok(names) => match admission(ctx, &o, obj, &names).await? {
            Admission::Admitted => None,
            Admission::NotYet => return Ok(Some(release_after_progress::recheck(ctx, obj))),
            Admission::Refused(reason, message) => Some((reason, message)),
        },
    };
    if let Some((reason, message)) = refused {
        warn!(run = %o.name, namespace = %o.namespace, reason, %message, "ClusterMutex run refused");
        let mut patch = run_status::invalid_params_patch(&message, &o.status, Timestamp::now());
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

async fn admission<K: Observe + Resource<DynamicType = ()>>(
    ctx: &Context,
    o: &ObservedRun<'_>,
    obj: &K,
    names: &[String],
) -> Result<Admission, Error> {
    let invalid = |m: String| Admission::Refused(Reason::InvalidParams.as_str(), m);
    let cfg = match o.config() {
        Ok(cfg) => cfg,
        Err(m) => return Ok(invalid(m)),
    };
    let mut orders = Vec::new();
    for name in names {
        match admitted_by(ctx, o, name).await? {
            Ok(cm) => orders.push((name.as_str(), cm.spec.lock.order)),
            Err(refused) => return Ok(refused),
        }
    }
    if let Some(message) = crate::core::params::keys::orders_differ("ClusterMutex", orders) {
        return Ok(invalid(message));
    }
    Ok(
        match release_after_progress::check(ctx, o, obj, &cfg).await? {
            NamesCheck::Fine => Admission::Admitted,
            NamesCheck::NotYet => Admission::NotYet,
            NamesCheck::Invalid(m) => invalid(m),
        },
    )
}

/// Why the run may not queue on ClusterMutex `name` (it does not exist, or does
/// not allow the run's namespace); None if it may.
pub async fn refusal(
    ctx: &Context,
    o: &ObservedRun<'_>,
    name: &str,
) -> Result<Option<String>, Error> {
    Ok(match admitted_by(ctx, o, name).await? {
        Err(Admission::Refused(_, message)) => Some(message),
        Ok(_) | Err(_) => None,
    })
}

/// ClusterMutex `name`, if it exists and allows the run's namespace.
async fn admitted_by(
    ctx: &Context,
    o: &ObservedRun<'_>,
    name: &str,
) -> Result<Result<ClusterMutex, Admission>, Error> {
    let invalid = |m: String| Err(Admission::Refused(Reason::InvalidParams.as_str(), m));
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
    if !allowed(ctx, &cm.spec, &o.namespace, &mut NamespaceLabels::new()).await? {
        let message = cluster_mutex::forbidden(name, &o.namespace);
        return Ok(Err(Admission::Refused(FORBIDDEN, message)));
    }
    Ok(Ok(cm))
}

pub async fn allowed(
    ctx: &Context,
    spec: &ClusterMutexSpec,
    ns: &str,
    seen: &mut NamespaceLabels,
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
