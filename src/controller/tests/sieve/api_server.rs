//! The fake API server over HTTP: the requests kube's client builds, answered
//! as kube-apiserver answers them, from one [`Store`]. Only the requests the
//! controller makes are modelled; any other (a watch, a JSON patch, an unknown
//! path or query) is answered 501 and recorded, and the harness fails the test
//! on it: a request this fake does not understand never silently succeeds.

use super::store::{Actor, ApiError, Kind, ObjKey, RESOURCES, Refusal, Resource, Store};
use http::Method;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex, MutexGuard};

/// The Accept header of `get_metadata` and `list_metadata`.
const METADATA: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
const METADATA_LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";
const MERGE_PATCH: &str = "application/merge-patch+json";

/// One request as the server reads it.
#[derive(Clone, Debug)]
pub struct Call {
    pub method: Method,
    pub path: String,
    pub query: Vec<(String, String)>,
    pub accept: Option<String>,
    pub content_type: Option<String>,
    pub body: Value,
}

impl Call {
    /// Anything but a read changes something (or tries to).
    pub fn is_write(&self) -> bool {
        self.method != Method::GET
    }

    /// "METHOD /path", an Event's name left out: the recorder names each by the clock.
    pub fn line(&self) -> String {
        match self.path.split_once("/events/") {
            Some((events, _)) => format!("{} {events}/events/*", self.method),
            None => format!("{} {}", self.method, self.path),
        }
    }
}

/// What a path names: a kind, maybe a namespace, maybe an object, maybe its status.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub status: bool,
}

impl Target {
    pub fn key(&self) -> Option<ObjKey> {
        let name = self.name.as_ref()?;
        Some(ObjKey::new(
            self.kind,
            self.namespace.as_deref().unwrap_or(""),
            name,
        ))
    }
}

/// `/api/v1/...` or `/apis/GROUP/VERSION/...`, then `[namespaces/NS/]PLURAL[/NAME[/status]]`.
pub fn parse_path(path: &str) -> Result<Target, String> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (api_version, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_string(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return Err(format!("not an API path: {path}")),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        rest => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some(name.to_string()), false),
        [plural, name, "status"] => (*plural, Some(name.to_string()), true),
        _ => return Err(format!("not a path this server models: {path}")),
    };
    let res = RESOURCES
        .iter()
        .find(|r| r.api_version == api_version && r.plural == plural)
        .ok_or_else(|| format!("a resource this server does not model: {path}"))?;
    if res.namespaced != namespace.is_some() && name.is_some() {
        return Err(format!(
            "{} is namespaced: {}, in {path}",
            res.kind_name, res.namespaced
        ));
    }
    if status && !res.status_subresource {
        return Err(format!(
            "{} has no status subresource: {path}",
            res.kind_name
        ));
    }
    Ok(Target {
        kind: res.kind,
        namespace,
        name,
        status,
    })
}

pub struct ApiServer {
    store: Mutex<Store>,
    unmodelled: Mutex<Vec<String>>,
}

impl ApiServer {
    pub fn new() -> Arc<ApiServer> {
        Arc::new(ApiServer {
            store: Mutex::new(Store::default()),
            unmodelled: Mutex::new(Vec::new()),
        })
    }

    /// The store, for the world's own writes and for the oracle.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every request this server could not answer faithfully, so far.
    pub fn unmodelled(&self) -> Vec<String> {
        self.unmodelled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Record a problem the harness must fail the test on.
    pub fn refuse(&self, why: String) {
        self.unmodelled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(why);
    }

    /// Answer one request of the controller: (status code, body).
    pub fn serve(&self, call: &Call) -> (u16, Value) {
        match self.route(call) {
            Ok(answer) => answer,
            Err(Refusal::Api(e)) => (e.code, e.status()),
            Err(Refusal::Unmodelled(why)) => {
                let why = format!("{}: {why}", call.line());
                self.refuse(why.clone());
                let e = ApiError {
                    code: 501,
                    reason: "NotImplemented",
                    message: why,
                };
                (501, e.status())
            }
        }
    }

    fn route(&self, call: &Call) -> Result<(u16, Value), Refusal> {
        let target = parse_path(&call.path).map_err(Refusal::Unmodelled)?;
        check_query(call, &target)?;
        let key = target.key();
        let mut store = self.store();
        let actor = Actor::Controller;
        match (&call.method, key) {
            (&Method::GET, Some(key)) if !target.status => {
                let found = store.get(&key).ok_or_else(|| not_found(&key))?;
                Ok((200, render(found, call.accept.as_deref())?))
            }
            (&Method::GET, None) => list(&store, &target, call),
            (&Method::POST, None) => {
                let name = call.body["metadata"]["name"].as_str().unwrap_or_default();
                let ns = target.namespace.as_deref().unwrap_or("");
                let key = ObjKey::new(target.kind, ns, name);
                Ok((201, store.create(&key, call.body.clone(), actor)?))
            }
            (&Method::PUT, Some(key)) => Ok((
                200,
                store.replace(&key, call.body.clone(), target.status, actor)?,
            )),
            (&Method::PATCH, Some(key)) => {
                if call.content_type.as_deref() != Some(MERGE_PATCH) {
                    let ct = call.content_type.clone().unwrap_or_default();
                    return Err(Refusal::Unmodelled(format!("a patch of type {ct:?}")));
                }
                Ok((
                    200,
                    store.merge_patch(&key, &call.body, target.status, actor)?,
                ))
            }
            (&Method::DELETE, Some(key)) if !target.status => {
                if !call.body["dryRun"].is_null() {
                    return Err(Refusal::Unmodelled("a dry-run delete".into()));
                }
                let pre = &call.body["preconditions"];
                Ok((200, store.delete(&key, pre, actor)?))
            }
            _ => Err(Refusal::Unmodelled(
                "a method this server does not model here".into(),
            )),
        }
    }
}

/// Only a list takes query parameters here, and only selectors.
fn check_query(call: &Call, target: &Target) -> Result<(), Refusal> {
    for (k, _) in &call.query {
        let selector = matches!(k.as_str(), "labelSelector" | "fieldSelector");
        if !(selector && call.method == Method::GET && target.name.is_none()) {
            return Err(Refusal::Unmodelled(format!("query parameter {k}")));
        }
    }
    Ok(())
}

fn not_found(key: &ObjKey) -> Refusal {
    Refusal::Api(ApiError {
        code: 404,
        reason: "NotFound",
        message: format!("{key} not found"),
    })
}

/// The object, or only its metadata when the client asked for that.
fn render(object: &Value, accept: Option<&str>) -> Result<Value, Refusal> {
    match accept {
        None | Some("application/json") => Ok(object.clone()),
        Some(METADATA) => Ok(
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                                    "metadata": object["metadata"]}),
        ),
        Some(other) => Err(Refusal::Unmodelled(format!("Accept: {other}"))),
    }
}

fn list(store: &Store, target: &Target, call: &Call) -> Result<(u16, Value), Refusal> {
    let param = |name: &str| {
        call.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let labels = param("labelSelector").map(Selector::labels).transpose();
    let fields = param("fieldSelector").map(Selector::fields).transpose();
    let (labels, fields) = (
        labels.map_err(Refusal::Unmodelled)?,
        fields.map_err(Refusal::Unmodelled)?,
    );
    let mut items = Vec::new();
    for o in store.list(target.kind, target.namespace.as_deref()) {
        let pass = |s: &Option<Selector>| s.as_ref().is_none_or(|s| s.matches(o));
        if pass(&labels) && pass(&fields) {
            items.push(o);
        }
    }
    let res: &Resource = target.kind.resource();
    let rv = store.resource_version().to_string();
    let list = match call.accept.as_deref() {
        Some(METADATA_LIST) => {
            let items: Vec<Value> = items
                .iter()
                .map(|o| json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": o["metadata"]}))
                .collect();
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
                   "metadata": {"resourceVersion": rv}, "items": items})
        }
        None | Some("application/json") => {
            json!({"apiVersion": res.api_version, "kind": format!("{}List", res.kind_name),
                   "metadata": {"resourceVersion": rv}, "items": items})
        }
        Some(other) => return Err(Refusal::Unmodelled(format!("Accept: {other}"))),
    };
    Ok((200, list))
}

/// A label or field selector, of the forms the controller writes:
/// `k=v`, `k==v`, `k!=v` and, for labels, `k` and `!k`.
struct Selector {
    terms: Vec<Term>,
    fields: bool,
}

enum Term {
    Is(String, String),
    IsNot(String, String),
    Has(String),
    HasNot(String),
}

impl Selector {
    fn labels(s: &str) -> Result<Selector, String> {
        Selector::parse(s, false)
    }

    fn fields(s: &str) -> Result<Selector, String> {
        Selector::parse(s, true)
    }

    fn parse(s: &str, fields: bool) -> Result<Selector, String> {
        let mut terms = Vec::new();
        for t in s.split(',').filter(|t| !t.is_empty()) {
            let term = if let Some((k, v)) = t.split_once("!=") {
                Term::IsNot(k.into(), v.into())
            } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                Term::Is(k.into(), v.into())
            } else if fields || t.contains([' ', '(', ')']) {
                return Err(format!("a selector term this server does not model: {t:?}"));
            } else if let Some(k) = t.strip_prefix('!') {
                Term::HasNot(k.into())
            } else {
                Term::Has(t.into())
            };
            if fields
                && !matches!(
                    term_key(&term),
                    "status.phase" | "metadata.name" | "metadata.namespace"
                )
            {
                return Err(format!("a field this server does not select on: {t:?}"));
            }
            terms.push(term);
        }
        Ok(Selector { terms, fields })
    }

    fn matches(&self, o: &Value) -> bool {
        let value = |k: &str| -> Option<String> {
            let v = match self.fields {
                true => k.split('.').fold(o, |v, part| &v[part]),
                false => &o["metadata"]["labels"][k],
            };
            v.as_str().map(str::to_string)
        };
        self.terms.iter().all(|t| match t {
            Term::Is(k, v) => value(k).as_deref() == Some(v.as_str()),
            Term::IsNot(k, v) => value(k).as_deref() != Some(v.as_str()),
            Term::Has(k) => value(k).is_some(),
            Term::HasNot(k) => value(k).is_none(),
        })
    }
}

fn term_key(t: &Term) -> &str {
    match t {
        Term::Is(k, _) | Term::IsNot(k, _) | Term::Has(k) | Term::HasNot(k) => k,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(method: Method, path: &str, query: &[(&str, &str)], body: Value) -> Call {
        Call {
            method,
            path: path.into(),
            query: query
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            accept: None,
            content_type: Some("application/json".into()),
            body,
        }
    }

    #[test]
    fn a_request_this_server_does_not_model_fails_loudly() {
        let server = ApiServer::new();
        let cases = [
            call(
                Method::GET,
                "/apis/tekton.dev/v1/namespaces/ns/taskruns/t",
                &[],
                Value::Null,
            ),
            call(
                Method::GET,
                "/api/v1/namespaces/ns/pods",
                &[("watch", "true")],
                Value::Null,
            ),
            call(
                Method::PATCH,
                "/api/v1/namespaces/ns/configmaps/c",
                &[],
                json!({}),
            ),
        ];
        for c in &cases {
            assert_eq!(server.serve(c).0, 501, "{c:?}");
        }
        assert_eq!(server.unmodelled().len(), cases.len());
    }

    #[test]
    fn pods_are_listed_by_label_and_phase_as_metadata() {
        let server = ApiServer::new();
        let pod = |name: &str, pr: &str, phase: &str| {
            let key = ObjKey::new(Kind::Pod, "ns", name);
            let body = json!({"metadata": {"labels": {"tekton.dev/pipelineRun": pr}}, "status": {"phase": phase}});
            server.store().create(&key, body, Actor::World).unwrap();
        };
        pod("a-1", "a", "Running");
        pod("a-2", "a", "Succeeded");
        pod("b-1", "b", "Running");
        let mut list = call(
            Method::GET,
            "/api/v1/namespaces/ns/pods",
            &[
                ("labelSelector", "tekton.dev/pipelineRun=a"),
                (
                    "fieldSelector",
                    "status.phase!=Succeeded,status.phase!=Failed",
                ),
            ],
            Value::Null,
        );
        list.accept = Some(METADATA_LIST.into());
        let (code, answer) = server.serve(&list);
        assert_eq!(code, 200);
        assert_eq!(answer["kind"], "PartialObjectMetadataList");
        let names: Vec<&str> = answer["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a-1"]);
        assert!(server.unmodelled().is_empty());
    }
}
