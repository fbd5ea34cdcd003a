//! What a lock kind is, said once for the engine (`LockObject`, which adds how the controller
//! reads, admits and writes one) and for `tkn mutex`: a Mutex and a ClusterMutex share one spec
//! (`LockSpec`) and one status (`MutexStatus`), and differ in scope. docs/design.md, "Adding a
//! lock kind", lists what a third kind needs beyond this.

use crate::cluster_mutex::ClusterMutex;
use crate::mutex::{LockSpec, Mutex, MutexStatus};
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

pub trait LockKind:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The resource, as URLs, metrics and RBAC name it.
    const PLURAL: &'static str;
    /// A cluster-scoped kind serves runs of many namespaces, and names them `namespace/name`.
    const CLUSTER_SCOPED: bool;
    /// The lock settings, for the decision core.
    fn lock_spec(&self) -> &LockSpec;
    /// The lock state, as the controller last wrote it.
    fn lock_status(&self) -> Option<&MutexStatus>;
    fn set_lock_status(&mut self, status: MutexStatus);
}

impl LockKind for Mutex {
    const PLURAL: &'static str = "mutexes";
    const CLUSTER_SCOPED: bool = false;

    fn lock_spec(&self) -> &LockSpec {
        &self.spec.lock
    }

    fn lock_status(&self) -> Option<&MutexStatus> {
        self.status.as_ref()
    }

    fn set_lock_status(&mut self, status: MutexStatus) {
        self.status = Some(status);
    }
}

impl LockKind for ClusterMutex {
    const PLURAL: &'static str = "clustermutexes";
    const CLUSTER_SCOPED: bool = true;

    fn lock_spec(&self) -> &LockSpec {
        &self.spec.lock
    }

    fn lock_status(&self) -> Option<&MutexStatus> {
        self.status.as_ref()
    }

    fn set_lock_status(&mut self, status: MutexStatus) {
        self.status = Some(status);
    }
}
