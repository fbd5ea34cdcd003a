//! The seam between the one lock engine (`reconcile::lock`) and the two kinds of
//! lock object. A Mutex is one key of one namespace; a ClusterMutex is
//! shared by the namespaces an administrator allows. Everything else (the
//! finalizer, the token floor, queue control, the pending-write memo, Events)
//! is the engine's, so both kinds have it by construction. What a kind is (its
//! spec, status, plural and scope) is `LockKind`, shared with `tkn mutex`.

use crate::controller::cache::index::Tag;
use crate::controller::cache::told::Written;
use crate::controller::context::{Context, Error};
use crate::core::model::RunView;
use crate::core::observe::ObservedRun;
use crate::core::params::RunConfig;
use crate::core::scope::Scope;
pub use crate::model::lock_kind::LockKind;
use kube::{Api, Client};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;

/// Namespace labels read during one sync (only when a selector needs them).
pub type NamespaceLabels = HashMap<String, BTreeMap<String, String>>;

/// A lock object: how the engine reads, writes and names one.
pub trait LockObject: LockKind {
    /// This kind's API where an object of `scope` lives.
    fn api(client: &Client, scope: &Scope) -> Api<Self>;
    fn scope(&self) -> Scope;
    /// The statuses of this kind we wrote and the cache may not show yet.
    fn written(ctx: &Context) -> &Written<Self>;
    /// The index tag under which the caches keep this lock's runs.
    fn runs_tag(&self) -> Tag;
    /// Is this live run, as read, one of this lock's? `known`: the status names it.
    fn claims(&self, o: &ObservedRun<'_>, cfg: &RunConfig, known: bool) -> bool;
    /// May a run of namespace `ns` join now? `seen` memoises namespace labels in one sync.
    fn admits(
        &self,
        ctx: &Context,
        ns: &str,
        seen: &mut NamespaceLabels,
    ) -> impl Future<Output = Result<bool, Error>> + Send;
    /// The share of the queue one namespace may fill (a ClusterMutex's tenants).
    fn namespace_share(&self) -> Option<u32> {
        None
    }
    /// Does it take PipelineRuns by `spec.selector`?
    fn selects(&self) -> bool;
    /// Does `priority` order runs across namespaces (a ClusterMutex that allows it)?
    fn priority_across_namespaces(&self) -> bool {
        false
    }
    /// How long this lock may stay idle before the controller deletes it: only
    /// for one the controller created itself (see `reconcile::idle_deletion`).
    fn idle_delete_after(&self) -> Option<jiff::SignedDuration> {
        None
    }
    /// Names and group of a run of namespace `ns`, as this lock's status writes them.
    fn qualify(&self, ns: &str, view: &mut RunView);
    /// After an emptied object marked for deletion went: give the runs it kept
    /// out a new one, when runs may create one. False when none can be created any more
    /// (the kind's CustomResourceDefinition is being deleted: the README's uninstall).
    fn recreate_for_waiters(ctx: &Context, gone: &Self) -> impl Future<Output = bool> + Send;
}
