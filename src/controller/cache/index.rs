//! A cache's objects by tag (a run by its key or ClusterMutex and by its
//! PipelineRun, a Mutex by the PipelineRuns that hold it), so that an event finds the keys it concerns,
//! and a sync its key's runs, without scanning the cache.
//!
//! The index follows the watch: it is updated from each event right after the
//! reflector has stored it, before anyone hears of the change.

use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

/// What an object is found by: a namespace and a name of some kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Tag {
    /// The Mutex key a run belongs to.
    Key { namespace: String, key: String },
    /// A PipelineRun (by name) that a run belongs to, or that holds a Mutex.
    PipelineRun { namespace: String, name: String },
    /// The ClusterMutex a run refers to (cluster-scoped: no namespace).
    ClusterMutex { name: String },
}

impl Tag {
    pub fn key(namespace: &str, key: &str) -> Tag {
        Tag::Key {
            namespace: namespace.into(),
            key: key.into(),
        }
    }

    pub fn pipeline_run(namespace: &str, name: &str) -> Tag {
        Tag::PipelineRun {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    pub fn cluster_mutex(name: &str) -> Tag {
        Tag::ClusterMutex { name: name.into() }
    }
}

/// The objects of one cache by tag.
pub struct Index<K: Resource<DynamicType = ()> + 'static> {
    tags_of: fn(&K) -> Vec<Tag>,
    inner: Arc<RwLock<Inner<K>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Index<K> {
    fn clone(&self) -> Self {
        Index {
            tags_of: self.tags_of,
            inner: self.inner.clone(),
        }
    }
}

/// An object's reference, shared by its tags' sets (one allocation per object,
/// not one per tag), without the uid and resourceVersion that
/// `ObjectRef::from_obj` carries and that lookups ignore.
type SharedRef<K> = Arc<ObjectRef<K>>;

/// The objects of each tag. An object's tags are not kept beside it: they are
/// read again from its cached version, the one an event replaces.
struct Inner<K: Resource<DynamicType = ()> + 'static> {
    by_tag: HashMap<Tag, HashSet<SharedRef<K>>>,
}

impl<K: Resource<DynamicType = ()> + 'static> Default for Inner<K> {
    fn default() -> Self {
        Inner {
            by_tag: HashMap::new(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + 'static> Inner<K> {
    /// Moves `r` from the sets of its `old` tags to those of its `new` ones.
    fn retag(&mut self, r: ObjectRef<K>, old: Vec<Tag>, new: Vec<Tag>) {
        if old == new {
            return; // most events change nothing the index holds
        }
        for tag in old {
            if let Some(set) = self.by_tag.get_mut(&tag) {
                set.remove(&r);
                if set.is_empty() {
                    self.by_tag.remove(&tag);
                }
            }
        }
        shrink_when_sparse(&mut self.by_tag);
        let r = Arc::new(r);
        for tag in new {
            self.by_tag.entry(tag).or_default().insert(r.clone());
        }
    }
}

/// A map keeps the capacity of its busiest moment: after a burst of keys it would hold their
/// table for good. Once three quarters are empty, it gives back all but twice what it holds
/// (amortised: it must have grown by as much since).
fn shrink_when_sparse<V>(map: &mut std::collections::HashMap<Tag, V>) {
    if map.capacity() > 64 && map.len() < map.capacity() / 4 {
        map.shrink_to(map.len() * 2);
    }
}

fn compact_ref<K: Resource<DynamicType = ()>>(o: &K) -> ObjectRef<K> {
    let r = ObjectRef::new(&o.name_any());
    match o.namespace() {
        Some(ns) => r.within(&ns),
        None => r,
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Index<K> {
    pub fn new(tags_of: fn(&K) -> Vec<Tag>) -> Self {
        Index {
            tags_of,
            inner: Default::default(),
        }
    }

    /// Store one watch event in the cache `writer` writes, and follow it: an
    /// object leaves the tags of the version it replaces. A full list (re-list
    /// after a broken watch included) is read back from the cache: objects
    /// deleted meanwhile leave the index with it.
    pub fn apply(&self, writer: &mut Writer<K>, event: &watcher::Event<K>) {
        let store = writer.as_reader();
        let replaced = match event {
            watcher::Event::Apply(o) | watcher::Event::Delete(o) => store.get(&compact_ref(o)),
            _ => None,
        };
        writer.apply_watcher_event(event);
        let tags_of = |o: Option<&K>| o.map(self.tags_of).unwrap_or_default();
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(o) => inner.retag(
                compact_ref(o),
                tags_of(replaced.as_deref()),
                tags_of(Some(o)),
            ),
            watcher::Event::Delete(o) => {
                inner.retag(compact_ref(o), tags_of(replaced.as_deref()), Vec::new())
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                *inner = Inner::default();
                for o in store.state() {
                    inner.retag(compact_ref(o.as_ref()), Vec::new(), tags_of(Some(&o)));
                }
            }
        }
    }

    /// The cached objects with this tag.
    pub fn get(&self, tag: &Tag, store: &Store<K>) -> Vec<Arc<K>> {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        inner
            .by_tag
            .get(tag)
            .into_iter()
            .flatten()
            .filter_map(|r| store.get(r.as_ref()))
            .collect()
    }
}

/// A cache and its index, read together.
pub struct Indexed<K: Resource<DynamicType = ()> + 'static> {
    pub store: Store<K>,
    pub index: Index<K>,
}

impl<K: Resource<DynamicType = ()> + 'static> Clone for Indexed<K> {
    fn clone(&self) -> Self {
        Indexed {
            store: self.store.clone(),
            index: self.index.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Indexed<K> {
    pub fn get(&self, tag: &Tag) -> Vec<Arc<K>> {
        self.index.get(tag, &self.store)
    }
}

/// A namespaced object's namespace, as tags want it.
pub fn namespace_of<K: Resource>(o: &K) -> String {
    o.namespace().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tekton::customrun::CustomRun;

    fn run(name: &str, key: &str) -> CustomRun {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tekton.dev/v1beta1",
            "kind": "CustomRun",
            "metadata": {"name": name, "namespace": "ns", "labels": {"key": key}},
            "spec": {},
        }))
        .unwrap()
    }

    fn by_label(r: &CustomRun) -> Vec<Tag> {
        r.labels()
            .get("key")
            .map(|k| Tag::key("ns", k))
            .into_iter()
            .collect()
    }

    fn names(v: Vec<Arc<CustomRun>>) -> Vec<String> {
        let mut n: Vec<String> = v.iter().map(|r| r.name_any()).collect();
        n.sort();
        n
    }

    #[test]
    fn follows_applies_deletes_retags_and_relists() {
        let mut writer = Writer::<CustomRun>::default();
        let store = writer.as_reader();
        let index = Index::new(by_label);
        let mut apply = |e: watcher::Event<CustomRun>| index.apply(&mut writer, &e);
        apply(watcher::Event::Apply(run("a", "k1")));
        apply(watcher::Event::Apply(run("b", "k1")));
        apply(watcher::Event::Apply(run("c", "k2")));
        let k1 = Tag::key("ns", "k1");
        assert_eq!(names(index.get(&k1, &store)), ["a", "b"]);
        apply(watcher::Event::Apply(run("b", "k2")));
        assert_eq!(names(index.get(&k1, &store)), ["a"]);
        assert_eq!(names(index.get(&Tag::key("ns", "k2"), &store)), ["b", "c"]);
        apply(watcher::Event::Delete(run("a", "k1")));
        assert!(index.get(&k1, &store).is_empty());
        // A re-list that no longer has c: c goes from the index too.
        apply(watcher::Event::Init);
        apply(watcher::Event::InitApply(run("b", "k2")));
        apply(watcher::Event::InitApply(run("d", "k1")));
        apply(watcher::Event::InitDone);
        assert_eq!(names(index.get(&Tag::key("ns", "k2"), &store)), ["b"]);
        assert_eq!(names(index.get(&k1, &store)), ["d"]);
    }
}
