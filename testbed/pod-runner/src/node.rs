//! The Node this pod-runner stands in for, and the binding of pods to it.
//!
//! The API server finds a pod's kubelet through `spec.nodeName` -> the Node's InternalIP and
//! `status.daemonEndpoints.kubeletEndpoint.Port`. There is no scheduler on the local control
//! plane, so the pod-runner binds the pods it runs itself, through the `binding` subresource
//! (as a scheduler would).

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const FIELD_MANAGER: &str = "pod-runner";

/// Creates or updates the Node object: Ready, at 127.0.0.1, with its kubelet endpoint's `port`
/// when it serves one.
pub async fn register(client: &Client, name: &str, port: Option<u16>) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": std::env::consts::ARCH,
        }},
    });
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    nodes
        .patch(name, &apply, &Patch::Apply(&node))
        .await
        .with_context(|| format!("creating Node {name}"))?;
    nodes
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(node_status(name, port)),
        )
        .await
        .with_context(|| format!("writing the status of Node {name}"))?;
    Ok(())
}

fn node_status(name: &str, port: Option<u16>) -> Value {
    let now = Timestamp::now().to_string();
    let resources = json!({"cpu": "8", "memory": "16Gi", "pods": "250"});
    json!({"status": {
        "addresses": [
            {"type": "InternalIP", "address": "127.0.0.1"},
            {"type": "Hostname", "address": name},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": port.unwrap_or(0)}},
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "the pod-runner runs TaskRun pods on this host",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
        "capacity": resources,
        "allocatable": resources,
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": "",
            "osImage": "pod-runner", "containerRuntimeVersion": "pod-runner://host",
            "kubeletVersion": "pod-runner", "kubeProxyVersion": "",
            "operatingSystem": "linux", "architecture": std::env::consts::ARCH,
        },
    }})
}

/// Binds a pod to `node`, as the scheduler would.
pub async fn bind(pods: &Api<Pod>, pod: &str, node: &str) -> Result<()> {
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": pod},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    });
    pods.create_subresource::<Value, Value>("binding", pod, &PostParams::default(), &binding)
        .await
        .with_context(|| format!("binding pod {pod} to node {node}"))?;
    Ok(())
}
