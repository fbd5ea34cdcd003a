//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager).
//!
//! Every replica runs its watches; only the Lease holder's reconcilers act.
//! - The leader renews `renew_margin` before the Lease would expire; a standby
//!   takes over when it expires, so within `duration` of the leader dying.
//! - A clean shutdown releases the Lease at once, and standbys watch the Lease
//!   so they take it at once too, not at its expiry.
//! - A leader that sees another holder exits: the Deployment restarts it as a
//!   standby. A paused leader that wakes up cannot do harm either: each grant
//!   is a compare-and-swap on the Mutex status, which conflicts.

use super::context::Error;
use futures::Stream;
use futures::{Future, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseParams};
use std::time::Duration;
use tokio::sync::watch;
use tracing::{info, warn};

/// Back-off after a failed Lease read or write.
const RETRY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct LeaderElection {
    pub lease_name: String,
    pub lease_namespace: String,
    /// Who we are in the Lease's holderIdentity (the pod name).
    pub identity: String,
    /// How long the Lease stays valid after a renewal.
    pub duration: Duration,
    /// How long before expiry the leader renews.
    pub renew_margin: Duration,
}

/// Keeps `loops` running (warm caches) and lets them act while this replica
/// holds the Lease. Returns when they stop (a signal; the Lease is then
/// released at once) or with `LostLease` when another replica took it.
pub async fn act_while_leading(
    client: Client,
    le: LeaderElection,
    synced: impl Future<Output = ()>,
    acting: watch::Sender<bool>,
    loops: impl Future<Output = ()>,
) -> Result<(), Error> {
    let mut loops = std::pin::pin!(loops);
    // Campaign only once the caches are warm, so the leader acts on full knowledge.
    let campaign = async {
        synced.await;
        campaign(&client, &le).await
    };
    let manager = tokio::select! {
        m = campaign => m?,
        () = &mut loops => return Ok(()),
    };
    info!(lease = %le.lease_name, identity = %le.identity, "became the leader");
    acting.send_replace(true);
    let result = tokio::select! {
        r = hold(&manager) => r,
        () = &mut loops => Ok(()),
    };
    acting.send_replace(false);
    match manager.release().await {
        Ok(()) => info!(lease = %le.lease_name, "released the Lease"),
        Err(e) => warn!(error = %e, "could not release the Lease; it expires by itself"),
    }
    result
}

fn params(le: &LeaderElection) -> LeaseParams {
    LeaseParams::new(
        le.identity.clone(),
        le.duration.as_secs(),
        le.renew_margin.as_secs(),
    )
    .with_field_manager(format!("tekton-mutex-{}", le.identity))
}

/// Waits until this replica holds the Lease.
async fn campaign(client: &Client, le: &LeaderElection) -> Result<LeaseManager, Error> {
    loop {
        let manager = LeaseManager::new(
            client.clone(),
            &le.lease_name,
            &le.lease_namespace,
            params(le),
            LeaseCreateMode::AutoCreate,
        )
        .await;
        let manager = match manager {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "cannot read the leader Lease; retrying");
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        // The manager only re-reads a held Lease at its expiry: start afresh
        // when the holder releases it, to take over at once.
        let won = tokio::select! {
            r = until_holding(&manager) => Some(r),
            () = released(client, le) => None,
        };
        if let Some(r) = won {
            r?;
            return Ok(manager);
        }
    }
}

async fn until_holding(manager: &LeaseManager) -> Result<(), Error> {
    loop {
        match manager.changed().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => {
                warn!(error = %e, "leader election step failed; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Renews the Lease until someone else holds it.
async fn hold(manager: &LeaseManager) -> Result<(), Error> {
    loop {
        match manager.changed().await {
            Ok(false) => return Err(Error::LostLease),
            Ok(true) => {}
            Err(e) => {
                warn!(error = %e, "cannot renew the Lease; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Resolves when the Lease goes from held to free (a clean release).
async fn released(client: &Client, le: &LeaderElection) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &le.lease_namespace);
    let wc = watcher::Config::default().fields(&format!("metadata.name={}", le.lease_name));
    let mut leases = std::pin::pin!(watcher(api, wc).default_backoff().applied_objects());
    let mut was_held = false;
    while let Some(event) = leases.next().await {
        let Ok(lease) = event else { continue };
        let held = holder(&lease).is_some();
        if was_held && !held {
            info!(lease = %le.lease_name, "the leader released the Lease");
            return;
        }
        was_held = held;
    }
    std::future::pending().await
}

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// Yields each time the value turns true.
pub fn became_leader(rx: watch::Receiver<bool>) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            if *rx.borrow_and_update() {
                return Some(((), rx));
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;

    #[test]
    fn an_empty_holder_is_no_holder() {
        let lease = |h: Option<&str>| Lease {
            spec: Some(LeaseSpec {
                holder_identity: h.map(String::from),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(holder(&lease(Some("pod-a"))), Some("pod-a"));
        assert_eq!(holder(&lease(Some(""))), None);
        assert_eq!(holder(&lease(None)), None);
        assert_eq!(holder(&Lease::default()), None);
    }

    #[test]
    fn lease_params_follow_the_flags() {
        let p = params(&LeaderElection {
            lease_name: "l".into(),
            lease_namespace: "ns".into(),
            identity: "pod-a".into(),
            duration: Duration::from_secs(15),
            renew_margin: Duration::from_secs(5),
        });
        let expected = LeaseParams::new("pod-a", 15, 5).with_field_manager("tekton-mutex-pod-a");
        assert_eq!(p, expected);
    }
}
