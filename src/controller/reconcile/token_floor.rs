//! Tokens continue across a lock object's deletion, across restarts, and after every run that
//! showed them is gone. A lock object keeps its `lastToken` in its status, but an idle one may be
//! deleted (GitOps prune, `kubectl delete`, a namespace's cleanup) without the controller, since
//! the finalizer is on only while the lock is in use (finalizer.rs), and a status can be wiped or
//! restored from an older copy after the runs that showed its tokens are gone. So the controller
//! records each token in a ledger in the API server before the lock state that hands it out
//! (lock.rs), again before the finalizer comes off, and a new object of the name (or a status
//! that does not name this object in `ledgerReadFor`) starts above it.
//!
//! The ledger is one ConfigMap, [`LEDGER`], per namespace that has Mutexes (entry `mutex.NAME`),
//! and one for ClusterMutexes (entry `clustermutex.NAME`) in namespace `kube-system`
//! ([`CLUSTER_LEDGER_NAMESPACE`], or `--cluster-ledger-namespace`): a namespace that lives as long
//! as the cluster, so that no uninstall deletes it (issue 37 item 11: in the controller's own
//! namespace, it went with `kubectl delete -f release.yaml`, and a reinstall handed out token 1
//! again). Why a ConfigMap: it needs no new CRD, RBAC can narrow `get` and `update` to this one
//! name, a Mutexes' ledger is deleted with its namespace (as are the Mutexes and runs whose tokens
//! it continues), and every ledger survives an uninstall, so a reinstall continues the tokens.
//! Entries only rise (max), writes are compare-and-swap. Past [`MAX_ENTRIES`] keys, the entries
//! fold into one floor for the whole ledger: higher floors are always safe, and the ConfigMap stays
//! far below its 1 MiB limit.

use crate::controller::apply::writes;
use crate::controller::context::{Context, Error};
use crate::controller::ledger_batch::Records;
use crate::core::scope::Scope;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::ObjectMeta;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// The ledger ConfigMap's name, in every namespace that has one.
pub const LEDGER: &str = "tekton-mutex-token-floors";
/// The entry that floors every name of the ledger (after folding).
const FOLDED: &str = "folded";
/// Entries kept one by one (each at most ~270 bytes); beyond that they fold into [`FOLDED`].
pub const MAX_ENTRIES: usize = 2000;
/// The longest ConfigMap data key.
const MAX_ENTRY: usize = 253;
/// Where the ClusterMutexes' ledger lives unless `--cluster-ledger-namespace` says otherwise.
pub const CLUSTER_LEDGER_NAMESPACE: &str = "kube-system";
/// The controller's namespace when POD_NAMESPACE is not set: the ClusterMutexes' ledger's
/// previous home.
const INSTALL_NAMESPACE: &str = "tekton-mutex";
const ATTEMPTS: usize = 5;

type Data = BTreeMap<String, String>;

/// Where earlier releases kept the ClusterMutexes' ledger: the controller's own namespace
/// (POD_NAMESPACE, else tekton-mutex). None if that is where it lives now (`current`).
///
/// Upgrade only: entries written there before the upgrade still floor their ClusterMutexes, so
/// the floor of a ClusterMutex is the higher of the two ledgers' (writes go to the new one only),
/// and [`carry_over`] copies them into the new one at start. Drop both once no supported release
/// wrote there (two releases on).
pub fn previous_cluster_ledger(current: &str) -> Option<String> {
    let ns = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| INSTALL_NAMESPACE.into());
    (ns != current).then_some(ns)
}

/// The ledger entry of lock `name` of `scope`: a valid ConfigMap key (a name too long for one is
/// cut, with a hash of the whole name: two names sharing an entry only share the higher floor).
pub fn entry(scope: &Scope, name: &str) -> String {
    let kind = kind_of(scope);
    let whole = format!("{kind}.{name}");
    if whole.len() <= MAX_ENTRY {
        return whole;
    }
    let digest = Sha256::digest(name.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("{kind}.{}.{hash}", &name[..200])
}

fn token_of(data: &Data, key: &str) -> Result<i64, String> {
    match data.get(key) {
        None => Ok(0),
        Some(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|t| *t == 0 || crate::model::mutex::token_in_range(*t))
            .ok_or_else(|| {
                format!(
                    "entry {key} is {v:?}, not a token from 0 to {}: set it to the last token \
                     handed out",
                    crate::model::mutex::MAX_TOKEN
                )
            }),
    }
}

/// The floor for `entry`: its own, or the folded one, whichever is higher.
pub fn floor_in(data: &Data, entry: &str) -> Result<i64, String> {
    Ok(token_of(data, entry)?.max(token_of(data, FOLDED)?))
}

/// The ledger's data once every record of `batch` is in; None if it already floors them all.
pub fn recorded_all(data: &Data, batch: &Records) -> Result<Option<Data>, String> {
    let mut raised = Vec::new();
    for (entry, token) in batch {
        if floor_in(data, entry)? < *token {
            raised.push((entry.clone(), token.to_string()));
        }
    }
    if raised.is_empty() {
        return Ok(None);
    }
    let mut data = data.clone();
    data.extend(raised);
    if data.len() > MAX_ENTRIES {
        // Unparsable entries fold in as nothing: they floored nothing either.
        let top = data
            .values()
            .filter_map(|v| v.trim().parse::<i64>().ok())
            .filter(|t| crate::model::mutex::token_in_range(*t))
            .max();
        data = [(FOLDED.to_string(), top.unwrap_or_default().to_string())].into();
    }
    Ok(Some(data))
}

/// Where the ledger of a lock of `scope` lives.
fn ledger(ctx: &Context, scope: &Scope) -> (Api<ConfigMap>, String) {
    let ns = match scope {
        Scope::Namespace(ns) => ns.clone(),
        Scope::Cluster => ctx.cluster_ledger_namespace.clone(),
    };
    (Api::namespaced(ctx.client.clone(), &ns), ns)
}

fn failed(ns: &str, e: impl std::fmt::Display) -> Error {
    Error::Ledger(format!("ConfigMap {ns}/{LEDGER}: {e}"))
}

fn api_failed(scope: &Scope, ns: &str, e: kube::Error) -> Error {
    let kube::Error::Api(s) = &e else {
        return failed(ns, e);
    };
    // The API server's own words: the whole Status would crowd the fix out of an Event's note.
    let cause = format!("{} ({} {})", s.message, s.code, s.reason);
    let elsewhere = match scope {
        Scope::Cluster => format!(
            ", or run the controller with --cluster-ledger-namespace set to a namespace it may \
             write that no uninstall deletes (now {ns})"
        ),
        Scope::Namespace(_) => String::new(),
    };
    let fix = match s.code {
        403 if s.message.contains("being terminated") => {
            format!("namespace {ns} is being deleted: create it again once it is gone{elsewhere}")
        }
        403 => format!(
            "the controller needs get and update on this ConfigMap, and create on configmaps in \
             {ns} (config/200-clusterrole.yaml){elsewhere}"
        ),
        // Only a create answers 404 (a read of a missing one is None, a replace retries).
        404 => format!("namespace {ns} does not exist: create it{elsewhere}"),
        _ => return failed(ns, cause),
    };
    failed(ns, format!("{cause}; {fix}"))
}

/// The token floor of lock `name`: above every token a lock of this name handed out before.
/// Read from the API server, never a cache: a cache could miss the last write.
pub async fn floor(ctx: &Context, scope: &Scope, name: &str) -> Result<i64, Error> {
    let (api, ns) = ledger(ctx, scope);
    let entry = entry(scope, name);
    let data = read(&api).await.map_err(|e| api_failed(scope, &ns, e))?;
    let floor = floor_in(&data, &entry).map_err(|e| failed(&ns, e))?;
    let previous = ctx.previous_cluster_ledger.as_deref();
    let Some(old) = previous.filter(|_| matches!(scope, Scope::Cluster)) else {
        return Ok(floor);
    };
    // Upgrade only (see previous_cluster_ledger): an earlier release's entries floor it too.
    let data = read(&Api::namespaced(ctx.client.clone(), old))
        .await
        .map_err(|e| {
            failed(
                old,
                format!("{e} (an earlier release's ledger, read while upgrading)"),
            )
        })?;
    Ok(floor.max(floor_in(&data, &entry).map_err(|e| failed(old, e))?))
}

/// Upgrade only (see [`previous_cluster_ledger`]): copies the ClusterMutexes' entries of an earlier
/// release's ledger into the new one. The floor reads both, but an uninstall deletes the old one
/// with its namespace: without the copy, a ClusterMutex left idle since the upgrade would start
/// again at token 1 after a reinstall. Entries only rise, so a copy done again, or by every
/// replica, is harmless. Returns how many entries it carried.
pub async fn carry_over(ctx: &Context) -> Result<usize, Error> {
    let Some(old) = ctx.previous_cluster_ledger.as_deref() else {
        return Ok(0);
    };
    let data = read(&Api::namespaced(ctx.client.clone(), old))
        .await
        .map_err(|e| failed(old, e))?;
    let ours = |k: &String| k.starts_with("clustermutex.") || k == FOLDED;
    let batch: Records = data
        .keys()
        .filter(|k| ours(k))
        // An entry that is no token is left where it is: the floor read says so.
        .filter_map(|k| Some((k.clone(), token_of(&data, k).ok().filter(|t| *t > 0)?)))
        .collect();
    let carried = batch.len();
    if carried > 0 {
        write_batch(ctx, &Scope::Cluster, batch).await?;
    }
    Ok(carried)
}

/// A ledger's entries: none if there is no ledger (nor namespace: reading a ConfigMap of a
/// namespace that does not exist is a 404 too).
async fn read(api: &Api<ConfigMap>) -> Result<Data, kube::Error> {
    let cm = api.get_opt(LEDGER).await?;
    Ok(cm.and_then(|c| c.data).unwrap_or_default())
}

/// Record that lock `name` handed out tokens up to `token`: before it may go without us.
/// Records for one ledger wait in line and are written together (ledger_batch.rs).
pub async fn record(ctx: &Context, scope: &Scope, name: &str, token: i64) -> Result<(), Error> {
    let (_, ns) = ledger(ctx, scope);
    let line = format!("{}/{ns}", kind_of(scope));
    let write = |batch| write_batch(ctx, scope, batch);
    ctx.ledger_writes
        .record(&line, &entry(scope, name), token, write)
        .await
}

fn kind_of(scope: &Scope) -> &'static str {
    match scope {
        Scope::Namespace(_) => "mutex",
        Scope::Cluster => "clustermutex",
    }
}

/// Writes every record of `batch` into the ledger: read, raise, compare-and-swap.
async fn write_batch(ctx: &Context, scope: &Scope, batch: Records) -> Result<(), Error> {
    let (api, ns) = ledger(ctx, scope);
    for _ in 0..ATTEMPTS {
        let cm = api
            .get_opt(LEDGER)
            .await
            .map_err(|e| api_failed(scope, &ns, e))?;
        let exists = cm.is_some();
        let mut cm = cm.unwrap_or_else(|| new_ledger(&ns));
        let data = cm.data.take().unwrap_or_default();
        let Some(data) = recorded_all(&data, &batch).map_err(|e| failed(&ns, e))? else {
            return Ok(());
        };
        cm.data = Some(data);
        match writes::token_ledger(ctx, &api, &cm, exists).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            // Deleted since it was read: read again (and create it).
            Err(kube::Error::Api(e)) if e.code == 404 && exists => continue,
            // Its namespace is going, with every lock and run whose tokens it would continue.
            Err(kube::Error::Api(e)) if !exists && terminating(scope, &e) => return Ok(()),
            Err(e) => return Err(api_failed(scope, &ns, e)),
        }
    }
    Err(Error::Conflict)
}

fn terminating(scope: &Scope, e: &kube::core::Status) -> bool {
    matches!(scope, Scope::Namespace(_)) && e.code == 403 && e.message.contains("being terminated")
}

fn new_ledger(ns: &str) -> ConfigMap {
    let labels = [
        (writes::MANAGED_BY, writes::MANAGER),
        ("app.kubernetes.io/component", "token-ledger"),
    ];
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(LEDGER.into()),
            namespace: Some(ns.into()),
            labels: Some(labels.map(|(k, v)| (k.into(), v.into())).into()),
            annotations: Some(
                [(
                    "tekton-mutex.dev/about".to_string(),
                    "the last fencing token of each lock that may be deleted while idle; \
                     a new lock of that name continues above it. Do not lower an entry."
                        .to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns() -> Scope {
        Scope::Namespace("ns".into())
    }

    /// The ledger's data once `token` is recorded for `entry`.
    fn recorded(data: &Data, entry: &str, token: i64) -> Result<Option<Data>, String> {
        recorded_all(data, &Records::from([(entry.to_string(), token)]))
    }

    #[test]
    fn a_batch_raises_only_what_it_raises_and_writes_nothing_when_nothing_rises() {
        let data: Data = [("mutex.a".to_string(), "5".to_string())].into();
        let batch = Records::from([("mutex.a".into(), 3), ("mutex.b".into(), 2)]);
        let data = recorded_all(&data, &batch).unwrap().expect("b rises");
        assert_eq!(floor_in(&data, "mutex.a"), Ok(5), "never lowered");
        assert_eq!(floor_in(&data, "mutex.b"), Ok(2));
        assert_eq!(recorded_all(&data, &batch), Ok(None), "nothing to write");
    }

    #[test]
    fn entries_only_rise_and_kinds_do_not_share() {
        let data = Data::new();
        let a = entry(&ns(), "k");
        let data = recorded(&data, &a, 7).unwrap().expect("written");
        assert_eq!(floor_in(&data, &a), Ok(7));
        assert_eq!(recorded(&data, &a, 5), Ok(None), "never lowered");
        assert_eq!(recorded(&data, &a, 7), Ok(None), "nothing to write");
        assert_eq!(floor_in(&data, &entry(&Scope::Cluster, "k")), Ok(0));
        assert_eq!(floor_in(&data, &entry(&ns(), "other")), Ok(0));
    }

    #[test]
    fn every_name_makes_a_configmap_key() {
        let long = "a".repeat(253);
        let e = entry(&Scope::Cluster, &long);
        assert!(e.len() <= MAX_ENTRY, "{}", e.len());
        assert_ne!(e, entry(&Scope::Cluster, &"a".repeat(252)));
        let valid = |c: char| c.is_ascii_alphanumeric() || "-._".contains(c);
        assert!(e.chars().all(valid));
        assert_eq!(entry(&ns(), "prod.eu-1"), "mutex.prod.eu-1");
    }

    #[test]
    fn a_full_ledger_folds_into_one_floor_that_is_never_lower() {
        let mut data = Data::new();
        for i in 0..MAX_ENTRIES {
            let e = entry(&ns(), &format!("k{i}"));
            data = recorded(&data, &e, i as i64 + 1).unwrap().unwrap();
        }
        assert_eq!(data.len(), MAX_ENTRIES);
        let data = recorded(&data, &entry(&ns(), "new"), 3).unwrap().unwrap();
        assert_eq!(data.len(), 1, "folded");
        for name in ["k0", "k1999", "new", "never-seen"] {
            assert_eq!(floor_in(&data, &entry(&ns(), name)), Ok(MAX_ENTRIES as i64));
        }
    }

    #[test]
    fn an_edited_entry_is_an_error_not_a_zero() {
        let data: Data = [("mutex.k".to_string(), "seven".to_string())].into();
        let err = floor_in(&data, "mutex.k").unwrap_err();
        assert!(err.contains("not a token from 0 to"), "{err}");
        // Issue 37: a floor written by hand at the type's maximum would end the key's tokens.
        for bad in ["9223372036854775807", "9007199254740992", "-3"] {
            let data: Data = [("mutex.k".to_string(), bad.to_string())].into();
            assert!(floor_in(&data, "mutex.k").is_err(), "{bad} is refused");
        }
        let top: Data = [("mutex.k".to_string(), "9007199254740991".to_string())].into();
        assert_eq!(
            floor_in(&top, "mutex.k"),
            Ok(crate::model::mutex::MAX_TOKEN)
        );
    }
}
