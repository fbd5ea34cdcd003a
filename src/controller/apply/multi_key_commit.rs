//! Runs of several keys, on the controller side (the protocol is in
//! `crate::core::decide::multi_key`): what a run's status says (its epoch, its tokens),
//! the commit that tells it `Acquired` once every key keeps a slot for it, the
//! revoke that gives slots back, a message that is the same from every key, and
//! the intake check that its keys agree.
//!
//! The run object is the commit point: the commit and the revoke are both
//! writes to it conditional on the resourceVersion read with the epoch.

use crate::controller::apply::events;
use crate::controller::apply::writes;
use crate::controller::context::Context;
use crate::controller::context::Error;
use crate::controller::lock_object::LockObject;
use crate::core::decide::{commit_multikey, slot_for};
use crate::core::model::{MultiKeyRun, MultiKeys, Outcome, Revoke};
use crate::core::observe::ObservedRun;
use crate::core::params::RunConfig;
use crate::core::run_status::{self, Reason};
use crate::core::scope::Scope;
use crate::model::mutex::{MutexSpec, MutexStatus, RunKind, RunRef};
use crate::model::tekton::RunStatus;
use jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use tracing::{debug, info};

/// `status.extraFields` key of a run's reservation epoch.
pub const EPOCH_FIELD: &str = "keysEpoch";
pub use crate::core::run_status::TOKENS_RESULT;

/// What a run of several keys says about itself; None for a run of one key.
pub fn run_of(cfg: &RunConfig, status: &RunStatus) -> Option<MultiKeyRun> {
    (cfg.keys.len() > 1).then(|| MultiKeyRun {
        keys: cfg.keys.clone(),
        epoch: epoch(status),
        acquired: tokens(status),
    })
}

fn epoch(status: &RunStatus) -> i64 {
    status
        .extra_fields
        .as_ref()
        .and_then(|f| f.get(EPOCH_FIELD))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// The tokens a run was told `Acquired` with.
fn tokens(status: &RunStatus) -> Option<BTreeMap<String, i64>> {
    let acquired = status.succeeded().is_some_and(|c| {
        c.status == "True" && c.reason.as_deref() == Some(Reason::Acquired.as_str())
    });
    if !acquired {
        return None;
    }
    let tokens: BTreeMap<String, i64> = serde_json::from_str(status.result(TOKENS_RESULT)?).ok()?;
    // A token out of range was never handed out by a lock: the whole claim is refused.
    tokens
        .values()
        .all(|t| crate::model::mutex::token_in_range(*t))
        .then_some(tokens)
}

/// The runs of several keys among a key's members.
pub fn keys_of<'a>(
    key: &str,
    runs: impl Iterator<Item = (&'a RunRef, Option<&'a MultiKeyRun>)>,
) -> MultiKeys {
    MultiKeys {
        key: key.into(),
        runs: runs
            .filter_map(|(r, m)| Some((r.uid.clone(), m?.clone())))
            .collect(),
    }
}

/// A member of several keys, as the commit and the revoke need it.
pub struct Candidate<'a> {
    /// The run as the lock's status names it.
    pub run: &'a RunRef,
    /// Where the run lives, and its own name there.
    pub namespace: &'a str,
    pub name: &'a str,
    /// Its PipelineRun's uid: a key its PipelineRun holds keeps a slot for it.
    pub pipeline_run_uid: Option<&'a str>,
    pub multi: &'a MultiKeyRun,
    pub resource_version: Option<&'a str>,
    pub status: &'a RunStatus,
    pub waiting_since: Timestamp,
    /// Its `release-after` task names, recorded at the first tell (a commit may be one).
    pub release_after: &'a [String],
}

/// After this key's ledger is written: tell `Acquired` every run for which all
/// its keys keep a slot in its epoch. The other keys' ledgers (locks of the same
/// kind and scope) are read after the run was; the write is conditional on the
/// run being unchanged.
pub async fn commit_reserved<L: LockObject>(
    ctx: &Context,
    scope: &Scope,
    key: &str,
    ledger: &MutexStatus,
    candidates: &[Candidate<'_>],
    now: Timestamp,
) -> Result<(), Error> {
    for c in candidates {
        let kept = slot_for(ledger, &c.run.uid, c.multi.epoch, c.pipeline_run_uid).is_some();
        if !kept || c.multi.acquired.is_some() || c.resource_version.is_none() {
            continue;
        }
        let mut ledgers = BTreeMap::from([(key.to_string(), ledger.clone())]);
        for k in c.multi.keys.iter().filter(|k| *k != key) {
            let other = L::api(&ctx.client, scope).get_opt(k).await?;
            if let Some(status) = other.as_ref().and_then(L::lock_status) {
                ledgers.insert(k.clone(), status.clone());
            }
        }
        let Some(tokens) = commit_multikey(&c.run.uid, c.multi, c.pipeline_run_uid, &ledgers)
        else {
            continue;
        };
        let waited = now.duration_since(c.waiting_since).as_secs().max(0);
        let Some(patch) = acquired_patch::<L>(c, &tokens, waited, now) else {
            continue;
        };
        if writes::run_status(ctx, c.run.kind, c.namespace, c.name, &patch).await? {
            info!(
                namespace = c.namespace,
                run = c.name,
                ?tokens,
                waited_seconds = waited,
                "granted every key"
            );
            let first = &c.multi.keys[0];
            let outcome = Outcome::Acquired {
                token: tokens[first],
                waited_seconds: waited,
            };
            let local = RunRef {
                name: c.name.to_string(),
                ..c.run.clone()
            };
            let keys = c.multi.keys.join(",");
            events::run_transition(ctx, c.namespace, &keys, &local, &outcome, c.status);
        }
    }
    Ok(())
}

/// `Acquired` on every key at once: `token` is the first key's, `tokens` all.
fn acquired_patch<L: LockObject>(
    c: &Candidate<'_>,
    tokens: &BTreeMap<String, i64>,
    waited_seconds: i64,
    now: Timestamp,
) -> Option<Value> {
    let first = &c.multi.keys[0];
    let outcome = Outcome::Acquired {
        token: tokens[first],
        waited_seconds,
    };
    let rv = c.resource_version;
    let mut p = run_status::patch(c.run.kind, first, &outcome, c.status, rv, now)?;
    let listed: Vec<String> = c
        .multi
        .keys
        .iter()
        .map(|k| format!("{k}={}", tokens[k]))
        .collect();
    p["status"]["conditions"][0]["message"] = json!(format!(
        "acquired {} with tokens {} after waiting {waited_seconds}s",
        c.multi.keys.join(", "),
        listed.join(", ")
    ));
    let tokens_json = serde_json::to_string(tokens).ok()?;
    p["status"]["results"]
        .as_array_mut()?
        .push(json!({"name": TOKENS_RESULT, "value": tokens_json}));
    p["status"]["extraFields"]["keys"] = json!(c.multi.keys);
    p["status"]["extraFields"][run_status::LOCK_KIND_FIELD] = json!(L::kind(&()).as_ref());
    run_status::record_release_after(&mut p, c.status, c.release_after);
    Some(p)
}

/// Give back the slots the decision revokes: raise the run's epoch, only if the
/// run is unchanged since it was read in that epoch (and so not `Acquired`).
pub async fn revoke(
    ctx: &Context,
    revokes: &[Revoke],
    candidates: &[Candidate<'_>],
) -> Result<(), Error> {
    for r in revokes {
        let Some(c) = candidates.iter().find(|c| c.run.uid == r.run.uid) else {
            continue;
        };
        let Some(rv) = c.resource_version else {
            continue;
        };
        if c.multi.epoch != r.epoch || c.multi.acquired.is_some() {
            continue;
        }
        let patch = json!({
            "metadata": {"resourceVersion": rv},
            "status": {"extraFields": {EPOCH_FIELD: r.epoch + 1}},
        });
        if writes::run_status(ctx, c.run.kind, c.namespace, c.name, &patch).await? {
            debug!(
                namespace = c.namespace,
                run = c.name,
                epoch = r.epoch + 1,
                "slots given back: a run ahead waits"
            );
        }
    }
    Ok(())
}

/// The status patch for a run of several keys. Only the commit tells it
/// `Acquired`; waiting reads the same from every key (else the keys would
/// rewrite each other's message forever); an end names all its keys.
pub fn patch(
    kind: RunKind,
    multi: &MultiKeyRun,
    outcome: &Outcome,
    current: &RunStatus,
    resource_version: Option<&str>,
    now: Timestamp,
) -> Option<Value> {
    let keys = multi.keys.join(",");
    match outcome {
        Outcome::Acquired { .. } => None,
        // Being deleted or frozen, one key's Mutex keeps the run out for now: still
        // waiting, in the same words from every key (else they rewrite each other).
        Outcome::Waiting { .. } | Outcome::MutexDeleting | Outcome::Frozen { .. } => {
            let retry = matches!(
                outcome,
                Outcome::Waiting { retry: true, .. } | Outcome::Frozen { retry: true, .. }
            );
            let message = format!(
                "waiting for {}: granted only once every key is free for it",
                multi.keys.join(", ")
            );
            let same = current.succeeded().is_some_and(|c| {
                c.reason.as_deref() == Some(Reason::Waiting.as_str())
                    && c.message.as_deref() == Some(message.as_str())
            });
            if same && !retry {
                return None;
            }
            let waiting = Outcome::Waiting {
                next: false,
                holders: Vec::new(),
                retry,
            };
            let mut p = run_status::patch(kind, &keys, &waiting, current, resource_version, now)?;
            p["status"]["conditions"][0]["message"] = json!(message);
            Some(p)
        }
        other => run_status::patch(kind, &keys, other, current, resource_version, now),
    }
}

/// Intake: every key's Mutex exists, agrees with the run's embedded spec, and
/// all have the same `order` (every key must rank waiters alike, or two runs
/// could each be first on one key). Returns why the run cannot use them.
pub async fn mutexes_for(
    ctx: &Context,
    o: &ObservedRun<'_>,
    cfg: &RunConfig,
) -> Result<Option<String>, Error> {
    let mut specs: Vec<(String, MutexSpec)> = Vec::new();
    for k in &cfg.keys {
        let cached = ctx.mutexes.get(&ObjectRef::new(k).within(&o.namespace));
        let spec = match cached {
            Some(m) => m.spec.clone(),
            None => match writes::ensure_mutex(ctx, &o.namespace, k, &cfg.spec).await? {
                writes::Ensured::Created => {
                    info!(key = %k, namespace = %o.namespace, run = %o.name, "created Mutex");
                    cfg.spec.clone()
                }
                writes::Ensured::Existing(spec) => *spec,
            },
        };
        if let Some(conflict) = cfg.for_key(k).spec_conflict(&spec) {
            return Ok(Some(conflict));
        }
        specs.push((k.clone(), spec));
    }
    let orders = specs.iter().map(|(k, s)| (k.as_str(), s.lock.order));
    Ok(crate::core::params::keys::orders_differ("Mutex", orders))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tekton::{Condition, RunResult};

    fn cfg(keys: &[&str]) -> RunConfig {
        let r = crate::model::tekton::TaskRef {
            api_version: "tekton-mutex.dev/v1alpha1".into(),
            kind: "Mutex".into(),
            name: None,
        };
        let params = vec![crate::model::tekton::Param {
            name: "keys".into(),
            value: json!(keys.join(",")),
        }];
        crate::core::params::parse(&crate::core::params::RunInput {
            namespace: "ns",
            target: crate::core::params::Target::Ref(&r),
            params: &params,
            timeout: None,
            retries: None,
        })
        .unwrap()
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn a_run_of_several_keys_reads_its_epoch_and_tokens() {
        assert_eq!(run_of(&cfg(&["a"]), &RunStatus::default()), None);
        let waiting = RunStatus {
            extra_fields: Some(json!({"key": "a,b", EPOCH_FIELD: 3})),
            ..Default::default()
        };
        let m = run_of(&cfg(&["a", "b"]), &waiting).unwrap();
        assert_eq!((m.epoch, m.acquired), (3, None));
        let acquired = RunStatus {
            conditions: vec![Condition {
                type_: "Succeeded".into(),
                status: "True".into(),
                reason: Some("Acquired".into()),
                ..Default::default()
            }],
            results: vec![RunResult {
                name: TOKENS_RESULT.into(),
                value: r#"{"a":4,"b":9}"#.into(),
            }],
            ..Default::default()
        };
        let m = run_of(&cfg(&["b", "a"]), &acquired).unwrap();
        assert_eq!(
            m.acquired,
            Some(BTreeMap::from([("a".into(), 4), ("b".into(), 9)]))
        );
    }

    #[test]
    fn the_commit_tells_every_token_and_the_first_keys_as_token() {
        let multi = run_of(&cfg(&["b", "a"]), &RunStatus::default()).unwrap();
        let run = RunRef {
            kind: RunKind::CustomRun,
            name: "r".into(),
            uid: "u".into(),
        };
        let status = RunStatus::default();
        let c = Candidate {
            run: &run,
            namespace: "ns",
            name: "r",
            pipeline_run_uid: None,
            multi: &multi,
            resource_version: Some("12"),
            status: &status,
            waiting_since: now(),
            release_after: &[],
        };
        let tokens = BTreeMap::from([("a".into(), 4), ("b".into(), 9)]);
        let p = acquired_patch::<crate::model::mutex::Mutex>(&c, &tokens, 7, now()).unwrap();
        assert_eq!(p["metadata"]["resourceVersion"], "12");
        let results = p["status"]["results"].as_array().unwrap();
        let result = |n: &str| results.iter().find(|r| r["name"] == n).unwrap()["value"].clone();
        assert_eq!(result("token"), "9", "the first key's token");
        assert_eq!(result("key"), "b");
        assert_eq!(result(TOKENS_RESULT), r#"{"a":4,"b":9}"#);
        assert_eq!(
            p["status"]["conditions"][0]["message"],
            "acquired b, a with tokens b=9, a=4 after waiting 7s"
        );
    }

    #[test]
    fn waiting_reads_the_same_from_every_key_and_is_written_once() {
        let multi = run_of(&cfg(&["a", "b"]), &RunStatus::default()).unwrap();
        let waiting = |position: usize| Outcome::Waiting {
            next: position == 1,
            holders: vec![format!("holder-{position}")],
            retry: false,
        };
        let kind = RunKind::CustomRun;
        let first = patch(
            kind,
            &multi,
            &waiting(1),
            &RunStatus::default(),
            None,
            now(),
        )
        .unwrap();
        let written: RunStatus = serde_json::from_value(first["status"].clone()).unwrap();
        assert_eq!(
            patch(kind, &multi, &waiting(2), &written, None, now()),
            None
        );
        let deleting = Outcome::MutexDeleting;
        assert_eq!(patch(kind, &multi, &deleting, &written, None, now()), None);
        let frozen = Outcome::Frozen {
            next: true,
            holders: Vec::new(),
            retry: false,
            reason: Some("change freeze".into()),
            window: None,
        };
        assert_eq!(patch(kind, &multi, &frozen, &written, None, now()), None);
        let acquired = Outcome::Acquired {
            token: 1,
            waited_seconds: 0,
        };
        assert_eq!(patch(kind, &multi, &acquired, &written, None, now()), None);
    }
}
