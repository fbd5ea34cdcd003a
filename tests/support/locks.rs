//! The two kinds of lock, for tests of lock behaviour that run against both: a
//! Mutex of the test's namespace, or a ClusterMutex that allows it. Both are
//! served by one engine, and these tests keep it that way.

use super::TestNamespace;
use super::controller::ControllerProcess;
use super::pipelines::{Opts, mutex_status};
use anyhow::Result;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tekton_mutex::model::cluster_mutex::{ClusterMutex, ClusterMutexSpec};
use tekton_mutex::model::mutex::MutexStatus;
use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The tests of lock behaviour that hold for both kinds, once against a Mutex
/// and once against a ClusterMutex: one engine serves both.
#[macro_export]
macro_rules! for_both_kinds {
    ($($name:ident => $body:expr;)*) => {
        mod mutex {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs hack/cluster.sh up"]
                async fn $name() -> Result<()> {
                    ($body)(Kind::Mutex).await
                }
            )*
        }
        mod cluster_mutex {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs hack/cluster.sh up"]
                async fn $name() -> Result<()> {
                    ($body)(Kind::ClusterMutex).await
                }
            )*
        }
    };
}

/// A test with a cluster-wide controller runs alone in its binary: that
/// controller would also act on the other tests' namespaces.
static CLUSTER_WIDE: RwLock<()> = RwLock::const_new(());

/// Held by every test of a binary that may run a cluster-wide controller and
/// starts a namespace-scoped one of its own.
pub async fn shared() -> RwLockReadGuard<'static, ()> {
    CLUSTER_WIDE.read().await
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Mutex,
    ClusterMutex,
}

/// A test's lock: its kind, the controller serving it, and the ClusterMutex
/// it created (deleted when the test ends).
pub struct Lock {
    pub kind: Kind,
    namespace: String,
    cluster_mutex: Option<ClusterMutexGuard>,
    _controller: ControllerProcess,
    _alone: Option<RwLockWriteGuard<'static, ()>>,
    _shared: Option<RwLockReadGuard<'static, ()>>,
}

impl Lock {
    /// The lock of namespace `ns`, and a controller for it (cluster-wide for a ClusterMutex).
    pub async fn new(kind: Kind, ns: &TestNamespace) -> Result<Lock> {
        Lock::with_spec(kind, ns, json!({})).await
    }

    /// The same, with these lock settings (`capacity`, `order`, ...) in its spec.
    pub async fn with_spec(
        kind: Kind,
        ns: &TestNamespace,
        spec: serde_json::Value,
    ) -> Result<Lock> {
        // Taken before the controller starts, and held until it has stopped.
        let (_alone, _shared) = match kind {
            Kind::Mutex => (None, Some(shared().await)),
            Kind::ClusterMutex => (Some(CLUSTER_WIDE.write().await), None),
        };
        let mut lock = Lock {
            kind,
            namespace: ns.name().to_string(),
            cluster_mutex: None,
            _controller: match kind {
                Kind::Mutex => ControllerProcess::start(ns.name()).await?,
                Kind::ClusterMutex => ControllerProcess::start_cluster_wide(ns.name()).await?,
            },
            _alone,
            _shared,
        };
        match kind {
            Kind::Mutex if spec == json!({}) => {}
            Kind::Mutex => {
                let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
                    "metadata": {"name": ns.name()}, "spec": spec});
                ns.apply(&mutex.to_string()).await?;
            }
            Kind::ClusterMutex => {
                let api: kube::Api<ClusterMutex> = kube::Api::all(ns.client());
                let mut spec = spec;
                spec["namespaces"] = json!([ns.name()]);
                let spec: ClusterMutexSpec = serde_json::from_value(spec)?;
                api.create(&PostParams::default(), &ClusterMutex::new(ns.name(), spec))
                    .await?;
                lock.cluster_mutex = Some(ClusterMutexGuard(api, ns.name().to_string()));
            }
        }
        Ok(lock)
    }

    /// One more replica of the controller serving this lock.
    pub async fn second_replica(&self) -> Result<ControllerProcess> {
        match self.kind {
            Kind::Mutex => ControllerProcess::start(&self.namespace).await,
            Kind::ClusterMutex => ControllerProcess::start_cluster_wide(&self.namespace).await,
        }
    }

    /// `o`, with the lock task pointed at this lock.
    pub fn opts<'a>(&'a self, o: Opts<'a>) -> Opts<'a> {
        Opts {
            cluster_mutex: self.cluster_mutex.as_ref().map(|g| g.1.as_str()),
            ..o
        }
    }

    /// The lock's status (empty while it has none).
    pub async fn status(&self, ns: &TestNamespace) -> Result<MutexStatus> {
        match &self.cluster_mutex {
            None => mutex_status(ns, ns.name()).await,
            Some(g) => Ok(g.0.get(&g.1).await?.status.unwrap_or_default()),
        }
    }

    /// A lock task's `taskRef` to this lock (a Mutex's key is the namespace by default).
    pub fn task_ref(&self) -> serde_json::Value {
        let mut r = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
        if let Some(g) = &self.cluster_mutex {
            r["kind"] = json!("ClusterMutex");
            r["name"] = json!(g.1);
        }
        r
    }

    /// The lock object as kubectl names it: `mutex/NAME` or `clustermutex/NAME`.
    pub fn kubectl_ref(&self) -> String {
        match self.kind {
            Kind::Mutex => format!("mutex/{}", self.namespace),
            Kind::ClusterMutex => format!("clustermutex/{}", self.namespace),
        }
    }

    /// A run or PipelineRun of the test's namespace, as the lock's status names it.
    pub fn name_of(&self, name: &str) -> String {
        match self.kind {
            Kind::Mutex => name.to_string(),
            Kind::ClusterMutex => format!("{}/{name}", self.namespace),
        }
    }
}

/// Deletes the (cluster-scoped) ClusterMutex when the test ends, taking off its
/// finalizer first: the controller that would is stopped with the test.
pub struct ClusterMutexGuard(pub kube::Api<ClusterMutex>, pub String);

impl Drop for ClusterMutexGuard {
    fn drop(&mut self) {
        let (api, name) = (self.0.clone(), self.1.clone());
        let no_finalizers = json!({"metadata": {"finalizers": null}});
        tokio::spawn(async move {
            let merge = Patch::Merge(&no_finalizers);
            let _ = api.patch(&name, &PatchParams::default(), &merge).await;
            api.delete(&name, &Default::default()).await
        });
    }
}
