//! The oracle: the four properties, read from the fake API server's history
//! and final objects alone (never from the controller), and the summary a
//! run is compared on with the fault-free run of its scenario.
//!
//! - **Exclusion**: per lock, the PipelineRuns whose critical section (their
//!   deploy pod) is alive never exceed its capacity, at any point of the history.
//!   A PipelineRun whose hold a person released by force no longer counts from
//!   the request on: `release --force` gives its slot to the next waiter at once,
//!   by design (its fencing token is what stops a late deploy of it).
//! - **Fencing**: per lock, tokens strictly increase in grant order (above any
//!   token handed out before the scenario), and no token goes to two PipelineRuns.
//! - **Supersede**: no run older than a granted run of its group (with
//!   supersede on) is granted later.
//! - **No lost waiter**: once the system is quiet, no lock run waits while its
//!   PipelineRun runs and its lock (there, not being deleted, not frozen) has a
//!   free slot; at the end, none waits at all.

use super::store::{Actor, Change, Kind, ObjKey, Store};
use super::world::{self, LockId, World};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A lock run told `Acquired`: which PipelineRun got which token of which lock.
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub lock: LockId,
    /// `namespace/name`
    pub pipeline_run: String,
    pub pipeline_run_uid: String,
    pub token: i64,
    pub rv: u64,
}

/// What the oracle needs to know of a scenario besides its history.
pub struct Facts<'a> {
    pub world: &'a World,
    pub capacity: &'a BTreeMap<LockId, u32>,
    /// Tokens handed out before the scenario began (the ledger it starts with).
    pub prior: &'a BTreeMap<LockId, i64>,
}

impl Facts<'_> {
    fn capacity(&self, lock: &LockId) -> u32 {
        self.capacity.get(lock).copied().unwrap_or(1)
    }

    /// The locks a PipelineRun `ns/name` takes, by the scenario.
    fn locks_of(&self, pipeline_run: &str) -> Vec<LockId> {
        self.world
            .prs
            .iter()
            .find(|p| format!("{}/{}", p.namespace, p.name) == pipeline_run)
            .map(|p| p.locks())
            .unwrap_or_default()
    }
}

/// Every grant in the history, in the order the API server took them.
pub fn grants(log: &[Change]) -> Vec<Grant> {
    let mut acquired: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for c in log.iter().filter(|c| c.key.kind == Kind::CustomRun) {
        let uid = c.object["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let now = !c.deleted && is_acquired(&c.object);
        if now && acquired.insert(uid.clone()) && c.actor == Actor::Controller {
            out.extend(grants_of(c));
        }
    }
    out
}

fn is_acquired(run: &Value) -> bool {
    let c = &run["status"]["conditions"][0];
    c["status"] == "True" && c["reason"] == "Acquired"
}

fn result<'a>(run: &'a Value, name: &str) -> Option<&'a str> {
    run["status"]["results"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)?["value"]
        .as_str()
}

/// The grants one `Acquired` status makes: one per key of the run.
fn grants_of(c: &Change) -> Vec<Grant> {
    let run = &c.object;
    let ns = run["metadata"]["namespace"].as_str().unwrap_or_default();
    let owner = &run["metadata"]["ownerReferences"][0];
    let cluster = run["spec"]["customRef"]["kind"] == "ClusterMutex";
    let lock = |name: &str| match cluster {
        true => LockId::cluster(name),
        false => LockId {
            cluster: false,
            namespace: ns.into(),
            name: name.into(),
        },
    };
    let tokens: BTreeMap<String, i64> = match result(run, "tokens") {
        Some(t) => serde_json::from_str(t).unwrap_or_default(),
        None => {
            let key = result(run, "key").unwrap_or_default().to_string();
            let token = result(run, "token")
                .and_then(|t| t.parse().ok())
                .unwrap_or(0);
            BTreeMap::from([(key, token)])
        }
    };
    tokens
        .into_iter()
        .map(|(key, token)| Grant {
            lock: lock(&key),
            pipeline_run: format!("{ns}/{}", owner["name"].as_str().unwrap_or_default()),
            pipeline_run_uid: owner["uid"].as_str().unwrap_or_default().into(),
            token,
            rv: c.rv,
        })
        .collect()
}

/// Exclusion, over every point of the history.
pub fn exclusion(log: &[Change], facts: &Facts<'_>) -> Vec<String> {
    let mut live: BTreeMap<ObjKey, String> = BTreeMap::new();
    let mut violations = Vec::new();
    for c in log.iter().filter(|c| c.key.kind == Kind::Pod) {
        let running = !c.deleted && c.object["status"]["phase"] == "Running";
        let pr = c.object["metadata"]["labels"]["tekton.dev/pipelineRun"]
            .as_str()
            .unwrap_or_default();
        match running {
            true => live.insert(c.key.clone(), format!("{}/{pr}", c.key.namespace)),
            false => live.remove(&c.key),
        };
        let released = |pr: &str| {
            facts
                .world
                .released
                .iter()
                .any(|(r, rv)| r == pr && *rv <= c.rv)
        };
        let mut per_lock: BTreeMap<LockId, BTreeSet<&String>> = BTreeMap::new();
        for pr in live.values().filter(|pr| !released(pr)) {
            for lock in facts.locks_of(pr) {
                per_lock.entry(lock).or_default().insert(pr);
            }
        }
        for (lock, prs) in per_lock {
            if prs.len() > facts.capacity(&lock) as usize {
                violations.push(format!(
                    "Exclusion: at rv {}, {lock} has {} live sections: {prs:?}",
                    c.rv,
                    prs.len()
                ));
            }
        }
    }
    violations
}

/// Fencing, over the grants in order.
pub fn fencing(grants: &[Grant], facts: &Facts<'_>) -> Vec<String> {
    let mut owner: BTreeMap<(&LockId, i64), &str> = BTreeMap::new();
    let mut top: BTreeMap<&LockId, i64> = facts.prior.iter().map(|(l, t)| (l, *t)).collect();
    let mut held: BTreeMap<(&LockId, &str), i64> = BTreeMap::new();
    let mut violations = Vec::new();
    for g in grants {
        let id = g.pipeline_run_uid.as_str();
        if let Some(t) = held.get(&(&g.lock, id)) {
            if *t != g.token {
                violations.push(format!(
                    "Fencing: {} holds {} with tokens {t} and {}",
                    g.pipeline_run, g.lock, g.token
                ));
            }
            continue;
        }
        if let Some(other) = owner.get(&(&g.lock, g.token)) {
            violations.push(format!(
                "Fencing: token {} of {} went to {other} and to {}",
                g.token, g.lock, g.pipeline_run
            ));
        }
        let last = top.get(&g.lock).copied().unwrap_or(0);
        if g.token <= last {
            violations.push(format!(
                "Fencing: {} got token {} of {} after token {last}",
                g.pipeline_run, g.token, g.lock
            ));
        }
        owner.insert((&g.lock, g.token), &g.pipeline_run);
        held.insert((&g.lock, id), g.token);
        top.insert(&g.lock, last.max(g.token));
    }
    violations
}

/// Supersede: a grant never goes to a run older than one its group was granted before.
pub fn supersede(grants: &[Grant], store_log: &[Change], facts: &Facts<'_>) -> Vec<String> {
    let age = |pr: &str| -> Option<(String, String)> {
        let (ns, name) = pr.split_once('/')?;
        let key = ObjKey::new(Kind::PipelineRun, ns, name);
        let first = store_log.iter().find(|c| c.key == key)?;
        let created = first.object["metadata"]["creationTimestamp"]
            .as_str()?
            .to_string();
        Some((created, name.to_string()))
    };
    let group = |pr: &str| {
        let def = facts
            .world
            .prs
            .iter()
            .find(|p| format!("{}/{}", p.namespace, p.name) == pr)?;
        def.supersedes()
            .then(|| format!("{}/{}", def.namespace, def.group))
    };
    let mut violations = Vec::new();
    for (i, g) in grants.iter().enumerate() {
        let Some(mine) = group(&g.pipeline_run) else {
            continue;
        };
        for earlier in &grants[..i] {
            let same =
                earlier.lock == g.lock && group(&earlier.pipeline_run).as_ref() == Some(&mine);
            if same
                && earlier.pipeline_run != g.pipeline_run
                && age(&earlier.pipeline_run) > age(&g.pipeline_run)
            {
                violations.push(format!(
                    "Supersede: {} was granted {} after the newer {} of its group",
                    g.pipeline_run, g.lock, earlier.pipeline_run
                ));
            }
        }
    }
    violations
}

/// No lost waiter, at a quiet point: `end` says the scenario is over, and nothing may wait.
pub fn lost_waiters(store: &Store, grants: &[Grant], facts: &Facts<'_>, end: bool) -> Vec<String> {
    let multi: BTreeSet<LockId> = facts
        .world
        .prs
        .iter()
        .filter(|p| p.locks().len() > 1)
        .flat_map(|p| p.locks())
        .collect();
    let mut violations = Vec::new();
    for pr in &facts.world.prs {
        let Some(obj) = store.get(&pr.key()) else {
            continue;
        };
        let Some(run) = store.get(&pr.run_key()) else {
            continue;
        };
        let run_done = matches!(
            run["status"]["conditions"][0]["status"].as_str(),
            Some("True" | "False")
        );
        if world::done(obj) || !obj["spec"]["status"].is_null() || run_done {
            continue;
        }
        let locks = pr.locks();
        // A lock that is gone, being deleted or frozen keeps its waiters waiting, rightly.
        let open = |l: &LockId| {
            store.get(&l.key()).is_some_and(|o| {
                o["metadata"]["deletionTimestamp"].is_null() && o["spec"]["frozen"] != true
            })
        };
        let free = |l: &LockId| open(l) && holders(store, grants, l) < facts.capacity(l) as usize;
        let waits = match end {
            true => true,
            false => locks.len() == 1 && !multi.contains(&locks[0]) && free(&locks[0]),
        };
        if waits {
            let why = if end {
                "at the end"
            } else {
                "while its lock has a free slot"
            };
            violations.push(format!(
                "No lost waiter: {}/{} still waits {why}",
                pr.namespace, pr.name
            ));
        }
    }
    violations
}

/// The PipelineRuns granted `lock` that still hold it: running, or a pod of theirs alive.
fn holders(store: &Store, grants: &[Grant], lock: &LockId) -> usize {
    let mut holding = BTreeSet::new();
    for g in grants.iter().filter(|g| &g.lock == lock) {
        let Some((ns, name)) = g.pipeline_run.split_once('/') else {
            continue;
        };
        let Some(pr) = store.get(&ObjKey::new(Kind::PipelineRun, ns, name)) else {
            continue;
        };
        let pod = store.get(&ObjKey::new(Kind::Pod, ns, &format!("{name}-deploy-pod")));
        let alive = pod.is_some_and(|p| p["status"]["phase"] == "Running");
        if pr["metadata"]["uid"] == g.pipeline_run_uid.as_str() && (!world::done(pr) || alive) {
            holding.insert(&g.pipeline_run);
        }
    }
    holding.len()
}

/// The token floor: once quiet, every lock without the finalizer has its last
/// token in the ledger, and so does every lock that is gone (a new lock of its
/// name starts above it).
pub fn floors(store: &Store, grants: &[Grant]) -> Vec<String> {
    let ledger = |lock: &LockId| -> i64 {
        let (ns, entry) = match lock.cluster {
            true => (
                super::incarnation::LEDGER_NAMESPACE,
                format!("clustermutex.{}", lock.name),
            ),
            false => (lock.namespace.as_str(), format!("mutex.{}", lock.name)),
        };
        let key = ObjKey::new(
            Kind::ConfigMap,
            ns,
            crate::controller::reconcile::token_floor::LEDGER,
        );
        store
            .get(&key)
            .and_then(|cm| cm["data"][&entry].as_str()?.parse().ok())
            .unwrap_or(0)
    };
    let mut last: BTreeMap<&LockId, i64> = BTreeMap::new();
    for g in grants {
        let t = last.entry(&g.lock).or_default();
        *t = (*t).max(g.token);
    }
    let mut violations = Vec::new();
    for (lock, token) in last {
        let object = store.get(&lock.key());
        let protected = object.is_some_and(|o| {
            o["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        });
        if !protected && ledger(lock) < token {
            violations.push(format!(
                "Fencing: {lock} is unprotected or gone, its token {token} above the ledger's {}",
                ledger(lock)
            ));
        }
    }
    violations
}

/// What a run is compared on with the fault-free run of its scenario: the
/// grants (who got a lock, in which order) and the final state of every object
/// that matters, without times and resourceVersions. Tokens are compared by
/// rank, not value: a slot kept for a run of several keys and given back burns
/// its token, and a fault may make one more such slot (the Fencing check, not
/// this one, is what holds tokens to their rules).
pub fn summary(store: &Store, grants: &[Grant]) -> Vec<String> {
    let mut ranks: BTreeMap<&LockId, BTreeSet<i64>> = BTreeMap::new();
    for g in grants {
        ranks.entry(&g.lock).or_default().insert(g.token);
    }
    let rank = |g: &Grant| {
        ranks[&g.lock]
            .iter()
            .position(|t| *t == g.token)
            .unwrap_or(0)
            + 1
    };
    let mut lines: Vec<String> = grants
        .iter()
        .map(|g| format!("grant {} {} token #{}", g.lock, g.pipeline_run, rank(g)))
        .collect();
    for kind in [
        Kind::Mutex,
        Kind::ClusterMutex,
        Kind::CustomRun,
        Kind::PipelineRun,
        Kind::ConfigMap,
    ] {
        for o in store.list(kind, None) {
            lines.push(format!(
                "{kind:?} {}/{}: {}",
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or(""),
                object_summary(kind, o)
            ));
        }
    }
    lines
}

fn object_summary(kind: Kind, o: &Value) -> String {
    let m = &o["metadata"];
    let keys = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default()
    };
    match kind {
        Kind::Mutex | Kind::ClusterMutex => {
            let st = &o["status"];
            let names = |list: &Value| -> Vec<String> {
                list.as_array()
                    .into_iter()
                    .flatten()
                    .map(|e| {
                        e["pipelineRun"]
                            .as_str()
                            .unwrap_or(e["run"]["name"].as_str().unwrap_or("?"))
                            .to_string()
                    })
                    .collect()
            };
            let verdicts: Vec<String> = st["observedRequests"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    format!(
                        "{}={}",
                        r["id"].as_str().unwrap_or(""),
                        r["verdict"].as_str().unwrap_or("")
                    )
                })
                .collect();
            format!(
                "deleting={} finalizers={} annotations={:?} holders={:?} queue={:?} reserved={:?} requests={verdicts:?}",
                !m["deletionTimestamp"].is_null(),
                m["finalizers"],
                keys(&m["annotations"]),
                names(&st["holders"]),
                names(&st["queue"]),
                names(&st["reservations"])
            )
        }
        Kind::CustomRun => {
            let c = &o["status"]["conditions"][0];
            // Not its spec.status: Tekton's, written whenever Tekton gets to it.
            format!("{}/{}", c["status"], c["reason"])
        }
        Kind::PipelineRun => {
            let c = &o["status"]["conditions"][0];
            format!(
                "{}/{} spec.status={} annotations={:?}",
                c["status"],
                c["reason"],
                o["spec"]["status"],
                keys(&m["annotations"])
            )
        }
        _ => format!("entries {:?}", keys(&o["data"])),
    }
}

/// Checks of the checker: each property catches the history that breaks it.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::tests::sieve::world::{Lock, Pr};

    fn world(prs: &[&'static str]) -> World {
        let mut w = World::default();
        w.prs = prs
            .iter()
            .map(|n| Pr {
                group: "deploy",
                ..Pr::new(n, Lock::Key("k"))
            })
            .collect();
        w
    }

    fn pod(s: &mut Store, pr: &str, phase: &str) {
        let key = ObjKey::new(Kind::Pod, "ns", &format!("{pr}-deploy-pod"));
        let body = json!({"metadata": {"labels": {"tekton.dev/pipelineRun": pr}}, "status": {"phase": phase}});
        match s.get(&key) {
            None => drop(s.create(&key, body, Actor::World)),
            Some(_) => drop(s.edit(&key, |p| p["status"]["phase"] = json!(phase))),
        }
    }

    fn granted(s: &mut Store, pr: &str, token: i64) {
        let key = ObjKey::new(Kind::CustomRun, "ns", &format!("{pr}-lock"));
        let run = json!({"metadata": {"ownerReferences": [{"name": pr, "uid": format!("{pr}-uid")}]},
                         "spec": {"customRef": {"kind": "Mutex"}}});
        s.create(&key, run, Actor::World).unwrap();
        let acquired = json!({"status": {"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
                              "results": [{"name": "key", "value": "k"}, {"name": "token", "value": token.to_string()}]}});
        s.merge_patch(&key, &acquired, true, Actor::Controller)
            .unwrap();
    }

    use serde_json::json;

    fn facts<'a>(
        w: &'a World,
        capacity: &'a BTreeMap<LockId, u32>,
        prior: &'a BTreeMap<LockId, i64>,
    ) -> Facts<'a> {
        Facts {
            world: w,
            capacity,
            prior,
        }
    }

    #[test]
    fn exclusion_catches_two_live_sections_and_spares_a_forced_release() {
        let (cap, prior) = (BTreeMap::new(), BTreeMap::new());
        let mut w = world(&["a", "b"]);
        let mut s = Store::default();
        pod(&mut s, "a", "Running");
        pod(&mut s, "b", "Running");
        pod(&mut s, "a", "Succeeded");
        let v = exclusion(s.log(), &facts(&w, &cap, &prior));
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].starts_with("Exclusion: at rv 2"), "{v:?}");
        w.released.push(("ns/a".into(), 1));
        assert!(exclusion(s.log(), &facts(&w, &cap, &prior)).is_empty());
    }

    #[test]
    fn fencing_catches_a_token_reused_or_lower_and_the_floor() {
        let cap = BTreeMap::new();
        let prior = BTreeMap::from([(LockId::mutex("k"), 5)]);
        let w = world(&["a", "b", "c"]);
        let mut s = Store::default();
        granted(&mut s, "a", 6);
        granted(&mut s, "b", 6);
        granted(&mut s, "c", 4);
        let g = grants(s.log());
        assert_eq!(g.iter().map(|g| g.token).collect::<Vec<_>>(), [6, 6, 4]);
        let v = fencing(&g, &facts(&w, &cap, &prior));
        assert_eq!(v.len(), 3, "reused (and so not above 6), then below: {v:?}");
        assert!(v[0].contains("went to ns/a and to ns/b"), "{v:?}");
        let gone = floors(&s, &g);
        assert_eq!(
            gone.len(),
            1,
            "Mutex k is gone and no ledger has token 6: {gone:?}"
        );
    }

    #[test]
    fn supersede_catches_an_older_run_granted_after_a_newer_one() {
        let (cap, prior) = (BTreeMap::new(), BTreeMap::new());
        let w = world(&["old", "new"]);
        let mut s = Store::default();
        for pr in ["old", "new"] {
            s.create(
                &ObjKey::new(Kind::PipelineRun, "ns", pr),
                json!({}),
                Actor::World,
            )
            .unwrap();
        }
        granted(&mut s, "new", 1);
        granted(&mut s, "old", 2);
        let v = supersede(&grants(s.log()), s.log(), &facts(&w, &cap, &prior));
        assert_eq!(
            v,
            ["Supersede: ns/old was granted Mutex ns/k after the newer ns/new of its group"]
        );
    }

    #[test]
    fn a_waiter_left_waiting_is_lost() {
        let (cap, prior) = (BTreeMap::new(), BTreeMap::new());
        let w = world(&["a"]);
        let mut s = Store::default();
        s.create(
            &ObjKey::new(Kind::PipelineRun, "ns", "a"),
            json!({}),
            Actor::World,
        )
        .unwrap();
        let waiting = json!({"status": {"conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "Waiting"}]}});
        s.create(
            &ObjKey::new(Kind::CustomRun, "ns", "a-lock"),
            waiting,
            Actor::World,
        )
        .unwrap();
        let f = facts(&w, &cap, &prior);
        assert!(
            lost_waiters(&s, &[], &f, false).is_empty(),
            "no Mutex to be granted by yet"
        );
        let mutex = ObjKey::new(Kind::Mutex, "ns", "k");
        s.create(&mutex, json!({"spec": {"frozen": true}}), Actor::World)
            .unwrap();
        assert!(
            lost_waiters(&s, &[], &f, false).is_empty(),
            "a frozen key grants nothing"
        );
        s.edit(&mutex, |m| m["spec"]["frozen"] = json!(false));
        assert_eq!(lost_waiters(&s, &[], &f, false).len(), 1, "the key is free");
        assert_eq!(
            lost_waiters(&s, &[], &f, true).len(),
            1,
            "the scenario is over"
        );
    }
}
