//! A mutating command's round trip: find who is asking (SelfSubjectReview),
//! write the request on the Mutex or ClusterMutex (an annotation, or spec.frozen), wait for the
//! controller's acknowledgement in the status, and say what happened.

use super::lock::Lock;
use super::target::{Failure, Result, Target, Wait};
use crate::core::requests::{self as control, ObservedRequest, Request, Verdict};
use jiff::Timestamp;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::PostParams;
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

/// Write a request on the lock and wait until the controller acknowledges it.
/// Ok(message) when done; a Failure when refused, forbidden or not answered in time.
pub async fn submit(target: &Target, key: &str, mut r: Request, wait: Wait) -> Result<String> {
    r.by = whoami(&target.client).await;
    control::within_bounds(&r).map_err(|e| Failure(format!("not sent: {e}")))?;
    r.id = control::new_id(Timestamp::now(), rand_nonce());
    let (name, value) = r.annotation();
    let mut annotations = Map::new();
    annotations.insert(name.clone(), Value::String(value));
    let patch = json!({"metadata": {"annotations": annotations}});
    target.patch_lock(key, &patch, r.action.as_str()).await?;
    let id = r.id.clone();
    let acked = move |l: Option<&Lock>| observed(l, &id).is_some();
    let lock = target.await_lock(key, acked, wait).await.map_err(|e| {
        Failure(format!(
            "{e}\nThe request stays on {} as annotation {name}; the controller acts on it when it runs \
             (or remove it: kubectl annotate {} {name}-).",
            target.describe_lock(key),
            target.kubectl_ref(key),
        ))
    })?;
    let ack = observed(lock.as_ref(), &r.id).ok_or_else(|| {
        Failure(format!(
            "{} was deleted before it answered",
            target.describe_lock(key)
        ))
    })?;
    match ack.verdict {
        Verdict::Done => Ok(ack.message.clone()),
        Verdict::Refused => Err(Failure(format!(
            "the controller refused to {} on {key}: {}",
            r.action.as_str(),
            ack.message
        ))),
    }
}

fn observed(lock: Option<&Lock>, id: &str) -> Option<ObservedRequest> {
    let st = lock?.status();
    st.observed_requests.into_iter().find(|o| o.id == id)
}

/// Enough to tell two requests of the same millisecond apart.
fn rand_nonce() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}
