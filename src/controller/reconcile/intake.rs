//! Per-run reconcile: reject bad input, make sure the key's Mutex object exists.
//! Everything about waiting and holding is the Mutex reconcile's job.

use crate::controller::apply::events::{self, Transition};
use crate::controller::apply::writes;
use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::controller::reconcile::release_after_progress;
use crate::core::model::Outcome;
use crate::core::observe::{Observe, ObservedRun};
use crate::core::params::RunConfig;
use crate::core::release_after::NamesCheck;
use crate::core::run_status;
use futures::{Stream, StreamExt};
use jiff::Timestamp;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// What intake hears of: the runs it may act on, as they change (a cluster's
/// history of done runs never enters its queue), and all of them again each
/// time this replica becomes the leader.
pub fn triggers<K>(
    changes: impl Stream<Item = Arc<K>> + Send + 'static,
    cache: &Store<K>,
    leading: Option<watch::Receiver<bool>>,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Observe + Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    triggers_where(changes, cache, leading, |r: &K| needs_intake(&r.observe()))
}

/// The objects of `changes` that `acts_on`, and all of the cache's again each time this
/// replica becomes the leader (those that `acts_on` too).
pub fn triggers_where<K>(
    changes: impl Stream<Item = Arc<K>> + Send + 'static,
    cache: &Store<K>,
    leading: Option<watch::Receiver<bool>>,
    acts_on: fn(&K) -> bool,
) -> impl Stream<Item = Arc<K>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let cache = cache.clone();
    let again = match leading {
        Some(rx) => crate::controller::leader::became_leader(rx)
            .flat_map(move |()| futures::stream::iter(cache.state()))
            .left_stream(),
        None => futures::stream::empty().right_stream(),
    };
    futures::stream::select(changes, again).filter(move |r| futures::future::ready(acts_on(r)))
}

/// A run intake may act on: of a Mutex or a ClusterMutex, not done, not
/// being deleted. Intake leaves every other run alone.
/// The triggers filter on it, and a reconcile checks it again on the run as
/// cached by then.
pub fn needs_intake(o: &ObservedRun<'_>) -> bool {
    o.is_ours() && !o.is_done() && !o.deleting
}

pub async fn reconcile<K: Observe + Resource<DynamicType = ()>>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let o = obj.observe();
    if !needs_intake(&o) {
        return Ok(Action::await_change());
    }
    if let Some(message) = o.repointed() {
        warn!(run = %o.name, namespace = %o.namespace, %message, "lock run re-pointed");
        if writes::invalid_params(&ctx, &o, &message).await? {
            events::invalid(&ctx, &o, &message);
        }
        return Ok(Action::await_change());
    }
    if let Some(action) =
        crate::controller::reconcile::cluster_admission::intake(obj.as_ref(), &ctx).await?
    {
        return Ok(action);
    }
    let problem = match o.config() {
        Err(message) => Some(message),
        Ok(cfg) => match release_after_progress::check(&ctx, &o, obj.as_ref(), &cfg).await? {
            NamesCheck::NotYet => return Ok(release_after_progress::recheck(&ctx, obj.as_ref())),
            NamesCheck::Invalid(message) => Some(message),
            NamesCheck::Fine => match mutex_for(&ctx, &o, &cfg).await {
                Err(e) if namespace_terminating(&e) => {
                    // Nothing can be created there any more, and the run goes with it.
                    debug!(run = %o.name, namespace = %o.namespace, "namespace is being deleted; run left alone");
                    return Ok(Action::await_change());
                }
                Err(e) if writes::lock_kind_uninstalled(&e) => {
                    tell_uninstalling(&ctx, &o, &cfg.key).await?;
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
    let keys = o.config().map(|cfg| cfg.keys).unwrap_or_default();
    Ok(recheck_while_deleting(&ctx, &o.namespace, &keys))
}

/// How soon a run is looked at again while something it waits on cannot be seen yet: its Mutex
/// being deleted, or a cache behind the lock a selector's mark names.
pub(crate) const RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// A run that arrives while its Mutex is being deleted may come after that lock's last sync,
/// and nothing else would tell it anything: it is looked at again shortly, until the Mutex is
/// gone, then joins the one created again for it or is told none can be (an uninstall).
pub(crate) fn recheck_while_deleting(ctx: &Context, namespace: &str, keys: &[String]) -> Action {
    let deleting = keys.iter().any(|key| {
        ctx.mutexes
            .get(&ObjectRef::new(key).within(namespace))
            .is_some_and(|m| m.metadata.deletion_timestamp.is_some())
    });
    match deleting {
        true => Action::requeue(RECHECK),
        false => Action::await_change(),
    }
}

/// Make sure the run's Mutex exists. Returns why the run cannot use it, if it cannot.
pub(crate) async fn mutex_for(
    ctx: &Context,
    o: &ObservedRun<'_>,
    cfg: &RunConfig,
) -> Result<Option<String>, Error> {
    if cfg.keys.len() > 1 {
        return crate::controller::apply::multi_key_commit::mutexes_for(ctx, o, cfg).await;
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
            writes::Ensured::Existing(spec) => *spec,
        },
    };
    Ok(cfg.spec_conflict(&existing))
}

/// The run's Mutex cannot be created because the Mutex CRD itself is being deleted (the README's
/// uninstall): the run is told so, for good, instead of waiting for a lock that cannot come.
pub(crate) async fn tell_uninstalling(
    ctx: &Context,
    o: &ObservedRun<'_>,
    key: &str,
) -> Result<(), Error> {
    let outcome = Outcome::Uninstalling;
    let rv = o.resource_version.as_deref();
    let Some(patch) = run_status::patch(o.kind, key, &outcome, &o.status, rv, Timestamp::now())
    else {
        return Ok(());
    };
    let (_, message) = run_status::condition(o.kind, key, &outcome);
    warn!(run = %o.name, namespace = %o.namespace, %message, "lock kind being uninstalled");
    if writes::run_status(ctx, o.kind, &o.namespace, &o.name, &patch).await? {
        let said = Transition {
            reason: run_status::Reason::LockDeleted.as_str(),
            note: message,
            type_: EventType::Warning,
        };
        events::record(ctx, &o.namespace, &o.run_ref(), said);
    }
    Ok(())
}

/// The API server's answer to a create in a namespace that is being deleted.
pub fn namespace_terminating(e: &Error) -> bool {
    matches!(e, Error::Kube(kube::Error::Api(s))
        if s.code == 403 && s.message.contains("because it is being terminated"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tekton::customrun::CustomRun;
    use kube::runtime::reflector::store::Writer;
    use kube::runtime::watcher;

    fn run(name: &str, kind: &str, status: &str) -> Arc<CustomRun> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": kind},
                         "params": [{"name": "key", "value": "k"}]},
                "status": {"conditions": [{"type": "Succeeded", "status": status}]},
            }))
            .unwrap(),
        )
    }

    /// A cluster's history of done runs never enters intake's queue: at start-up
    /// and on every leadership alike, only the runs it may act on are heard of.
    #[tokio::test(flavor = "current_thread")]
    async fn intake_hears_only_of_the_runs_it_may_act_on_and_of_all_of_them_on_leading() {
        let runs = [
            run("waiting", "Mutex", "Unknown"),
            run("done", "Mutex", "True"),
            run("other", "Approval", "Unknown"),
            run("shared", "ClusterMutex", "Unknown"),
        ];
        let mut writer = Writer::<CustomRun>::default();
        for r in &runs {
            writer.apply_watcher_event(&watcher::Event::Apply(r.as_ref().clone()));
        }
        let (changes_tx, changes) = futures::channel::mpsc::unbounded();
        let (leading_tx, leading) = watch::channel(false);
        let mut heard = Box::pin(triggers(changes, &writer.as_reader(), Some(leading)));
        let mut next_names = async |n: usize| {
            let mut names = Vec::new();
            for _ in 0..n {
                names.push(heard.next().await.unwrap().metadata.name.clone().unwrap());
            }
            names.sort();
            names
        };
        for r in &runs {
            changes_tx.unbounded_send(r.clone()).unwrap();
        }
        assert_eq!(next_names(2).await, ["shared", "waiting"]);
        leading_tx.send_replace(true);
        assert_eq!(next_names(2).await, ["shared", "waiting"]);
        drop((changes_tx, leading_tx));
        assert!(
            heard.next().await.is_none(),
            "heard of a run it may not act on"
        );
    }
}
