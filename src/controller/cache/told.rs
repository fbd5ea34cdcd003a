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
//!
//! Both memos go by resourceVersion, which only identifies a version while the watch history
//! holds: an etcd restore brings objects back to versions we wrote from before. So every
//! memo is also bound to the count of [`HistoryBreaks`] (a watch that failed or listed again),
//! and one made before the last break is void.

use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Beyond this many runs patched and not yet seen back, the memo starts over
/// (it only saves writes; forgetting costs at most one refused patch each).
const LIMIT: usize = 10_000;

/// How many times a watch failed or listed again: each time, the history of resourceVersions
/// may have broken (an etcd restore, a compaction), and a memo made before it is void.
#[derive(Clone, Debug, Default)]
pub struct HistoryBreaks(Arc<AtomicU64>);

impl HistoryBreaks {
    pub fn broke(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Run uid -> what our last patch of it said and the resourceVersion it was made against.
#[derive(Default)]
pub struct Told {
    patched_from: Mutex<HashMap<String, Patched>>,
    breaks: HistoryBreaks,
}

struct Patched {
    breaks: u64,
    resource_version: String,
    /// The outcome the patch told, in words (`{outcome:?}`): the same version with another
    /// outcome is no patch of ours in flight.
    said: String,
    at: Instant,
}

impl Told {
    pub fn new(breaks: HistoryBreaks) -> Self {
        let patched_from = Default::default();
        Told {
            patched_from,
            breaks,
        }
    }

    /// Was the run patched from exactly this version, with this outcome, within [`MAX_AGE`]
    /// (so the cache has not caught up)? A resourceVersion alone is not enough: an etcd
    /// restore brings a run back to a version we patched before (with a grant the restore
    /// undid), and a memo of that patch must not keep the new grant from being told.
    pub fn pending(&self, uid: &str, resource_version: Option<&str>, said: &str) -> bool {
        self.pending_at(uid, resource_version, said, Instant::now())
    }

    fn pending_at(&self, uid: &str, rv: Option<&str>, said: &str, now: Instant) -> bool {
        let breaks = self.breaks.count();
        let mut m = self.patched_from.lock().unwrap_or_else(|e| e.into_inner());
        match (m.get(uid), rv) {
            (Some(p), Some(rv))
                if p.resource_version == rv
                    && p.said == said
                    && p.breaks == breaks
                    && now.duration_since(p.at) < MAX_AGE =>
            {
                true
            }
            (Some(_), _) => {
                m.remove(uid);
                false
            }
            _ => false,
        }
    }

    pub fn patched(&self, uid: &str, from: Option<&str>, said: &str) {
        self.patched_at(uid, from, said, Instant::now());
    }

    fn patched_at(&self, uid: &str, from: Option<&str>, said: &str, at: Instant) {
        let Some(rv) = from else { return };
        let mut m = self.patched_from.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= LIMIT {
            m.clear();
        }
        let (resource_version, said) = (rv.to_string(), said.to_string());
        let breaks = self.breaks.count();
        let patched = Patched {
            breaks,
            resource_version,
            said,
            at,
        };
        m.insert(uid.to_string(), patched);
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
    breaks: HistoryBreaks,
}

/// The version our write replaced, the object it returned, when, and the history's breaks then.
type Wrote<L> = (String, Arc<L>, Instant, u64);

struct Memo<L> {
    entries: HashMap<LockId, Wrote<L>>,
    swept: Instant,
}

impl<L> Default for Written<L> {
    fn default() -> Self {
        Written::new(HistoryBreaks::default())
    }
}

impl<L> Written<L> {
    pub fn new(breaks: HistoryBreaks) -> Self {
        let memo = Memo {
            entries: HashMap::new(),
            swept: Instant::now(),
        };
        Written {
            locks: Mutex::new(memo),
            breaks,
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
            .retain(|_, (_, _, at, _)| now.duration_since(*at) < MAX_AGE);
        self.entries.shrink_to_fit();
    }
}

impl<L: kube::Resource> Written<L> {
    /// The lock object to decide on: ours if the cache still shows the version our
    /// write replaced (a cache only moves forward: any other version has seen
    /// our write, or a later one), else the cache's.
    pub fn newest(&self, cached: Arc<L>) -> Arc<L> {
        let id = (cached.namespace().unwrap_or_default(), cached.name_any());
        let breaks = self.breaks.count();
        let mut m = self.locks.lock().unwrap_or_else(|e| e.into_inner());
        match m.entries.get(&id) {
            Some((from, ours, _, at_breaks))
                if Some(from) == cached.resource_version().as_ref() && *at_breaks == breaks =>
            {
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
        let breaks = self.breaks.count();
        m.entries.insert(id, (from, Arc::new(written), now, breaks));
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
    fn a_patch_is_in_flight_only_for_its_version_its_outcome_and_a_while() {
        let told = Told::default();
        let t0 = Instant::now();
        told.patched_at("u", Some("7"), "Acquired { token: 1 }", t0);
        assert!(told.pending_at("u", Some("7"), "Acquired { token: 1 }", t0));
        // An etcd restore brought the run back to version 7, and the lock granted it again.
        assert!(!told.pending_at("u", Some("7"), "Acquired { token: 2 }", t0));
        told.patched_at("u", Some("7"), "Acquired { token: 2 }", t0);
        assert!(!told.pending_at("u", Some("8"), "Acquired { token: 2 }", t0));
        told.patched_at("u", Some("8"), "Waiting", t0);
        let late = t0 + MAX_AGE;
        assert!(
            !told.pending_at("u", Some("8"), "Waiting", late),
            "a memo too old to trust"
        );
    }

    #[test]
    fn a_memo_made_before_the_watch_history_broke_is_void() {
        let breaks = HistoryBreaks::default();
        let (told, written) = (Told::new(breaks.clone()), Written::new(breaks.clone()));
        told.patched("u", Some("7"), "Waiting");
        written.wrote(Some("5".into()), mutex_at("6", 2));
        assert!(told.pending("u", Some("7"), "Waiting"));
        assert_eq!(token(&written.newest(Arc::new(mutex_at("5", 1)))), 2);
        breaks.broke(); // an etcd restore: version 5 and 7 are back, with what they held then
        assert!(!told.pending("u", Some("7"), "Waiting"));
        assert_eq!(token(&written.newest(Arc::new(mutex_at("5", 1)))), 1);
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
        assert!(!t.pending("u", Some("5"), "Waiting"));
        t.patched("u", Some("5"), "Waiting");
        assert!(
            t.pending("u", Some("5"), "Waiting"),
            "the cache still shows the old version"
        );
        assert!(
            !t.pending("u", Some("6"), "Waiting"),
            "the cache has caught up"
        );
        assert!(
            !t.pending("u", Some("5"), "Waiting"),
            "forgotten once caught up"
        );
    }
}
