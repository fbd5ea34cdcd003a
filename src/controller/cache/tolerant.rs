//! Mutexes are watched untyped and typed one by one, so that one object the
//! types cannot read (say `capacity: 5000000000`, accepted by an older CRD)
//! never fails the list that every other key depends on. Such an object is
//! left out of the cache, and so left alone, and reported on itself through
//! an Event and in the log; every other key is served as before.

use crate::controller::recorder::EventRecorder;
use crate::model::mutex::Mutex;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::events::{Event, EventType};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tracing::warn;

/// The Event reason on a Mutex the controller cannot read.
pub const UNREADABLE: &str = "InvalidMutex";

/// The Mutexes, untyped, where the controller acts.
pub fn api(client: &Client, namespace: &Option<String>) -> Api<DynamicObject> {
    let ar = ApiResource::erase::<Mutex>(&());
    match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// A watch event of untyped Mutexes as one of typed ones. An object that does
/// not read is reported, and dropped: a change that makes a cached Mutex
/// unreadable removes it from the cache (a Delete), so nothing acts on a stale copy.
pub fn typed(
    recorder: &EventRecorder,
    event: watcher::Event<DynamicObject>,
) -> Option<watcher::Event<Mutex>> {
    use watcher::Event as E;
    Some(match event {
        E::Init => E::Init,
        E::InitDone => E::InitDone,
        E::InitApply(o) => E::InitApply(read(recorder, o).ok()?),
        E::Apply(o) => match read(recorder, o) {
            Ok(m) => E::Apply(m),
            Err(stub) => E::Delete(*stub),
        },
        E::Delete(o) => E::Delete(read(recorder, o).unwrap_or_else(|stub| *stub)),
    })
}

/// The typed Mutex, or (when it does not read) a stub with its name and
/// namespace only, after reporting why.
fn read(recorder: &EventRecorder, o: DynamicObject) -> Result<Mutex, Box<Mutex>> {
    let (name, namespace) = (o.name_any(), o.namespace());
    let value = serde_json::to_value(&o).unwrap_or_default();
    match serde_json::from_value::<Mutex>(value) {
        Ok(m) => Ok(m),
        Err(e) => {
            let why = format!(
                "the controller cannot read this Mutex ({e}); it leaves its key alone until it is fixed (capacity 1 to {}, order oldest-first or newest-first)",
                crate::model::mutex::MAX_CAPACITY
            );
            warn!(key = %name, namespace = ?namespace, error = %e, "unreadable Mutex left alone");
            report(recorder, &o, why);
            let mut stub = Mutex::new(&name, Default::default());
            stub.metadata.namespace = namespace;
            stub.metadata.uid = o.metadata.uid.clone();
            Err(Box::new(stub))
        }
    }
}

/// An Event on the Mutex, in the background (best effort).
fn report(recorder: &EventRecorder, o: &DynamicObject, note: String) {
    let reference = ObjectReference {
        api_version: Some(Mutex::api_version(&()).into()),
        kind: Some(Mutex::kind(&()).into()),
        name: Some(o.name_any()),
        namespace: o.namespace(),
        uid: o.metadata.uid.clone(),
        ..Default::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: UNREADABLE.into(),
        note: Some(note),
        action: "Read".into(),
        secondary: None,
    };
    let recorder = recorder.clone();
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&event, &reference).await {
            warn!(error = %e, mutex = ?reference.name, "could not record an Event");
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dynamic(capacity: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
            "metadata": {"name": "k", "namespace": "ns", "uid": "u"},
            "spec": {"capacity": capacity},
        }))
        .unwrap()
    }

    fn recorder() -> EventRecorder {
        EventRecorder::unconnected()
    }

    #[tokio::test]
    async fn an_unreadable_mutex_is_dropped_from_the_list_and_removed_on_change() {
        let r = recorder();
        let good = typed(&r, watcher::Event::InitApply(dynamic(json!(2))));
        assert!(
            matches!(&good, Some(watcher::Event::InitApply(m)) if m.spec.lock.capacity == 2),
            "{good:?}"
        );
        let poison = dynamic(json!(5_000_000_000u64));
        assert!(typed(&r, watcher::Event::InitApply(poison.clone())).is_none());
        let removed = typed(&r, watcher::Event::Apply(poison));
        assert!(
            matches!(&removed, Some(watcher::Event::Delete(m))
                if m.name_any() == "k" && m.namespace().as_deref() == Some("ns")),
            "{removed:?}"
        );
    }
}
