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
use std::time::{Duration, Instant};

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

/// A watch event arrives within seconds; a memo older than this stands for a
/// lock that was deleted, or never synced again, and only holds memory.
const MAX_AGE: Duration = Duration::from_secs(60);

/// The lock objects whose status we wrote: the version the write replaced, the
/// object the API server returned, and when.
pub struct Written<L> {
    locks: Mutex<Memo<L>>,
}

struct Memo<L> {
    entries: HashMap<LockId, (String, Arc<L>, Instant)>,
    swept: Instant,
}

impl<L> Default for Written<L> {
    fn default() -> Self {
        Written {
            locks: Mutex::new(Memo {
                entries: HashMap::new(),
                swept: Instant::now(),
            }),
        }
    }
}

impl<L> Memo<L> {
    /// Forget the entries older than [`MAX_AGE`], at most once per [`MAX_AGE`]
    /// (a burst of 10,000 keys would otherwise keep 10,000 lock objects).
    fn sweep(&mut self, now: Instant) {
        if now.duration_since(self.swept) < MAX_AGE {
            return;
        }
        self.swept = now;
        self.entries
            .retain(|_, (_, _, at)| now.duration_since(*at) < MAX_AGE);
        self.entries.shrink_to_fit();
    }
}

impl<L: kube::Resource> Written<L> {
    /// The lock object to decide on: ours if the cache still shows the version our
    /// write replaced (a cache only moves forward: any other version has seen
    /// our write, or a later one), else the cache's.
    pub fn newest(&self, cached: Arc<L>) -> Arc<L> {
        let id = (cached.namespace().unwrap_or_default(), cached.name_any());
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        match m.entries.get(&id) {
            Some((from, ours, _)) if Some(from) == cached.resource_version().as_ref() => {
                ours.clone()
            }
            Some(_) => {
                m.entries.remove(&id);
                cached
            }
            None => cached,
        }
    }

    /// Our write replaced version `from` of this lock object with `written`.
    pub fn wrote(&self, from: Option<String>, written: L) {
        self.wrote_at(from, written, Instant::now());
    }

    fn wrote_at(&self, from: Option<String>, mut written: L, now: Instant) {
        let Some(from) = from else { return };
        // The cache strips them too; they are most of a small object.
        written.meta_mut().managed_fields = None;
        let id = (written.namespace().unwrap_or_default(), written.name_any());
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        m.sweep(now);
        if m.entries.len() >= LIMIT {
            m.entries.clear();
        }
        m.entries.insert(id, (from, Arc::new(written), now));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
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

    fn named(name: &str, version: &str) -> MutexObject {
        let mut m = mutex_at(version, 1);
        m.metadata.name = Some(name.into());
        m
    }

    #[test]
    fn a_memo_older_than_a_minute_is_forgotten_at_the_next_write() {
        let w = Written::default();
        let t0 = Instant::now();
        w.wrote_at(Some("1".into()), named("gone", "2"), t0);
        w.wrote_at(Some("1".into()), named("busy", "2"), t0 + MAX_AGE / 2);
        assert_eq!(w.len(), 2, "both are young");
        w.wrote_at(Some("3".into()), named("new", "4"), t0 + MAX_AGE);
        assert_eq!(w.len(), 2, "the lock written a minute ago is forgotten");
        let cached = Arc::new(named("busy", "1"));
        assert_eq!(
            w.newest(cached).resource_version().as_deref(),
            Some("2"),
            "a younger memo still stands in for the cache"
        );
    }

    #[test]
    fn a_memo_keeps_no_managed_fields() {
        let w = Written::default();
        let mut m = mutex_at("6", 2);
        m.metadata.managed_fields = Some(vec![Default::default()]);
        w.wrote(Some("5".into()), m);
        let ours = w.newest(Arc::new(mutex_at("5", 1)));
        assert_eq!(ours.metadata.managed_fields, None);
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
