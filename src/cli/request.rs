//! A mutating command's round trip: find who is asking (SelfSubjectReview),
//! write the request on the Mutex (an annotation, or spec.frozen), wait for the
//! controller's acknowledgement in the status, and say what happened.

use super::target::{Failure, Result, Target, Wait, api_failure};
use crate::core::requests::{self as control, ObservedRequest, Request, Verdict};
use crate::model::mutex::Mutex;
use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};
use serde_json::{Map, Value, json};

/// Who the API server says we are, as reported to this client. Only a label on
/// the request: the API server's RBAC, not this name, decides what may be done.
pub async fn whoami(client: &Client) -> String {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    match api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(r) => r
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "unknown user".into()),
        Err(_) => "unknown user".into(),
    }
}

/// Write a request on the Mutex and wait until the controller acknowledges it.
/// Ok(message) when done; a Failure when refused, forbidden or not answered in time.
pub async fn submit(target: &Target, key: &str, mut r: Request, wait: Wait) -> Result<String> {
    r.by = whoami(&target.client).await;
    control::within_bounds(&r).map_err(|e| Failure(format!("not sent: {e}")))?;
    r.id = control::new_id(Timestamp::now(), rand_nonce());
    let (name, value) = r.annotation();
    let mut annotations = Map::new();
    annotations.insert(name.clone(), Value::String(value));
    let patch = json!({"metadata": {"annotations": annotations}});
    patch_mutex(target, key, &patch, r.action.as_str()).await?;
    let id = r.id.clone();
    let acked = move |m: Option<&Mutex>| observed(m, &id).is_some();
    let m = await_ack(target, key, acked, wait).await.map_err(|e| {
        Failure(format!(
            "{e}\nThe request stays on Mutex {key} as annotation {name}; the controller acts on it when it runs \
             (or remove it: kubectl annotate mutex {key} -n {} {name}-).",
            target.namespace
        ))
    })?;
    let ack = observed(m.as_ref(), &r.id)
        .ok_or_else(|| Failure(format!("Mutex {key} was deleted before it answered")))?;
    match ack.verdict {
        Verdict::Done => Ok(ack.message.clone()),
        Verdict::Refused => Err(Failure(format!(
            "the controller refused to {} on {key}: {}",
            r.action.as_str(),
            ack.message
        ))),
    }
}

fn observed<'m>(m: Option<&'m Mutex>, id: &str) -> Option<&'m ObservedRequest> {
    let st = m?.status.as_ref()?;
    st.observed_requests.iter().find(|o| o.id == id)
}

/// A merge patch of the Mutex, as the user: refused with a clear message if RBAC says no.
pub async fn patch_mutex(target: &Target, key: &str, patch: &Value, what: &str) -> Result<()> {
    target
        .mutexes()
        .patch(key, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map_err(|e| api_failure(&format!("{what} on Mutex {key} (patch the Mutex)"), e))?;
    Ok(())
}

/// Watch the Mutex until `done` holds, at most `wait`.
pub async fn await_ack(
    target: &Target,
    key: &str,
    done: impl Fn(Option<&Mutex>) -> bool,
    wait: Wait,
) -> std::result::Result<Option<Mutex>, String> {
    let watch = await_condition(target.mutexes(), key, done);
    match tokio::time::timeout(wait.duration(), watch).await {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(format!("could not watch Mutex {key}: {e}")),
        Err(_) => Err(format!(
            "the controller did not acknowledge the request within {}s: is tekton-mutex running and serving namespace {}?",
            wait.timeout, target.namespace
        )),
    }
}

/// Enough to tell two requests of the same millisecond apart.
fn rand_nonce() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}
