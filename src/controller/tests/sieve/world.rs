//! The world around the controller, kept small and explicit: people who create,
//! finish, cancel and delete things, and a stand-in for Tekton, the kubelet and
//! the garbage collector. It is a mock of the few behaviours the product
//! depends on, not evidence of how Tekton behaves (the cluster tests are that):
//!
//! - a new PipelineRun is marked running, then gets its lock CustomRun, then
//!   lists it in `status.childReferences` (three steps, as Tekton writes them);
//! - a lock run told `Acquired` starts the PipelineRun's critical section: one
//!   pod, `Running` until a person lets that deploy finish; then the pod
//!   succeeds and the PipelineRun with it;
//! - a lock run that ends any other way fails its PipelineRun;
//! - a PipelineRun asked to stop (`spec.status`) is done at once, its live lock
//!   run is asked to cancel (`spec.status: RunCancelled`), and its pod, if one
//!   runs, keeps running one more step (a grace period) before it fails;
//! - the garbage collector deletes a deleted PipelineRun's runs and pods.
//!
//! A deleted lock run is not created again, and a pod is the only thing that
//! runs: no TaskRuns (so no `release-after`).

use super::store::{Actor, Kind, ObjKey, Store};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The namespace of the Mutex scenarios.
pub const NS: &str = "ns";

/// A lock, as the oracle names it: a Mutex of a namespace, or a ClusterMutex.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockId {
    pub cluster: bool,
    pub namespace: String,
    pub name: String,
}

impl LockId {
    pub fn mutex(name: &str) -> LockId {
        LockId {
            cluster: false,
            namespace: NS.into(),
            name: name.into(),
        }
    }

    pub fn cluster(name: &str) -> LockId {
        LockId {
            cluster: true,
            namespace: String::new(),
            name: name.into(),
        }
    }

    pub fn key(&self) -> ObjKey {
        let kind = if self.cluster {
            Kind::ClusterMutex
        } else {
            Kind::Mutex
        };
        ObjKey::new(kind, &self.namespace, &self.name)
    }
}

impl std::fmt::Display for LockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cluster {
            true => write!(f, "ClusterMutex {}", self.name),
            false => write!(f, "Mutex {}/{}", self.namespace, self.name),
        }
    }
}

/// What a PipelineRun's lock task takes.
#[derive(Clone, Debug)]
pub enum Lock {
    /// A Mutex by param `key`.
    Key(&'static str),
    /// Several Mutexes by param `keys` ("a,b").
    Keys(&'static str),
    /// A ClusterMutex by name.
    Cluster(&'static str),
}

/// A PipelineRun a person starts: one lock task, then a deploy.
#[derive(Clone, Debug)]
pub struct Pr {
    pub name: &'static str,
    pub namespace: &'static str,
    /// Its Pipeline (the `tekton.dev/pipeline` label): the supersede group.
    pub group: &'static str,
    pub lock: Lock,
    /// The lock task's other params (`supersede`, `priority`, ...).
    pub params: &'static [(&'static str, &'static str)],
    /// The lock run's `spec.timeout`.
    pub timeout: Option<&'static str>,
}

impl Pr {
    pub fn new(name: &'static str, lock: Lock) -> Pr {
        Pr {
            name,
            namespace: NS,
            // A Pipeline of its own: no supersede unless a scenario groups runs.
            group: name,
            lock,
            params: &[],
            timeout: None,
        }
    }

    pub fn locks(&self) -> Vec<LockId> {
        let of = |name: &str| LockId {
            cluster: false,
            namespace: self.namespace.into(),
            name: name.into(),
        };
        match self.lock {
            Lock::Key(k) => vec![of(k)],
            Lock::Keys(ks) => ks.split(',').map(of).collect(),
            Lock::Cluster(c) => vec![LockId::cluster(c)],
        }
    }

    pub fn supersedes(&self) -> bool {
        self.params
            .iter()
            .any(|(k, v)| *k == "supersede" && *v != "none")
            || !self.params.iter().any(|(k, _)| *k == "supersede")
    }

    pub fn key(&self) -> ObjKey {
        ObjKey::new(Kind::PipelineRun, self.namespace, self.name)
    }

    pub fn run_key(&self) -> ObjKey {
        ObjKey::new(
            Kind::CustomRun,
            self.namespace,
            &format!("{}-lock", self.name),
        )
    }

    pub fn pod_key(&self) -> ObjKey {
        ObjKey::new(
            Kind::Pod,
            self.namespace,
            &format!("{}-deploy-pod", self.name),
        )
    }
}

/// What a person does at the start of a phase.
#[derive(Clone, Debug)]
pub enum Action {
    Create(Pr),
    /// Let this PipelineRun's deploy end (now, or as soon as it runs).
    Finish(&'static str),
    Cancel(&'static str),
    DeleteLockRun(&'static str),
    DeletePr(&'static str),
    /// Delete this PipelineRun as soon as Tekton has created its lock run.
    Abandon(&'static str),
    DeleteLock(LockId),
    /// A queue-control request (`tkn mutex ...`): an annotation on the lock.
    Request(LockId, &'static str, Value),
    /// `tkn mutex freeze` (true) or `unfreeze` (false): the lock's `spec.frozen`.
    Freeze(LockId, bool),
    /// An object a person applies (a Mutex, a ClusterMutex, a ledger).
    Apply(ObjKey, Value),
}

/// The world's memory: which PipelineRuns exist in the scenario, what people asked.
#[derive(Default)]
pub struct World {
    pub prs: Vec<Pr>,
    /// PipelineRuns (`namespace/name`) whose hold a person released by force
    /// (`tkn mutex release --force`), and the resourceVersion from which on.
    pub released: Vec<(String, u64)>,
    finish: BTreeSet<String>,
    abandon: BTreeSet<String>,
    runs_created: BTreeSet<String>,
    terminating: BTreeSet<String>,
}

impl World {
    pub fn pr(&self, name: &str) -> &Pr {
        self.prs
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("the scenario names PipelineRun {name} before creating it"))
    }

    pub fn act(&mut self, s: &mut Store, action: &Action) {
        match action {
            Action::Create(pr) => {
                let labels = json!({"tekton.dev/pipeline": pr.group});
                let obj = json!({"metadata": {"labels": labels}, "spec": {"pipelineRef": {"name": pr.group}}});
                create(s, &pr.key(), obj);
                self.prs.push(pr.clone());
            }
            Action::Finish(name) => drop(self.finish.insert(name.to_string())),
            Action::Cancel(name) => {
                s.edit(&self.pr(name).key(), |p| {
                    p["spec"]["status"] = json!("Cancelled")
                });
            }
            Action::DeleteLockRun(name) => delete(s, &self.pr(name).run_key()),
            Action::DeletePr(name) => delete(s, &self.pr(name).key()),
            Action::Abandon(name) => drop(self.abandon.insert(name.to_string())),
            Action::DeleteLock(id) => delete(s, &id.key()),
            Action::Request(id, request_id, body) => {
                let key = format!("{}{request_id}", crate::core::requests::REQUEST_PREFIX);
                let value = serde_json::to_string(body).expect("a request serializes");
                s.edit(&id.key(), |l| {
                    l["metadata"]["annotations"][&key] = json!(value)
                });
                if body["action"] == "release" && body["force"] == true {
                    let ns = if id.cluster {
                        ""
                    } else {
                        id.namespace.as_str()
                    };
                    let pr = body["pipelineRun"].as_str().unwrap_or_default();
                    self.released
                        .push((format!("{ns}/{pr}"), s.resource_version()));
                }
            }
            Action::Apply(key, obj) => create(s, key, obj.clone()),
            Action::Freeze(id, frozen) => {
                s.edit(&id.key(), |l| {
                    l["spec"]["frozen"] = json!(frozen);
                    l["spec"]["frozenReason"] = json!("change freeze");
                });
            }
        }
    }

    /// One step of Tekton, the kubelet and the garbage collector: each
    /// PipelineRun moves at most one step. True if anything changed.
    pub fn tekton(&mut self, s: &mut Store) -> bool {
        let mut changed = self.collect_garbage(s);
        for pr in self.prs.clone() {
            changed |= self.step(s, &pr);
        }
        changed
    }

    fn step(&mut self, s: &mut Store, pr: &Pr) -> bool {
        let Some(obj) = s.get(&pr.key()).cloned() else {
            return false;
        };
        let run = s.get(&pr.run_key()).cloned();
        let pod_running = s
            .get(&pr.pod_key())
            .is_some_and(|p| p["status"]["phase"] == "Running");
        if run.is_some() && self.abandon.remove(pr.name) {
            delete(s, &pr.key());
            return true;
        }
        if obj["status"].is_null() {
            let running =
                json!({"conditions": [condition("Unknown", "Running")], "childReferences": []});
            return edit(s, &pr.key(), |p| p["status"] = running);
        }
        if self.terminating.remove(pr.name) {
            return edit(s, &pr.pod_key(), |p| p["status"]["phase"] = json!("Failed"));
        }
        if stop_requested(&obj) && !done(&obj) {
            return self.stop(s, pr, run.as_ref(), pod_running);
        }
        if done(&obj) {
            return false;
        }
        if run.is_none() && self.runs_created.insert(pr.name.to_string()) {
            create(s, &pr.run_key(), lock_run(pr, &obj));
            return true;
        }
        if run.is_some() && !lists(&obj, pr) {
            let child = json!({"apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
                               "name": pr.run_key().name, "pipelineTaskName": "lock"});
            return edit(s, &pr.key(), |p| {
                push(&mut p["status"]["childReferences"], child)
            });
        }
        self.section(s, pr, run.as_ref(), pod_running)
    }

    /// The lock task's outcome moves the PipelineRun on: its deploy runs, ends, or never starts.
    fn section(&mut self, s: &mut Store, pr: &Pr, run: Option<&Value>, pod_running: bool) -> bool {
        let told = run.map(|r| &r["status"]["conditions"][0]);
        let acquired = told.is_some_and(|c| c["status"] == "True" && c["reason"] == "Acquired");
        // `wait: "false"` and taken: the lock task succeeds without the lock, and the
        // pipeline's `when` skips the deploy.
        let skipped = told.is_some_and(|c| c["status"] == "True" && c["reason"] != "Acquired");
        let failed = told.is_some_and(|c| c["status"] == "False");
        let started = s.get(&pr.pod_key()).is_some();
        if acquired && !started {
            let pod = pod_of(pr, s.get(&pr.key()).expect("a live PipelineRun"));
            create(s, &pr.pod_key(), pod);
            return true;
        }
        if pod_running && self.finish.contains(pr.name) {
            edit(s, &pr.pod_key(), |p| {
                p["status"]["phase"] = json!("Succeeded")
            });
            return edit(s, &pr.key(), |p| {
                p["status"]["conditions"] = json!([condition("True", "Succeeded")])
            });
        }
        if skipped && !started {
            return edit(s, &pr.key(), |p| {
                p["status"]["conditions"] = json!([condition("True", "Succeeded")])
            });
        }
        if failed && !started {
            return edit(s, &pr.key(), |p| {
                p["status"]["conditions"] = json!([condition("False", "Failed")])
            });
        }
        false
    }

    /// Cancelled: done at once; the live lock run is asked to cancel, a running pod gets its grace step.
    fn stop(&mut self, s: &mut Store, pr: &Pr, run: Option<&Value>, pod_running: bool) -> bool {
        let live = run.is_some_and(|r| {
            !matches!(
                r["status"]["conditions"][0]["status"].as_str(),
                Some("True" | "False")
            ) && r["spec"]["status"].is_null()
        });
        if live {
            edit(s, &pr.run_key(), |r| {
                r["spec"]["status"] = json!("RunCancelled");
                r["spec"]["statusMessage"] = json!("the PipelineRun was cancelled");
            });
        }
        if pod_running {
            self.terminating.insert(pr.name.to_string());
        }
        edit(s, &pr.key(), |p| {
            p["status"]["conditions"] = json!([condition("False", "Cancelled")])
        })
    }

    /// Runs and pods whose PipelineRun is gone go too.
    fn collect_garbage(&mut self, s: &mut Store) -> bool {
        let mut orphans = Vec::new();
        for kind in [Kind::CustomRun, Kind::Pod] {
            for o in s.list(kind, None) {
                let owner = &o["metadata"]["ownerReferences"][0];
                let ns = o["metadata"]["namespace"].as_str().unwrap_or_default();
                let pr = ObjKey::new(
                    Kind::PipelineRun,
                    ns,
                    owner["name"].as_str().unwrap_or_default(),
                );
                let alive = s
                    .get(&pr)
                    .is_some_and(|p| p["metadata"]["uid"] == owner["uid"]);
                if !owner.is_null() && !alive {
                    let name = o["metadata"]["name"].as_str().unwrap_or_default();
                    orphans.push(ObjKey::new(kind, ns, name));
                }
            }
        }
        for key in &orphans {
            delete(s, key);
        }
        !orphans.is_empty()
    }
}

fn create(s: &mut Store, key: &ObjKey, obj: Value) {
    if let Err(e) = s.create(key, obj, Actor::World) {
        panic!("the world could not create {key}: {e:?}");
    }
}

fn delete(s: &mut Store, key: &ObjKey) {
    if let Err(e) = s.delete(key, &Value::Null, Actor::World) {
        panic!("the world could not delete {key}: {e:?}");
    }
}

fn edit(s: &mut Store, key: &ObjKey, f: impl FnOnce(&mut Value)) -> bool {
    let before = s.resource_version();
    s.edit(key, f);
    s.resource_version() != before
}

fn push(list: &mut Value, item: Value) {
    match list.as_array_mut() {
        Some(items) => items.push(item),
        None => *list = json!([item]),
    }
}

fn condition(status: &str, reason: &str) -> Value {
    json!({"type": "Succeeded", "status": status, "reason": reason})
}

pub fn done(pr: &Value) -> bool {
    matches!(
        pr["status"]["conditions"][0]["status"].as_str(),
        Some("True" | "False")
    )
}

fn stop_requested(pr: &Value) -> bool {
    !pr["spec"]["status"].is_null()
}

fn lists(pr: &Value, def: &Pr) -> bool {
    pr["status"]["childReferences"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["name"] == def.run_key().name.as_str()))
}

fn owner(pr: &Value) -> Value {
    json!([{"apiVersion": "tekton.dev/v1", "kind": "PipelineRun", "name": pr["metadata"]["name"],
            "uid": pr["metadata"]["uid"], "controller": true, "blockOwnerDeletion": true}])
}

/// The CustomRun Tekton creates for the lock task.
fn lock_run(pr: &Pr, obj: &Value) -> Value {
    let mutex_ref = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
    let (custom_ref, mut params) = match pr.lock {
        Lock::Key(k) => (mutex_ref, vec![json!({"name": "key", "value": k})]),
        Lock::Keys(ks) => (mutex_ref, vec![json!({"name": "keys", "value": ks})]),
        Lock::Cluster(c) => (
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": c}),
            vec![],
        ),
    };
    params.extend(
        pr.params
            .iter()
            .map(|(k, v)| json!({"name": k, "value": v})),
    );
    let labels = json!({"tekton.dev/pipelineRun": pr.name, "tekton.dev/pipeline": pr.group,
                        "tekton.dev/pipelineTask": "lock"});
    let mut run = json!({"metadata": {"labels": labels, "ownerReferences": owner(obj)},
                         "spec": {"customRef": custom_ref, "params": params}});
    if let Some(t) = pr.timeout {
        run["spec"]["timeout"] = json!(t);
    }
    run
}

/// The pod of the PipelineRun's deploy task: its critical section.
fn pod_of(pr: &Pr, obj: &Value) -> Value {
    let labels = json!({"tekton.dev/pipelineRun": pr.name, "tekton.dev/pipelineRunUID": obj["metadata"]["uid"],
                        "tekton.dev/pipelineTask": "deploy"});
    json!({"metadata": {"labels": labels, "ownerReferences": owner(obj)}, "spec": {},
           "status": {"phase": "Running"}})
}
