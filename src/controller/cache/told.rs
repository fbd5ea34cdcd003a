//! What this controller has just written, until its cache shows it: run
//! statuses ([`Told`]) and lock statuses, of a Mutex or a ClusterMutex ([`Written`]).
//!
//! A sync woken before the cache has our own last patch of a run would patch it
//! again from the old version: a write the API server refuses (409, the patch is
//! a compare-and-swap) and that costs as much as one it accepts. The patch's own
//! watch event wakes the key again once the cache has it.
//!
//! Likewise a sync woken by a run's change (whose event is small and quick)
//! before the cache has our last write of a long Mutex status would decide on
//! the old status and be refused; it decides on the status we wrote instead.

use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Beyond this many runs patched and not yet seen back, the memo starts over
/// (it only saves writes; forgetting costs at most one refused patch each).
const LIMIT: usize = 10_000;

#[derive(Default)]
pub struct Told {
    /// Run uid -> the resourceVersion our last patch of it was made against.
    patched_from: Mutex<HashMap<String, String>>,
}

impl Told {
    /// Was the run patched from exactly this version (so the cache has not caught up)?
    pub fn pending(&self, uid: &str, resource_version: Option<&str>) -> bool {
        let mut m = self.patched_from.lock().unwrap_or_else(|e| e.into_inner());
        match (m.get(uid), resource_version) {
            (Some(from), Some(rv)) if from == rv => true,
            (Some(_), _) => {
                m.remove(uid);
                false
            }
            _ => false,
        }
    }

    pub fn patched(&self, uid: &str, from: Option<&str>) {
        let Some(rv) = from else { return };
        let mut m = self.patched_from.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= LIMIT {
            m.clear();
        }
        m.insert(uid.to_string(), rv.to_string());
    }
}

/// A lock object by namespace ("" if cluster-scoped) and name.
type LockId = (String, String);

/// The lock objects whose status we wrote: the version the write replaced, and
/// the object the API server returned.
pub struct Written<L> {
    locks: Mutex<HashMap<LockId, (String, Arc<L>)>>,
}

impl<L> Default for Written<L> {
    fn default() -> Self {
        Written {
            locks: Mutex::default(),
        }
    }
}

impl<L: kube::Resource> Written<L> {
    /// The lock object to decide on: ours if the cache still shows the version our
    /// write replaced (a cache only moves forward: any other version has seen
    /// our write, or a later one), else the cache's.
    pub fn newest(&self, cached: Arc<L>) -> Arc<L> {
        let id = (cached.namespace().unwrap_or_default(), cached.name_any());
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(&id) {
            Some((from, ours)) if Some(from) == cached.resource_version().as_ref() => ours.clone(),
            Some(_) => {
                m.remove(&id);
                cached
            }
            None => cached,
        }
    }

    /// Our write replaced version `from` of this lock object with `written`.
    pub fn wrote(&self, from: Option<String>, written: L) {
        let Some(from) = from else { return };
        let id = (written.namespace().unwrap_or_default(), written.name_any());
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= LIMIT {
            m.clear();
        }
        m.insert(id, (from, Arc::new(written)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::mutex::Mutex as MutexObject;

    fn mutex_at(version: &str, last_token: i64) -> MutexObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
            "metadata": {"name": "k", "namespace": "ns", "resourceVersion": version},
            "spec": {}, "status": {"lastToken": last_token},
        }))
        .unwrap()
    }

    fn token(m: &MutexObject) -> i64 {
        m.status.as_ref().unwrap().last_token
    }

    #[test]
    fn a_written_mutex_stands_in_for_the_cache_until_the_cache_moves() {
        let w = Written::default();
        let old = Arc::new(mutex_at("5", 1));
        assert_eq!(token(&w.newest(old.clone())), 1, "nothing written yet");
        w.wrote(Some("5".into()), mutex_at("6", 2));
        assert_eq!(token(&w.newest(old.clone())), 2, "the cache still shows 5");
        let moved = Arc::new(mutex_at("7", 3));
        assert_eq!(token(&w.newest(moved)), 3, "the cache moved past our write");
        assert_eq!(token(&w.newest(old)), 1, "forgotten once the cache moved");
    }

    #[test]
    fn a_patch_is_pending_until_the_cache_shows_another_version() {
        let t = Told::default();
        assert!(!t.pending("u", Some("5")));
        t.patched("u", Some("5"));
        assert!(
            t.pending("u", Some("5")),
            "the cache still shows the old version"
        );
        assert!(!t.pending("u", Some("6")), "the cache has caught up");
        assert!(!t.pending("u", Some("5")), "forgotten once caught up");
    }
}
