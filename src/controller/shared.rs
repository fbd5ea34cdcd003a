//! One watch per kind, shared by every controller that needs it: its cache is
//! written before anyone hears of a change.
//!
//! The key's sync reads the runs from a cache and is woken by their changes. Were
//! the wake-up to come from a second watch of the same kind, it could arrive before
//! the cache had the change: the sync would decide on the old runs, and nothing
//! would wake the key again until a timeout. Here every consumer hears of an object
//! from the reflector that stored it, after it stored it (deletions included).

use futures::channel::mpsc::{self, UnboundedReceiver, UnboundedSender};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::{self, Lookup, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use tracing::warn;

/// A kind's cache, and one stream of changed objects per consumer.
pub struct SharedWatch<K: Lookup + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq,
{
    pub store: Store<K>,
    pub changes: Vec<UnboundedReceiver<Arc<K>>>,
}

/// Watch `api` once, strip each object with `strip` before it is cached, and
/// hand every changed object (applied or deleted) to `consumers` streams.
/// The watch runs in a task of its own until every consumer has gone.
pub fn watch<K>(
    api: kube::Api<K>,
    wc: watcher::Config,
    strip: fn(&mut K),
    consumers: usize,
) -> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, wc).default_backoff().modify(strip);
    let (senders, changes) = (0..consumers).map(|_| mpsc::unbounded()).unzip();
    tokio::spawn(fan_out(reflector::reflector(writer, events), senders));
    SharedWatch { store, changes }
}

/// Forward each object the reflector has stored to every consumer. The reflector
/// yields an event only after writing it to the store, so a consumer that reads
/// the store on hearing of an object finds that object's version, or a newer one.
async fn fan_out<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    senders: Vec<UnboundedSender<Arc<K>>>,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let mut objects = std::pin::pin!(events.touched_objects());
    while let Some(object) = objects.next().await {
        match object {
            Ok(o) => {
                let o = Arc::new(o);
                let delivered = senders
                    .iter()
                    .filter(|s| s.unbounded_send(o.clone()).is_ok());
                if delivered.count() == 0 {
                    return;
                }
            }
            // The watcher backs off and resumes on its own.
            Err(e) => warn!(kind = K::kind(&()).as_ref(), error = %e, "watch failed; retrying"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tekton::customrun::CustomRun;
    use kube::runtime::reflector::ObjectRef;

    fn run(name: &str, version: &str) -> CustomRun {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tekton.dev/v1beta1",
            "kind": "CustomRun",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "spec": {},
        }))
        .unwrap()
    }

    fn cached_version(store: &Store<CustomRun>, name: &str) -> Option<String> {
        store
            .get(&ObjectRef::new(name).within("ns"))
            .and_then(|r| r.metadata.resource_version.clone())
    }

    /// The lost handover: a consumer woken by a change must find that change in
    /// the cache. Each event is let through alone, and each consumer checks the
    /// cache as it hears of it.
    #[tokio::test(flavor = "current_thread")]
    async fn every_consumer_hears_of_a_change_after_the_cache_has_it() {
        let (store, writer) = reflector::store::<CustomRun>();
        let (source, events) = mpsc::unbounded();
        let (senders, mut changes): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::unbounded()).unzip();
        tokio::spawn(fan_out(reflector::reflector(writer, events), senders));
        let send = |e| source.unbounded_send(Ok(e)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(run("a", "1")));
        send(watcher::Event::InitDone);
        for c in &mut changes {
            let heard = c.next().await.unwrap();
            assert_eq!(heard.metadata.resource_version.as_deref(), Some("1"));
            assert_eq!(cached_version(&store, "a").as_deref(), Some("1"));
        }
        for version in ["2", "3"] {
            send(watcher::Event::Apply(run("a", version)));
            for c in &mut changes {
                let heard = c.next().await.unwrap();
                assert_eq!(heard.metadata.resource_version.as_deref(), Some(version));
                assert_eq!(cached_version(&store, "a").as_deref(), Some(version));
            }
        }
        // A deletion wakes the consumers too, once the cache has let the object go.
        send(watcher::Event::Delete(run("a", "4")));
        for c in &mut changes {
            assert_eq!(c.next().await.unwrap().metadata.name.as_deref(), Some("a"));
            assert_eq!(cached_version(&store, "a"), None);
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_watch_ends_once_every_consumer_has_gone() {
        let (_store, writer) = reflector::store::<CustomRun>();
        let (source, events) = mpsc::unbounded();
        let (senders, changes): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::unbounded()).unzip();
        let task = tokio::spawn(fan_out(reflector::reflector(writer, events), senders));
        drop(changes);
        source
            .unbounded_send(Ok(watcher::Event::Apply(run("a", "1"))))
            .unwrap();
        task.await.unwrap();
    }
}
