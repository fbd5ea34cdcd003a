//! The watch between the fake API server and an incarnation's caches, and its
//! two faults:
//!
//! - **stale**: after the caches have shown version N' of an object for a
//!   whole pass, they show its previous version N (or its absence, before it
//!   was created; or it again, after it was deleted) for one pass, as a relist
//!   from a second, lagging API server would; then the watch catches up. With
//!   `restart`, the controller restarts at that moment and its first list comes
//!   from the lagging server (memos lost, and the object stale).
//! - **unobserved**: one watch event is held back until the next event of the
//!   same object arrives, and then dropped: the cache never shows that version
//!   (a run created then deleted, a PipelineRun running then done). If no next
//!   event comes before the system is quiet, the held event is delivered: the
//!   plan was only a lag.
//!
//! Only what a watch feeds is made stale. The controller's own GETs and LISTs
//! carry no resourceVersion, so kube-apiserver serves them from etcd (a quorum
//! read): a lagging API server cannot serve them stale, and this suite does not.

use super::incarnation::Feed;
use super::store::{Change, Kind, ObjKey, Store};
use serde_json::Value;
use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq)]
pub enum WatchPlan {
    None,
    /// Make the `nth` delivered event of `kind` stale (0-based, counting per kind).
    Stale {
        kind: Kind,
        nth: usize,
        restart: bool,
    },
    /// Never show the `nth` delivered event of `kind`.
    Unobserved {
        kind: Kind,
        nth: usize,
    },
}

/// One watch event as delivered, for choosing plans from a fault-free run.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub kind: Kind,
    pub nth: usize,
    pub key: ObjKey,
    /// Its place in the change log.
    pub at: usize,
}

/// What became of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fired {
    No,
    /// Unobserved: the event is held, waiting for the next one of its object.
    Holding,
    /// Done as planned: the version was served stale, or the event dropped.
    Yes,
    /// Unobserved, but no later event came: delivered late instead.
    Lagged,
}

enum Stale {
    Idle,
    /// N' is in the cache; at the end of this pass, N is served.
    Armed {
        key: ObjKey,
        previous: Option<Value>,
    },
    /// N is in the cache for this pass; then the watch catches up.
    Served {
        key: ObjKey,
    },
}

/// What the harness must do after a pass.
pub enum Next {
    Continue,
    /// Restart the controller, its first list being these objects.
    Restart(Vec<(ObjKey, Value)>),
}

pub struct Watch {
    plan: WatchPlan,
    counts: BTreeMap<Kind, usize>,
    pub deliveries: Vec<Delivery>,
    held: Option<Change>,
    stale: Stale,
    pub fired: Fired,
}

impl Watch {
    pub fn new(plan: WatchPlan) -> Watch {
        Watch {
            plan,
            counts: BTreeMap::new(),
            deliveries: Vec::new(),
            held: None,
            stale: Stale::Idle,
            fired: Fired::No,
        }
    }

    /// Bring the caches up to the log's end, with this plan's fault.
    pub fn deliver(&mut self, feed: &mut Feed, log: &[Change]) {
        while feed.cursor < log.len() {
            let at = feed.cursor;
            let c = &log[at];
            feed.cursor += 1;
            if !c.key.kind.cached() {
                continue;
            }
            let nth = self.count(c, at);
            if self.held.as_ref().is_some_and(|h| h.key == c.key) {
                // The next event of the held object: the held one is never shown.
                self.held = None;
                self.fired = Fired::Yes;
            } else if self.plan
                == (WatchPlan::Unobserved {
                    kind: c.key.kind,
                    nth,
                })
            {
                self.held = Some(c.clone());
                self.fired = Fired::Holding;
                continue;
            } else if matches!(self.plan, WatchPlan::Stale { kind, nth: n, .. } if kind == c.key.kind && n == nth)
            {
                let previous = previous_version(log, at);
                self.stale = Stale::Armed {
                    key: c.key.clone(),
                    previous,
                };
            }
            feed.deliver(c);
        }
    }

    fn count(&mut self, c: &Change, at: usize) -> usize {
        let n = self.counts.entry(c.key.kind).or_default();
        let nth = *n;
        *n += 1;
        self.deliveries.push(Delivery {
            kind: c.key.kind,
            nth,
            key: c.key.clone(),
            at,
        });
        nth
    }

    /// After a whole pass: serve the stale version, or catch up after it.
    pub fn after_pass(&mut self, feed: &mut Feed, store: &Store) -> Next {
        match std::mem::replace(&mut self.stale, Stale::Idle) {
            Stale::Idle => Next::Continue,
            Stale::Armed { key, previous } => {
                self.fired = Fired::Yes;
                self.stale = Stale::Served { key: key.clone() };
                let restart = matches!(self.plan, WatchPlan::Stale { restart: true, .. });
                if restart {
                    return Next::Restart(lagging_list(store, &key, previous));
                }
                match &previous {
                    Some(v) => feed.apply(&key, v, false),
                    None => match store.get(&key) {
                        Some(now) => feed.apply(&key, now, true),
                        None => feed.apply(&key, &last_version(store.log(), &key), true),
                    },
                }
                Next::Continue
            }
            Stale::Served { key } => {
                let log = store.log();
                let seen = &log[..feed.cursor];
                if let Some(c) = seen.iter().rev().find(|c| c.key == key) {
                    feed.deliver(c);
                }
                Next::Continue
            }
        }
    }

    /// A stale version is being served, or about to be: not quiet yet.
    pub fn busy(&self) -> bool {
        !matches!(self.stale, Stale::Idle)
    }

    /// Quiet with an event still held: it was only late. True if one was.
    pub fn release_held(&mut self, feed: &mut Feed) -> bool {
        let Some(c) = self.held.take() else {
            return false;
        };
        feed.deliver(&c);
        self.fired = Fired::Lagged;
        true
    }
}

/// The version of `log[at]`'s object before that change; None if it did not exist.
fn previous_version(log: &[Change], at: usize) -> Option<Value> {
    let key = &log[at].key;
    let before = log[..at].iter().rev().find(|c| &c.key == key)?;
    (!before.deleted).then(|| before.object.clone())
}

fn last_version(log: &[Change], key: &ObjKey) -> Value {
    log.iter()
        .rev()
        .find(|c| &c.key == key)
        .map(|c| c.object.clone())
        .expect("a stale object has a history")
}

/// What a lagging API server lists: every cached kind as it is now, except
/// `key`, at its previous version (or absent).
fn lagging_list(store: &Store, key: &ObjKey, previous: Option<Value>) -> Vec<(ObjKey, Value)> {
    let mut objects = current_objects(store);
    objects.retain(|(k, _)| k != key);
    if let Some(v) = previous {
        objects.push((key.clone(), v));
    }
    objects
}

/// Every object of a cached kind, as the API server has it now.
pub fn current_objects(store: &Store) -> Vec<(ObjKey, Value)> {
    let mut objects = Vec::new();
    for kind in [
        Kind::Mutex,
        Kind::ClusterMutex,
        Kind::CustomRun,
        Kind::PipelineRun,
    ] {
        for o in store.list(kind, None) {
            let ns = o["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            objects.push((ObjKey::new(kind, ns, name), o.clone()));
        }
    }
    objects
}
