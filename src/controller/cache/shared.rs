//! One watch per kind, shared by every controller that needs it: its cache is
//! written before anyone hears of a change.
//!
//! The key's sync reads the runs from a cache and is woken by their changes. Were
//! the wake-up to come from a second watch of the same kind, it could arrive before
//! the cache had the change: the sync would decide on the old runs, and nothing
//! would wake the key again until a timeout. Here every consumer hears of an object
//! from the reflector that stored it, after it stored it (deletions included).

use crate::controller::cache::index::{Index, Indexed};
use crate::controller::cache::told::HistoryBreaks;
use futures::channel::mpsc::{self, UnboundedReceiver, UnboundedSender};
use futures::{Stream, StreamExt};
use kube::Resource;
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::sync::Arc;
use tracing::warn;

/// A kind's indexed cache, and one stream of changed objects per consumer.
pub struct SharedWatch<K: Resource<DynamicType = ()> + 'static> {
    pub cache: Indexed<K>,
    pub changes: Vec<UnboundedReceiver<Arc<K>>>,
    /// Turns true once the cache holds its first full list.
    pub listed: Listed,
}

/// Whether a cache holds its first full list. Unlike `Store::wait_until_ready`
/// (kube-runtime 5 keeps one waker per store, so of several tasks waiting at
/// once only the last is woken), any number of tasks may wait on it.
pub type Listed = tokio::sync::watch::Receiver<bool>;

/// Wait until every cache holds its first full list.
pub async fn all_listed(listed: &[Listed]) {
    for l in listed {
        // A closed sender means the watch is gone; there is nothing to wait for.
        let _ = l.clone().wait_for(|done| *done).await;
    }
}

/// Watch `api` once, strip each object with `strip` before it is cached, index
/// it, and hand every changed object (applied or deleted) to `consumers` streams.
/// The watch runs in a task of its own until every consumer has gone.
pub fn watch<K>(
    api: kube::Api<K>,
    wc: watcher::Config,
    strip: fn(&mut K),
    index: Index<K>,
    consumers: usize,
    breaks: HistoryBreaks,
) -> SharedWatch<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let (store, writer) = reflector::store();
    // A failed watch, or a new list, may follow a break in the resourceVersions' history.
    let events = watcher(api, wc)
        .default_backoff()
        .modify(strip)
        .inspect(move |e| {
            if matches!(e, Err(_) | Ok(watcher::Event::Init)) {
                breaks.broke();
            }
        });
    let (senders, changes) = (0..consumers).map(|_| mpsc::unbounded()).unzip();
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    tokio::spawn(fan_out(events, writer, index.clone(), senders, listed_tx));
    SharedWatch {
        cache: Indexed { store, index },
        changes,
        listed,
    }
}

/// Store and index each event, then tell every consumer of the objects it
/// changed. A consumer that reads the cache on hearing of an object finds that
/// object's version or a newer one. Objects of a full list are told once the
/// list is complete: until then the cache still shows the previous one.
async fn fan_out<K>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
    mut writer: Writer<K>,
    index: Index<K>,
    senders: Vec<UnboundedSender<Arc<K>>>,
    listed: tokio::sync::watch::Sender<bool>,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    let store = writer.as_reader();
    let mut relisted: Vec<ObjectRef<K>> = Vec::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(e) => e,
            // The watcher backs off and resumes on its own.
            Err(e) => {
                warn!(kind = K::kind(&()).as_ref(), error = %e, "watch failed; retrying");
                continue;
            }
        };
        // What the cache held before a relist replaces it, to tell what the new list lacks.
        let before_relist = matches!(event, watcher::Event::InitDone).then(|| store.state());
        index.apply(&mut writer, &event);
        let changed: Vec<Arc<K>> = match event {
            watcher::Event::Apply(o) => store.get(&ObjectRef::from_obj(&o)).into_iter().collect(),
            watcher::Event::Delete(o) => vec![Arc::new(o)],
            watcher::Event::Init => {
                relisted.clear();
                Vec::new()
            }
            watcher::Event::InitApply(o) => {
                relisted.push(ObjectRef::from_obj(&o));
                Vec::new()
            }
            watcher::Event::InitDone => {
                listed.send_replace(true);
                let mut changed: Vec<Arc<K>> = std::mem::take(&mut relisted)
                    .iter()
                    .filter_map(|r| store.get(r))
                    .collect();
                changed.extend(gone_from(before_relist.unwrap_or_default(), &store));
                changed
            }
        };
        for o in changed {
            let delivered = senders
                .iter()
                .filter(|s| s.unbounded_send(o.clone()).is_ok());
            if delivered.count() == 0 {
                return;
            }
        }
    }
}

/// The objects `before` held that the cache no longer has: deleted while the watch was broken
/// (a relist after `410 Gone` sends no deletion for them, as client-go's informers send
/// `DeletedFinalStateUnknown`). Told as deletions, so that a holder gone during an outage is
/// released once the watch is back, not at the next resync.
fn gone_from<K>(before: Vec<Arc<K>>, store: &reflector::Store<K>) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    before
        .into_iter()
        .filter(|o| store.get(&ObjectRef::from_obj(o.as_ref())).is_none())
        .collect()
}

/// The objects a reflected event stream applied, each once the reflector has it
/// in the store: a listed object only when the whole list is in (until then the
/// store still shows the previous list, and a controller finds nothing to reconcile).
pub fn applied_once_stored<K: Send + 'static>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
    let mut relisted = Vec::new();
    events.flat_map(move |event| {
        let ready: Vec<Result<K, watcher::Error>> = match event {
            Ok(watcher::Event::Apply(o)) => vec![Ok(o)],
            Ok(watcher::Event::Delete(_)) => Vec::new(),
            Ok(watcher::Event::Init) => {
                relisted.clear();
                Vec::new()
            }
            Ok(watcher::Event::InitApply(o)) => {
                relisted.push(o);
                Vec::new()
            }
            Ok(watcher::Event::InitDone) => {
                std::mem::take(&mut relisted).into_iter().map(Ok).collect()
            }
            Err(e) => vec![Err(e)],
        };
        futures::stream::iter(ready)
    })
}

#[cfg(test)]
mod applied_tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn a_listed_object_is_applied_once_the_list_is_complete() {
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Apply(1)),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitApply(2)),
            Ok(watcher::Event::InitApply(3)),
            Ok(watcher::Event::InitDone),
            Ok(watcher::Event::Delete(3)),
            Ok(watcher::Event::Apply(4)),
        ]);
        let got: Vec<i32> = applied_once_stored(events)
            .map(|r| r.unwrap())
            .collect()
            .await;
        assert_eq!(got, [1, 2, 3, 4]);
    }
}

/// The changes a shared watch hands to one of its consumers.
pub type ChangeStream<K> = futures::channel::mpsc::UnboundedReceiver<Arc<K>>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tekton::customrun::CustomRun;
    use kube::runtime::reflector::Store;

    fn run(name: &str, version: &str) -> CustomRun {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "tekton.dev/v1beta1",
            "kind": "CustomRun",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": version},
            "spec": {},
        }))
        .unwrap()
    }

    fn listed() -> tokio::sync::watch::Sender<bool> {
        tokio::sync::watch::channel(false).0
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
        tokio::spawn(fan_out(
            events,
            writer,
            Index::new(|_| vec![]),
            senders,
            listed(),
        ));
        let send = |e| source.unbounded_send(Ok(e)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(run("a", "1")));
        // Not told before the list is complete: the cache does not have it yet.
        tokio::task::yield_now().await;
        for c in &mut changes {
            assert!(c.try_recv().is_err(), "told of a listed object too early");
        }
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

    /// A relist after the watch expired (`410 Gone`) sends no deletion for what went meanwhile:
    /// every consumer hears of each object the cache held and the new list lacks, once the
    /// cache has let it go, besides the listed objects it always tells of.
    #[tokio::test(flavor = "current_thread")]
    async fn a_relist_tells_of_the_objects_deleted_while_the_watch_was_broken() {
        let (store, writer) = reflector::store::<CustomRun>();
        let (source, events) = mpsc::unbounded();
        let (senders, mut changes): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::unbounded()).unzip();
        tokio::spawn(fan_out(
            events,
            writer,
            Index::new(|_| vec![]),
            senders,
            listed(),
        ));
        let send = |e| source.unbounded_send(Ok(e)).unwrap();
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(run("kept", "1")));
        send(watcher::Event::InitApply(run("gone", "1")));
        send(watcher::Event::InitDone);
        for c in &mut changes {
            c.next().await.unwrap();
            c.next().await.unwrap();
        }
        // The watch expired; "gone" was deleted meanwhile, "new" created.
        send(watcher::Event::Init);
        send(watcher::Event::InitApply(run("kept", "1")));
        send(watcher::Event::InitApply(run("new", "1")));
        send(watcher::Event::InitDone);
        for c in &mut changes {
            let mut heard = Vec::new();
            for _ in 0..3 {
                let next = tokio::time::timeout(std::time::Duration::from_secs(5), c.next());
                let o = next.await.expect("told of fewer than 3 objects").unwrap();
                heard.push(o.metadata.name.clone().unwrap());
            }
            heard.sort();
            assert_eq!(heard, ["gone", "kept", "new"]);
            assert!(c.try_recv().is_err(), "told more than the relist changed");
        }
        assert_eq!(cached_version(&store, "gone"), None);
    }

    /// The stall under control-plane restarts: every task waiting for the first
    /// list must be woken, not only the last one to wait (kube-runtime 5's
    /// `Store::wait_until_ready` keeps one waker per store).
    #[tokio::test(flavor = "current_thread")]
    async fn every_task_waiting_for_the_first_list_is_woken() {
        let (_store, writer) = reflector::store::<CustomRun>();
        let (source, events) = mpsc::unbounded();
        let (senders, _changes): (Vec<_>, Vec<_>) = (0..1).map(|_| mpsc::unbounded()).unzip();
        let (listed_tx, listed) = tokio::sync::watch::channel(false);
        let waiters: Vec<_> = (0..3)
            .map(|_| tokio::spawn(all_listed_owned(vec![listed.clone()])))
            .collect();
        // Every waiter is parked before the list completes.
        tokio::task::yield_now().await;
        assert!(waiters.iter().all(|w| !w.is_finished()));
        tokio::spawn(fan_out(
            events,
            writer,
            Index::new(|_| vec![]),
            senders,
            listed_tx,
        ));
        source.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        source.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        for w in waiters {
            tokio::time::timeout(std::time::Duration::from_secs(5), w)
                .await
                .expect("a task waiting for the first list was never woken")
                .unwrap();
        }
    }

    async fn all_listed_owned(listed: Vec<Listed>) {
        all_listed(&listed).await
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_watch_ends_once_every_consumer_has_gone() {
        let (_store, writer) = reflector::store::<CustomRun>();
        let (source, events) = mpsc::unbounded();
        let (senders, changes): (Vec<_>, Vec<_>) = (0..2).map(|_| mpsc::unbounded()).unzip();
        let task = tokio::spawn(fan_out(
            events,
            writer,
            Index::new(|_| vec![]),
            senders,
            listed(),
        ));
        drop(changes);
        source
            .unbounded_send(Ok(watcher::Event::Apply(run("a", "1"))))
            .unwrap();
        task.await.unwrap();
    }
}
