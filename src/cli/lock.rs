//! The lock a command acts on: a Mutex of the namespace, or with `--cluster`
//! a ClusterMutex. Both kinds share one spec (`LockSpec`) and one status, and
//! the controller treats a request on either alike, so every command works on
//! both through this one seam.

use super::target::{Failure, Result, Target, Wait, api_failure};
use crate::model::cluster_mutex::{ClusterMutex, unqualify};
use crate::model::lock_kind::LockKind;
use crate::model::mutex::{LockSpec, Mutex, MutexStatus};
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::fmt::Debug;

/// A Mutex or a ClusterMutex, as read.
#[derive(Clone, Debug)]
pub enum Lock {
    Mutex(Mutex),
    Cluster(ClusterMutex),
}

/// `$body` with `$k` bound to the object, whichever kind it is: every accessor below reads it
/// through `LockKind`, the one definition of a lock kind the engine uses too.
macro_rules! each_kind {
    ($lock:expr, $k:ident => $body:expr) => {
        match $lock {
            Lock::Mutex($k) => $body,
            Lock::Cluster($k) => $body,
        }
    };
}

impl Lock {
    pub fn name(&self) -> String {
        each_kind!(self, k => k.name_any())
    }

    /// The namespace of a Mutex; None for a ClusterMutex.
    pub fn namespace(&self) -> Option<String> {
        each_kind!(self, k => k.namespace())
    }

    pub fn spec(&self) -> &LockSpec {
        each_kind!(self, k => k.lock_spec())
    }

    /// The status, empty while the controller has written none.
    pub fn status(&self) -> MutexStatus {
        each_kind!(self, k => k.lock_status())
            .cloned()
            .unwrap_or_default()
    }

    /// The object for `-o json|yaml`, without `metadata.managedFields`: kubectl
    /// hides them too, and they are noise to a script.
    pub fn object(&self) -> serde_json::Result<Value> {
        let mut v = each_kind!(self, k => serde_json::to_value(k))?;
        if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("managedFields");
        }
        Ok(v)
    }

    pub fn has_status(&self) -> bool {
        each_kind!(self, k => k.lock_status().is_some())
    }
}

/// Where a PipelineRun named in a lock's status lives: a ClusterMutex names
/// runs `namespace/name`, a Mutex by name within its namespace.
pub fn locate<'a>(target: &'a Target, status_name: &'a str) -> (&'a str, &'a str) {
    match target.cluster {
        true => unqualify(status_name).unwrap_or((target.namespace.as_str(), status_name)),
        false => (target.namespace.as_str(), status_name),
    }
}

/// The entry of `names` (as a lock's status writes them) that `given` means:
/// itself, or on a ClusterMutex a run of the command's namespace by its short name.
pub fn resolve(target: &Target, names: &[String], given: &str) -> Option<String> {
    if names.iter().any(|n| n == given) {
        return Some(given.to_string());
    }
    let qualified = crate::model::cluster_mutex::qualify(&target.namespace, given);
    (target.cluster && names.contains(&qualified)).then_some(qualified)
}

/// [`resolve`], or a Failure saying `missing` with the names there are listed.
pub fn one_of(
    target: &Target,
    names: &[String],
    given: &str,
    missing: impl FnOnce(&str) -> String,
) -> Result<String> {
    resolve(target, names, given).ok_or_else(|| {
        let listed = if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        };
        Failure(missing(&listed))
    })
}

impl Target {
    /// `Mutex staging` or `ClusterMutex prod-db`, for messages.
    pub fn describe_lock(&self, name: &str) -> String {
        format!("{} {name}", self.kind())
    }

    pub fn kind(&self) -> String {
        match self.cluster {
            true => kind_name::<ClusterMutex>(),
            false => kind_name::<Mutex>(),
        }
    }

    /// How kubectl names the lock, for the hints in messages.
    pub fn kubectl_ref(&self, name: &str) -> String {
        match self.cluster {
            true => format!("{} {name}", kind_name::<ClusterMutex>().to_lowercase()),
            false => format!(
                "{} {name} -n {}",
                kind_name::<Mutex>().to_lowercase(),
                self.namespace
            ),
        }
    }

    /// The lock of that name, or a clear error naming where it was looked for.
    pub async fn lock(&self, name: &str) -> Result<Lock> {
        let read = |e| api_failure(self, &format!("read {}", self.describe_lock(name)), e);
        let found = match self.cluster {
            true => self
                .clusters()
                .get_opt(name)
                .await
                .map_err(read)?
                .map(Lock::Cluster),
            false => self
                .mutexes()
                .get_opt(name)
                .await
                .map_err(read)?
                .map(Lock::Mutex),
        };
        found.ok_or_else(|| match self.cluster {
            true => Failure(format!(
                "no ClusterMutex {name:?}: see `tkn mutex list --cluster`"
            )),
            false => Failure(format!(
                "no Mutex {name:?} in namespace {ns}: see `tkn mutex list -n {ns}` \
                 (a ClusterMutex? add --cluster)",
                ns = self.namespace
            )),
        })
    }

    /// A merge patch of the lock, as the user: refused with a clear message if RBAC says no.
    pub async fn patch_lock(&self, name: &str, patch: &Value, what: &str) -> Result<()> {
        let failed = |e| {
            let doing = format!(
                "{what} on {} (patch the {})",
                self.describe_lock(name),
                self.kind()
            );
            api_failure(self, &doing, e)
        };
        let (params, merge) = (PatchParams::default(), Patch::Merge(patch));
        match self.cluster {
            true => self.clusters().patch(name, &params, &merge).await.map(drop),
            false => self.mutexes().patch(name, &params, &merge).await.map(drop),
        }
        .map_err(failed)
    }

    /// Watch the lock until `done` holds, at most `wait`.
    pub async fn await_lock(
        &self,
        name: &str,
        done: impl Fn(Option<&Lock>) -> bool + Send + 'static,
        wait: Wait,
    ) -> std::result::Result<Option<Lock>, String> {
        let watched = match self.cluster {
            true => watch(self.clusters(), name, Lock::Cluster, done, wait).await,
            false => watch(self.mutexes(), name, Lock::Mutex, done, wait).await,
        };
        watched.map_err(|e| match e {
            Watch::Failed(e) => format!("could not watch {}: {e}", self.describe_lock(name)),
            Watch::TimedOut => format!(
                "the controller did not acknowledge the request within {}: is tekton-mutex running and serving {}?",
                wait.text(),
                match self.cluster {
                    true => "ClusterMutexes (the cluster-wide install)".to_string(),
                    false => format!("namespace {}", self.namespace),
                }
            ),
        })
    }
}

/// A kind's name, as the API and messages say it (`Mutex`, `ClusterMutex`).
fn kind_name<K: LockKind>() -> String {
    K::kind(&()).into_owned()
}

enum Watch {
    Failed(kube::runtime::wait::Error),
    TimedOut,
}

async fn watch<K>(
    api: Api<K>,
    name: &str,
    wrap: fn(K) -> Lock,
    done: impl Fn(Option<&Lock>) -> bool + Send + 'static,
    wait: Wait,
) -> std::result::Result<Option<Lock>, Watch>
where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
{
    let seen = move |k: Option<&K>| done(k.cloned().map(wrap).as_ref());
    match tokio::time::timeout(wait.duration(), await_condition(api, name, seen)).await {
        Ok(Ok(k)) => Ok(k.map(wrap)),
        Ok(Err(e)) => Err(Watch::Failed(e)),
        Err(_) => Err(Watch::TimedOut),
    }
}
