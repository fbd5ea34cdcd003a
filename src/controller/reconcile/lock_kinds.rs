//! The two kinds of lock object, as the engine reads them: a Mutex (one key of
//! one namespace, created by its first run) and a ClusterMutex (created by an
//! administrator, shared by the namespaces it allows).

use crate::controller::apply::writes;
use crate::controller::cache::index::Tag;
use crate::controller::cache::told::Written;
use crate::controller::context::{Context, Error};
use crate::controller::lock_object::{LockObject, NamespaceLabels};
use crate::controller::reconcile::cluster_admission;
use crate::core::model::RunView;
use crate::core::observe::{ObservedRun, cluster_mutex_targets};
use crate::core::params::RunConfig;
use crate::core::scope::Scope;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::{DEFAULT_IDLE_DELETE_DAYS, Mutex, MutexSpec};
use kube::{Api, Client, ResourceExt};
use tracing::{info, warn};

impl LockObject for Mutex {
    fn api(client: &Client, scope: &Scope) -> Api<Self> {
        Api::namespaced(client.clone(), scope.label())
    }

    fn scope(&self) -> Scope {
        Scope::Namespace(self.namespace().unwrap_or_default())
    }

    fn written(ctx: &Context) -> &Written<Self> {
        &ctx.written
    }

    fn runs_tag(&self) -> Tag {
        Tag::key(&self.namespace().unwrap_or_default(), &self.name_any())
    }

    /// A run of this namespace and key. A new run whose embedded spec disagrees
    /// with the Mutex never joins: intake fails it as InvalidParams.
    fn claims(&self, o: &ObservedRun<'_>, cfg: &RunConfig, known: bool) -> bool {
        let key = self.name_any();
        o.namespace == self.namespace().unwrap_or_default()
            && o.is_mutex()
            && cfg.keys.contains(&key)
            && (known || cfg.for_key(&key).spec_conflict(&self.spec).is_none())
    }

    async fn admits(&self, _: &Context, _: &str, _: &mut NamespaceLabels) -> Result<bool, Error> {
        Ok(true)
    }

    fn idle_delete_after(&self) -> Option<jiff::SignedDuration> {
        let ours =
            self.labels().get(writes::MANAGED_BY).map(String::as_str) == Some(writes::MANAGER);
        let days = self
            .spec
            .idle_delete_days
            .unwrap_or(DEFAULT_IDLE_DELETE_DAYS);
        // A frozen lock is kept: the freeze is a person's decision, and a new Mutex of the key
        // would grant at once (issue 37 item 8).
        let kept = self.spec.lock.frozen;
        (ours && days > 0 && !kept).then(|| jiff::SignedDuration::from_hours(24 * i64::from(days)))
    }

    fn qualify(&self, _: &str, _: &mut RunView) {}

    fn selects(&self) -> bool {
        self.spec.selector.is_some()
    }

    async fn recreate_for_waiters(ctx: &Context, gone: &Self) -> bool {
        let (ns, key) = (&gone.namespace().unwrap_or_default(), &gone.name_any());
        // An operator's delete is final: what comes back for the runs that name the key is the
        // plain Mutex they would create on demand (defaults, the key it stands for), never the
        // deleted object's selector, keyFrom, sequenceFrom, freeze or settings (issue 46 item 5).
        let plain = MutexSpec {
            key: gone.spec.key.clone(),
            ..MutexSpec::default()
        };
        match writes::ensure_mutex(ctx, ns, key, &plain).await {
            Ok(writes::Ensured::Created) => {
                info!(
                    key,
                    namespace = ns,
                    "created the Mutex again for the runs that wait for it"
                );
            }
            Ok(writes::Ensured::Existing(_)) => {}
            Err(e) if writes::lock_kind_uninstalled(&e) => return false,
            // Say a namespace being deleted: the next run event tries again.
            Err(e) => warn!(key, namespace = ns, error = %e, "could not create the Mutex again"),
        }
        true
    }
}

impl LockObject for ClusterMutex {
    fn api(client: &Client, _: &Scope) -> Api<Self> {
        Api::all(client.clone())
    }

    fn scope(&self) -> Scope {
        Scope::Cluster
    }

    fn written(ctx: &Context) -> &Written<Self> {
        &ctx.cluster_written
    }

    fn runs_tag(&self) -> Tag {
        Tag::cluster_mutex(&self.name_any())
    }

    fn claims(&self, o: &ObservedRun<'_>, _: &RunConfig, _: bool) -> bool {
        matches!(cluster_mutex_targets(o), Some(Ok(names)) if names.contains(&self.name_any()))
    }

    /// Intake fails a run of a namespace that is not allowed as Forbidden.
    async fn admits(
        &self,
        ctx: &Context,
        ns: &str,
        seen: &mut NamespaceLabels,
    ) -> Result<bool, Error> {
        cluster_admission::allowed(ctx, &self.spec, ns, seen).await
    }

    fn namespace_share(&self) -> Option<u32> {
        Some(self.spec.namespace_share())
    }

    fn priority_across_namespaces(&self) -> bool {
        self.spec.cross_namespace_priority
    }

    fn selects(&self) -> bool {
        self.spec.selector.is_some()
    }

    fn qualify(&self, ns: &str, v: &mut RunView) {
        let scope = Scope::Cluster;
        v.run.name = scope.status_name(ns, &v.run.name);
        if let Some(p) = v.parent.as_mut() {
            p.name = scope.status_name(ns, &p.name);
        }
        v.age.name = scope.status_name(ns, &v.age.name);
        v.group = self.spec.group(ns, &v.group);
    }

    /// Runs never create a ClusterMutex: an administrator does.
    async fn recreate_for_waiters(_: &Context, _: &Self) -> bool {
        true
    }
}
