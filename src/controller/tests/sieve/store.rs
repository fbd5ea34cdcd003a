//! The fake API server's objects: one store of JSON objects keyed by kind,
//! namespace and name, each with a `metadata.resourceVersion` from one global
//! counter, and a log of every change (the watch events, and the history the
//! oracle replays). It applies the rules of kube-apiserver that the controller
//! relies on, and only those:
//!
//! - a PUT is a compare-and-swap on `metadata.resourceVersion` (409 if stale);
//! - a merge patch that names a resourceVersion is one too; a patch that names
//!   another uid is refused (uid is immutable, 422);
//! - a status subresource write changes only `status`, a main-resource write
//!   everything but `status` (for kinds with a status subresource);
//! - the CRD's CEL rule: a lock's `status.lastToken` never goes down (422);
//! - a DELETE honours preconditions (409) and finalizers: an object with
//!   finalizers only gets a `deletionTimestamp`, and goes once the last
//!   finalizer is removed;
//! - creating an existing name is 409 AlreadyExists.
//!
//! Events are kept apart: nothing in the controller or in Tekton reads them.

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The kinds the controller touches. Anything else is not modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Mutex,
    ClusterMutex,
    CustomRun,
    PipelineRun,
    Pod,
    ConfigMap,
    Event,
}

/// How a kind is served.
pub struct Resource {
    pub kind: Kind,
    /// `group/version`, or `v1` for the core group.
    pub api_version: &'static str,
    pub plural: &'static str,
    pub kind_name: &'static str,
    pub namespaced: bool,
    pub status_subresource: bool,
}

pub const RESOURCES: &[Resource] = &[
    Resource {
        kind: Kind::Mutex,
        api_version: "tekton-mutex.dev/v1alpha1",
        plural: "mutexes",
        kind_name: "Mutex",
        namespaced: true,
        status_subresource: true,
    },
    Resource {
        kind: Kind::ClusterMutex,
        api_version: "tekton-mutex.dev/v1alpha1",
        plural: "clustermutexes",
        kind_name: "ClusterMutex",
        namespaced: false,
        status_subresource: true,
    },
    Resource {
        kind: Kind::CustomRun,
        api_version: "tekton.dev/v1beta1",
        plural: "customruns",
        kind_name: "CustomRun",
        namespaced: true,
        status_subresource: true,
    },
    Resource {
        kind: Kind::PipelineRun,
        api_version: "tekton.dev/v1",
        plural: "pipelineruns",
        kind_name: "PipelineRun",
        namespaced: true,
        status_subresource: true,
    },
    Resource {
        kind: Kind::Pod,
        api_version: "v1",
        plural: "pods",
        kind_name: "Pod",
        namespaced: true,
        status_subresource: true,
    },
    Resource {
        kind: Kind::ConfigMap,
        api_version: "v1",
        plural: "configmaps",
        kind_name: "ConfigMap",
        namespaced: true,
        status_subresource: false,
    },
    Resource {
        kind: Kind::Event,
        api_version: "events.k8s.io/v1",
        plural: "events",
        kind_name: "Event",
        namespaced: true,
        status_subresource: false,
    },
];

impl Kind {
    pub fn resource(self) -> &'static Resource {
        RESOURCES
            .iter()
            .find(|r| r.kind == self)
            .expect("every kind has a resource")
    }

    /// Does the controller keep a watch cache of this kind (and so may see it stale)?
    pub fn cached(self) -> bool {
        matches!(
            self,
            Kind::Mutex | Kind::ClusterMutex | Kind::CustomRun | Kind::PipelineRun
        )
    }
}

/// Where an object lives: a cluster-scoped one has namespace "".
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjKey {
    pub fn new(kind: Kind, namespace: &str, name: &str) -> ObjKey {
        ObjKey {
            kind,
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.namespace.as_str() {
            "" => write!(f, "{:?} {}", self.kind, self.name),
            ns => write!(f, "{:?} {ns}/{}", self.kind, self.name),
        }
    }
}

/// Who made a change: the controller under test, or the world around it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Actor {
    Controller,
    World,
}

/// One change: the object as it is after it (as it was, for a deletion).
#[derive(Clone, Debug)]
pub struct Change {
    pub rv: u64,
    pub key: ObjKey,
    pub object: Value,
    pub deleted: bool,
    pub actor: Actor,
}

/// Why a request was refused, as the API server says it.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: String) -> ApiError {
        ApiError {
            code,
            reason,
            message,
        }
    }

    /// The `Status` object kube-apiserver answers with.
    pub fn status(&self) -> Value {
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": self.message, "reason": self.reason, "code": self.code})
    }
}

/// A request refused: by the API server's rules, or because this fake does not
/// model it (the harness fails the test on the second kind).
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    Api(ApiError),
    Unmodelled(String),
}

impl From<ApiError> for Refusal {
    fn from(e: ApiError) -> Refusal {
        Refusal::Api(e)
    }
}

/// The first creationTimestamp: long past, so a wait of seconds has run out.
pub const EPOCH: &str = "2025-01-01T00:00:00Z";

/// When the store marks an object deleted (any fixed time after EPOCH).
const DELETED_AT: &str = "2025-01-02T00:00:00Z";

#[derive(Default)]
pub struct Store {
    rv: u64,
    objects: BTreeMap<ObjKey, Value>,
    log: Vec<Change>,
    /// Objects created so far, per kind: their creationTimestamps count up by kind,
    /// so the world's objects are stamped the same whatever the controller creates.
    created: BTreeMap<Kind, i64>,
    /// Objects created so far under each name: their uids are `name-uid-N`.
    incarnations: BTreeMap<ObjKey, u64>,
    events: BTreeMap<(String, String), Value>,
}

impl Store {
    pub fn get(&self, key: &ObjKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// The objects of a kind (of one namespace, if given), in key order.
    pub fn list(&self, kind: Kind, namespace: Option<&str>) -> Vec<&Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.kind == kind && namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v)
            .collect()
    }

    pub fn log(&self) -> &[Change] {
        &self.log
    }

    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Store `object` under `key` (None: remove it), stamped with the next resourceVersion.
    fn commit(&mut self, key: &ObjKey, object: Option<Value>, actor: Actor) -> Value {
        self.rv += 1;
        let rv = self.rv.to_string();
        let (mut object, deleted) = match object {
            Some(o) => (o, false),
            None => (
                self.objects
                    .remove(key)
                    .expect("only a stored object is removed"),
                true,
            ),
        };
        object["metadata"]["resourceVersion"] = json!(rv);
        if !deleted {
            self.objects.insert(key.clone(), object.clone());
        }
        self.log.push(Change {
            rv: self.rv,
            key: key.clone(),
            object: object.clone(),
            deleted,
            actor,
        });
        object
    }

    pub fn create(
        &mut self,
        key: &ObjKey,
        mut object: Value,
        actor: Actor,
    ) -> Result<Value, Refusal> {
        if key.kind == Kind::Event {
            return self.create_event(key, object);
        }
        if self.objects.contains_key(key) {
            return Err(
                ApiError::new(409, "AlreadyExists", format!("{key} already exists")).into(),
            );
        }
        let res = key.kind.resource();
        let n = self.incarnations.entry(key.clone()).or_default();
        *n += 1;
        let uid = format!("{}-uid-{n}", key.name);
        let count = self.created.entry(key.kind).or_default();
        *count += 1;
        let created = stamp(SignedDuration::from_secs(*count));
        let meta = &mut object["metadata"];
        meta["name"] = json!(key.name);
        if res.namespaced {
            meta["namespace"] = json!(key.namespace);
        }
        meta["uid"] = json!(uid);
        meta["creationTimestamp"] = json!(created);
        object["apiVersion"] = json!(res.api_version);
        object["kind"] = json!(res.kind_name);
        Ok(self.commit(key, Some(object), actor))
    }

    fn create_event(&mut self, key: &ObjKey, object: Value) -> Result<Value, Refusal> {
        let id = (key.namespace.clone(), key.name.clone());
        if self.events.contains_key(&id) {
            return Err(
                ApiError::new(409, "AlreadyExists", format!("{key} already exists")).into(),
            );
        }
        self.events.insert(id, object.clone());
        Ok(object)
    }

    /// A PUT: `object` replaces the stored one, if it was read at the current
    /// resourceVersion. `status`: the status subresource (only status changes).
    pub fn replace(
        &mut self,
        key: &ObjKey,
        object: Value,
        status: bool,
        actor: Actor,
    ) -> Result<Value, Refusal> {
        let old = self.existing(key)?.clone();
        let Some(rv) = object["metadata"]["resourceVersion"].as_str() else {
            return Err(Refusal::Unmodelled(format!(
                "a PUT of {key} without a resourceVersion"
            )));
        };
        if Some(rv) != old["metadata"]["resourceVersion"].as_str() {
            return Err(conflict(
                key,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let new = scoped_write(key.kind, &old, object, status);
        self.admit(key, &old, new, actor)
    }

    /// A merge patch (RFC 7386), conditional on a resourceVersion if it names one.
    pub fn merge_patch(
        &mut self,
        key: &ObjKey,
        patch: &Value,
        status: bool,
        actor: Actor,
    ) -> Result<Value, Refusal> {
        if key.kind == Kind::Event {
            return self.patch_event(key, patch);
        }
        let old = self.existing(key)?.clone();
        match &patch["metadata"]["resourceVersion"] {
            Value::Null if patch["metadata"].get("resourceVersion").is_some() => {
                return Err(Refusal::Unmodelled(format!(
                    "a patch of {key} that removes its resourceVersion"
                )));
            }
            Value::String(rv)
                if Some(rv.as_str()) != old["metadata"]["resourceVersion"].as_str() =>
            {
                return Err(conflict(key, "the object has been modified"));
            }
            _ => {}
        }
        let mut merged = old.clone();
        merge(&mut merged, patch);
        let new = scoped_write(key.kind, &old, merged, status);
        self.admit(key, &old, new, actor)
    }

    fn patch_event(&mut self, key: &ObjKey, patch: &Value) -> Result<Value, Refusal> {
        let id = (key.namespace.clone(), key.name.clone());
        let Some(event) = self.events.get_mut(&id) else {
            return Err(not_found(key));
        };
        merge(event, patch);
        Ok(event.clone())
    }

    /// A DELETE with optional preconditions (`{"uid": .., "resourceVersion": ..}`).
    pub fn delete(
        &mut self,
        key: &ObjKey,
        preconditions: &Value,
        actor: Actor,
    ) -> Result<Value, Refusal> {
        let old = self.existing(key)?.clone();
        for field in ["uid", "resourceVersion"] {
            let want = &preconditions[field];
            if !want.is_null() && *want != old["metadata"][field] {
                return Err(conflict(key, &format!("precondition failed: {field}")));
            }
        }
        if has_finalizers(&old) {
            if !old["metadata"]["deletionTimestamp"].is_null() {
                return Ok(old);
            }
            let mut marked = old.clone();
            marked["metadata"]["deletionTimestamp"] = json!(DELETED_AT);
            return Ok(self.commit(key, Some(marked), actor));
        }
        Ok(self.commit(key, None, actor))
    }

    /// The world's own writes: `edit` changes the stored object in place, with
    /// no precondition (Tekton and people patch what they own). None if it is gone.
    pub fn edit(&mut self, key: &ObjKey, edit: impl FnOnce(&mut Value)) -> Option<Value> {
        let old = self.objects.get(key)?.clone();
        let mut new = old.clone();
        edit(&mut new);
        if new == old {
            return Some(old);
        }
        match self.admit(key, &old, new, Actor::World) {
            Ok(v) => Some(v),
            Err(e) => panic!("the world's own write of {key} was refused: {e:?}"),
        }
    }

    fn existing(&self, key: &ObjKey) -> Result<&Value, Refusal> {
        self.objects.get(key).ok_or_else(|| not_found(key))
    }

    /// The checks every update passes, then the write (or the removal, once
    /// an object marked for deletion has no finalizer left).
    fn admit(
        &mut self,
        key: &ObjKey,
        old: &Value,
        mut new: Value,
        actor: Actor,
    ) -> Result<Value, Refusal> {
        // As kube-apiserver: an update that names no uid keeps the stored one.
        if new["metadata"]["uid"].is_null() {
            new["metadata"]["uid"] = old["metadata"]["uid"].clone();
        }
        if new["metadata"]["uid"] != old["metadata"]["uid"] {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("{key}: metadata.uid: field is immutable"),
            )
            .into());
        }
        for field in [
            "name",
            "namespace",
            "creationTimestamp",
            "deletionTimestamp",
        ] {
            match &old["metadata"][field] {
                Value::Null => drop(new["metadata"].as_object_mut().map(|m| m.remove(field))),
                v => new["metadata"][field] = v.clone(),
            }
        }
        if matches!(key.kind, Kind::Mutex | Kind::ClusterMutex) {
            let last = |o: &Value| o["status"]["lastToken"].as_i64().unwrap_or(0);
            if last(&new) < last(old) {
                let why = "status.lastToken: lastToken never goes down: fencing tokens must keep increasing";
                return Err(ApiError::new(422, "Invalid", format!("{key}: {why}")).into());
            }
        }
        if new == *old {
            return Ok(new);
        }
        let gone = !old["metadata"]["deletionTimestamp"].is_null() && !has_finalizers(&new);
        Ok(self.commit(key, (!gone).then_some(new), actor))
    }
}

/// What a write of `body` leaves: for a kind with a status subresource, a status
/// write changes only the status and a main write everything else.
fn scoped_write(kind: Kind, old: &Value, body: Value, status: bool) -> Value {
    if !kind.resource().status_subresource {
        return body;
    }
    let (mut new, from) = match status {
        true => (old.clone(), &body),
        false => (body.clone(), old),
    };
    match from.get("status") {
        Some(s) => new["status"] = s.clone(),
        None => drop(new.as_object_mut().map(|o| o.remove("status"))),
    }
    new
}

fn has_finalizers(o: &Value) -> bool {
    o["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|f| !f.is_empty())
}

/// RFC 7386: objects merge key by key, null removes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("just made an object");
    for (k, v) in fields {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// EPOCH plus `offset`, as the API server writes times.
pub fn stamp(offset: SignedDuration) -> String {
    let epoch: Timestamp = EPOCH.parse().expect("EPOCH is a time");
    (epoch + offset).to_string()
}

fn not_found(key: &ObjKey) -> Refusal {
    ApiError::new(404, "NotFound", format!("{key} not found")).into()
}

fn conflict(key: &ObjKey, why: &str) -> Refusal {
    ApiError::new(
        409,
        "Conflict",
        format!("Operation cannot be fulfilled on {key}: {why}"),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mutex() -> (Store, ObjKey, Value) {
        let mut s = Store::default();
        let key = ObjKey::new(Kind::Mutex, "ns", "k");
        let created = s
            .create(&key, json!({"spec": {"capacity": 1}}), Actor::World)
            .unwrap();
        (s, key, created)
    }

    #[test]
    fn a_put_is_a_compare_and_swap_and_a_status_write_changes_only_the_status() {
        let (mut s, key, v1) = mutex();
        let mut w = v1.clone();
        w["status"] = json!({"lastToken": 1});
        w["spec"]["capacity"] = json!(5);
        let v2 = s.replace(&key, w.clone(), true, Actor::Controller).unwrap();
        assert_eq!(
            (
                v2["status"]["lastToken"].clone(),
                v2["spec"]["capacity"].clone()
            ),
            (json!(1), json!(1))
        );
        assert_ne!(
            v2["metadata"]["resourceVersion"],
            v1["metadata"]["resourceVersion"]
        );
        let Err(Refusal::Api(e)) = s.replace(&key, w, true, Actor::Controller) else {
            panic!("a stale PUT went through")
        };
        assert_eq!(e.code, 409);
        let mut main = v2.clone();
        main["status"] = json!({"lastToken": 9});
        let v3 = s.replace(&key, main, false, Actor::Controller).unwrap();
        assert_eq!(
            v3["status"]["lastToken"], 1,
            "a main write keeps the status"
        );
    }

    #[test]
    fn the_last_token_never_goes_down() {
        let (mut s, key, v1) = mutex();
        let mut up = v1.clone();
        up["status"] = json!({"lastToken": 3});
        let v2 = s.replace(&key, up, true, Actor::Controller).unwrap();
        let mut down = v2.clone();
        down["status"] = json!({"lastToken": 2});
        let refused = s.replace(&key, down, true, Actor::Controller);
        assert!(
            matches!(refused, Err(Refusal::Api(ApiError { code: 422, .. }))),
            "{refused:?}"
        );
    }

    #[test]
    fn a_merge_patch_names_its_preconditions() {
        let (mut s, key, v1) = mutex();
        let rv = v1["metadata"]["resourceVersion"].clone();
        let ok = json!({"metadata": {"resourceVersion": rv, "labels": {"a": "b"}}});
        let v2 = s.merge_patch(&key, &ok, false, Actor::Controller).unwrap();
        assert_eq!(v2["metadata"]["labels"]["a"], "b");
        let stale = s.merge_patch(&key, &ok, false, Actor::Controller);
        assert!(matches!(
            stale,
            Err(Refusal::Api(ApiError { code: 409, .. }))
        ));
        let other_uid = json!({"metadata": {"uid": "someone-else"}});
        let refused = s.merge_patch(&key, &other_uid, false, Actor::Controller);
        assert!(matches!(
            refused,
            Err(Refusal::Api(ApiError { code: 422, .. }))
        ));
        let unconditional = json!({"metadata": {"resourceVersion": null}});
        let unmodelled = s.merge_patch(&key, &unconditional, false, Actor::Controller);
        assert!(matches!(unmodelled, Err(Refusal::Unmodelled(_))));
    }

    #[test]
    fn a_delete_waits_for_the_finalizers_then_the_object_goes() {
        let (mut s, key, v1) = mutex();
        let rv = v1["metadata"]["resourceVersion"].clone();
        let protect = json!({"metadata": {"resourceVersion": rv, "finalizers": ["f"]}});
        let v2 = s
            .merge_patch(&key, &protect, false, Actor::Controller)
            .unwrap();
        let wrong = json!({"resourceVersion": v1["metadata"]["resourceVersion"]});
        assert!(matches!(
            s.delete(&key, &wrong, Actor::World),
            Err(Refusal::Api(ApiError { code: 409, .. }))
        ));
        let marked = s
            .delete(&key, &json!({"uid": v2["metadata"]["uid"]}), Actor::World)
            .unwrap();
        assert!(marked["metadata"]["deletionTimestamp"].is_string());
        assert!(s.get(&key).is_some(), "kept while a finalizer is on");
        s.merge_patch(
            &key,
            &json!({"metadata": {"finalizers": []}}),
            false,
            Actor::Controller,
        )
        .unwrap();
        assert!(s.get(&key).is_none());
        let last = s.log().last().unwrap();
        assert!(last.deleted && last.key == key);
        assert!(
            s.create(&key, json!({}), Actor::World).is_ok(),
            "the name is free again"
        );
        assert!(matches!(
            s.create(&key, json!({}), Actor::World),
            Err(Refusal::Api(ApiError { code: 409, .. }))
        ));
    }
}
