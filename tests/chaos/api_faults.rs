//! Issue 49's API-level faults: the API server throttling the controller (API Priority and
//! Fairness: a FlowSchema puts its requests into a priority level with no seats, so every one of
//! them is refused with 429 for a while), and an admission policy refusing the controller's
//! writes to one run. Both need to tell the controller's requests from everyone else's (the
//! campaign, Tekton and the controller all use the cluster's admin token), so in rounds with
//! these faults the controller runs as a ServiceAccount of the round's namespace, bound to
//! cluster-admin: the [`Identity`].

use crate::support::{apply_yaml, dynamic_api, kubeconfig_path, secs, wait_until};
use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const SA: &str = "chaos-controller";

/// The controller's own identity in a round: a ServiceAccount, bound to cluster-admin, and a
/// kubeconfig with its token.
pub struct Identity {
    pub ns: String,
    pub kubeconfig: PathBuf,
}

fn binding_name(ns: &str) -> String {
    format!("chaos-controller-{ns}")
}

impl Identity {
    pub async fn create(client: &Client, ns: &str, dir: &Path) -> Result<Identity> {
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": binding_name(ns)},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": ns}],
        });
        let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA}});
        apply_yaml(client, Some(ns), &sa.to_string()).await?;
        apply_yaml(client, None, &binding.to_string()).await?;
        let request: TokenRequest = serde_json::from_value(json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 7200}}))?;
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        let issued: TokenRequest = sas
            .create_subresource("token", SA, &PostParams::default(), &request)
            .await
            .context("a token for the controller's ServiceAccount")?;
        let token = issued.status.context("the token")?.token;
        let mut kc = Kubeconfig::read_from(kubeconfig_path())?;
        for user in &mut kc.auth_infos {
            user.auth_info = Some(serde_json::from_value(json!({"token": token}))?);
        }
        let kubeconfig = dir.join("kubeconfig-controller");
        std::fs::write(&kubeconfig, serde_json::to_string(&kc)?)?;
        let id = Identity {
            ns: ns.to_string(),
            kubeconfig,
        };
        // The binding takes effect as the API server's RBAC cache sees it.
        let authorized = || async { Ok(id.probe().await.ok().map(|_| ())) };
        wait_until(
            "the controller's identity to be authorized",
            secs(30),
            authorized,
        )
        .await?;
        Ok(id)
    }

    /// A client of the controller's identity, new each time (one from before an API server
    /// restart may hang on its old connection).
    pub async fn client(&self) -> Result<Client> {
        let kc = Kubeconfig::read_from(&self.kubeconfig)?;
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        Ok(Client::try_from(config)?)
    }

    /// A read of the controller's identity, bounded (2 s): its error, if any.
    async fn probe(&self) -> Result<(), Option<kube::Error>> {
        let client = self.client().await.map_err(|_| None)?;
        let api: Api<ServiceAccount> = Api::namespaced(client, &self.ns);
        match tokio::time::timeout(secs(2), api.get(SA)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Some(e)),
            Err(_) => Err(None),
        }
    }

    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{SA}", self.ns)
    }

    /// Removes the cluster-scoped binding (the ServiceAccount goes with the namespace).
    pub async fn remove(&self, client: &Client) {
        if let Ok(api) = dynamic_api(
            client,
            None,
            "rbac.authorization.k8s.io/v1",
            "ClusterRoleBinding",
        )
        .await
        {
            let _ = api
                .delete(&binding_name(&self.ns), &DeleteParams::default())
                .await;
        }
    }
}

fn jail_name(ns: &str) -> String {
    format!("chaos-jail-{ns}")
}

/// A priority level with no seats of its own and none to borrow, rejecting what it cannot
/// seat (429), and the FlowSchema that sends every request of the controller there.
pub fn jail(ns: &str, id: &Identity) -> (Value, Value) {
    let name = jail_name(ns);
    let level = json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}}},
    });
    let schema = json!({
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": name},
            // Before every suggested FlowSchema but exempt (system:masters, which it is not).
            "matchingPrecedence": 50,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": SA, "namespace": id.ns}}],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                    "clusterScope": true, "namespaces": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    });
    (level, schema)
}

/// Starts throttling the controller; returns once a request of its identity is refused with
/// 429 (bounded: APF applies its configuration within a second or so). False where the API
/// server runs without APF (hack/cluster.sh: `--enable-priority-and-fairness=false`): then
/// nothing is throttled, and the round's timeline says so.
pub async fn throttle_on(client: &Client, ns: &str, id: &Identity) -> Result<bool> {
    let (level, schema) = jail(ns, id);
    apply_yaml(client, None, &format!("{level}\n---\n{schema}")).await?;
    let throttled = || async {
        match id.probe().await {
            Err(Some(kube::Error::Api(e))) if e.code == 429 => Ok(Some(())),
            _ => Ok(None),
        }
    };
    let enforced = wait_until("the controller to be throttled (429)", secs(5), throttled).await;
    Ok(enforced.is_ok())
}

pub async fn throttle_off(client: &Client, ns: &str) -> Result<()> {
    let name = jail_name(ns);
    for kind in ["FlowSchema", "PriorityLevelConfiguration"] {
        let api = dynamic_api(client, None, "flowcontrol.apiserver.k8s.io/v1", kind).await?;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// How many requests APF refused under the round's FlowSchema so far (the API server's
/// `apiserver_flowcontrol_rejected_requests_total`): the fault observed.
pub async fn throttled_requests(client: &Client, ns: &str) -> Result<u64> {
    let request = http::Request::get("/metrics").body(vec![])?;
    let text = client.request_text(request).await?;
    let schema = format!("flow_schema=\"{}\"", jail_name(ns));
    Ok(text
        .lines()
        .filter(|l| l.starts_with("apiserver_flowcontrol_rejected_requests_total{"))
        .filter(|l| l.contains(&schema))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64)
}

fn refuse_name(ns: &str) -> String {
    format!("chaos-refuse-run-{ns}")
}

/// A ValidatingAdmissionPolicy (and binding) refusing the controller's updates of PipelineRun
/// `pr` and of its lock runs (their status included) in `ns`.
pub fn refuse_policy(ns: &str, pr: &str, user: &str) -> (Value, Value) {
    let name = refuse_name(ns);
    let expression = format!(
        "request.userInfo.username != '{user}' || !(object.metadata.?labels[?'tekton.dev/pipelineRun'].orValue('') == '{pr}' \
         || (request.resource.resource == 'pipelineruns' && object.metadata.name == '{pr}'))"
    );
    let policy = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["tekton.dev"], "apiVersions": ["*"], "operations": ["UPDATE"],
                "resources": ["customruns", "customruns/status", "pipelineruns", "pipelineruns/status"],
            }]},
            "validations": [{"expression": expression,
                "message": format!("chaos: the controller may not write run {pr} for a while")}],
        },
    });
    let binding = json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name, "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
        },
    });
    (policy, binding)
}

/// Starts refusing the controller's writes to run `pr`; returns whether a dry-run write of its
/// identity was seen refused (bounded).
pub async fn refuse_on(client: &Client, ns: &str, pr: &str, id: &Identity) -> Result<bool> {
    let (policy, binding) = refuse_policy(ns, pr, &id.username());
    apply_yaml(client, None, &format!("{policy}\n---\n{binding}")).await?;
    let api = dynamic_api(
        &id.client().await?,
        Some(ns),
        "tekton.dev/v1",
        "PipelineRun",
    )
    .await?;
    let dry = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let patch = json!({"metadata": {"annotations": {"chaos.tekton-mutex.dev/probe": "1"}}});
    let merge = Patch::Merge(&patch);
    let refused = || async {
        let patched = api.patch(pr, &dry, &merge);
        match tokio::time::timeout(secs(2), patched).await {
            Ok(Err(kube::Error::Api(e))) if e.code == 422 || e.code == 403 => Ok(Some(())),
            _ => Ok(None),
        }
    };
    let enforced = wait_until("the refusal to be enforced", secs(10), refused).await;
    Ok(enforced.is_ok())
}

pub async fn refuse_off(client: &Client, ns: &str) -> Result<()> {
    let name = refuse_name(ns);
    for kind in [
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicy",
    ] {
        let api = dynamic_api(client, None, "admissionregistration.k8s.io/v1", kind).await?;
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
