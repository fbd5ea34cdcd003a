//! The install manifests for a release, rendered from config/ (built in):
//! the image pinned by digest and `app.kubernetes.io/version` on every object
//! and pod. `tekton-mutex manifests` prints them; hack/release.sh writes
//! them to release.yaml (cluster-wide) and release-namespaced.yaml.

use serde::Deserialize;
use serde_yaml_ng::{Mapping, Value};

const RBAC: &str = include_str!("../config/rbac.yaml");
const DEPLOYMENT: &str = include_str!("../config/deployment.yaml");
/// The role for people who control queues (`tkn mutex`): see the README's "Queue control".
const OPERATOR_ROLE: &str = include_str!("../config/operator-role.yaml");
/// Refuses a queue-control request that names another requester: see the file.
const ADMISSION_POLICY: &str = include_str!("../config/admission-policy.yaml");
const NAMESPACED_RBAC: &str = include_str!("../config/namespaced/rbac.yaml");
const NAMESPACED_DEPLOYMENT: &str = include_str!("../config/namespaced/deployment.yaml");

/// Which install to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    /// CRD, namespace, ClusterRole, Deployment: serves every namespace.
    Cluster,
    /// Role and Deployment for one namespace (named `pipelines`; see
    /// config/namespaced/rbac.yaml). The CRD is installed once, separately.
    Namespaced,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the built-in manifests do not parse: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
    #[error("image {0:?} is not pinned by digest (expected NAME@sha256:...)")]
    NotPinned(String),
}

pub fn render(install: Install, image: &str, version: &str) -> Result<String, Error> {
    if !image.contains("@sha256:") {
        return Err(Error::NotPinned(image.into()));
    }
    let sources: Vec<String> = match install {
        Install::Cluster => vec![
            crate::crd_yaml(),
            RBAC.into(),
            OPERATOR_ROLE.into(),
            ADMISSION_POLICY.into(),
            DEPLOYMENT.into(),
        ],
        Install::Namespaced => vec![NAMESPACED_RBAC.into(), NAMESPACED_DEPLOYMENT.into()],
    };
    let mut out = format!(
        "# tekton-mutex {version}: rendered by `tekton-mutex manifests` from config/. Do not edit.\n"
    );
    let mut seen = Vec::new();
    for source in &sources {
        for doc in serde_yaml_ng::Deserializer::from_str(source) {
            let mut obj = Value::deserialize(doc)?;
            if obj.is_null() {
                continue;
            }
            // deployment.yaml repeats the Namespace so that `kubectl apply -f config/` works.
            let id = (obj["kind"].clone(), obj["metadata"]["name"].clone());
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            label(&mut obj["metadata"], version);
            if obj["kind"] == "Deployment" {
                pin(&mut obj["spec"]["template"], image, version);
            }
            out.push_str("---\n");
            out.push_str(&serde_yaml_ng::to_string(&obj)?);
        }
    }
    Ok(out)
}

/// Adds the version label to an object's (or a pod template's) metadata.
fn label(metadata: &mut Value, version: &str) {
    let Some(meta) = metadata.as_mapping_mut() else {
        return;
    };
    let labels = meta
        .entry("labels".into())
        .or_insert_with(|| Value::Mapping(Mapping::new()));
    if let Some(labels) = labels.as_mapping_mut() {
        labels.insert("app.kubernetes.io/version".into(), version.into());
        labels.insert("app.kubernetes.io/part-of".into(), "tekton-mutex".into());
    }
}

fn pin(template: &mut Value, image: &str, version: &str) {
    label(&mut template["metadata"], version);
    if let Some(containers) = template["spec"]["containers"].as_sequence_mut() {
        for c in containers {
            c["image"] = image.into();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IMAGE: &str = "127.0.0.1:5000/tekton-mutex:1.2.3@sha256:0123";

    fn docs(text: &str) -> Vec<Value> {
        serde_yaml_ng::Deserializer::from_str(text)
            .map(|d| Value::deserialize(d).unwrap())
            .collect()
    }

    #[test]
    fn cluster_install_has_everything_once_pinned_and_labelled() {
        let objs = docs(&render(Install::Cluster, IMAGE, "1.2.3").unwrap());
        let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        for role in ["tekton-mutex-operator", "tekton-mutex-cluster-operator"] {
            let found = objs
                .iter()
                .filter(|o| o["kind"] == "ClusterRole")
                .any(|o| o["metadata"]["name"] == role);
            assert!(found, "the {role} ClusterRole");
        }
        let crds = kinds.iter().filter(|k| **k == "CustomResourceDefinition");
        assert_eq!(crds.count(), 2, "Mutex and ClusterMutex in {kinds:?}");
        for kind in [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "Namespace",
            "ServiceAccount",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Deployment",
        ] {
            assert_eq!(
                kinds.iter().filter(|k| **k == kind).count(),
                1,
                "{kind} in {kinds:?}"
            );
        }
        for o in &objs {
            assert_eq!(
                o["metadata"]["labels"]["app.kubernetes.io/version"],
                "1.2.3"
            );
        }
        let d = objs.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(
            d["spec"]["template"]["spec"]["containers"][0]["image"],
            IMAGE
        );
        assert_eq!(
            d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/version"],
            "1.2.3"
        );
        // The selector must not change between versions, or upgrades fail.
        assert!(d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/version"].is_null());
    }

    #[test]
    fn namespaced_install_has_no_cluster_wide_rules() {
        let objs = docs(&render(Install::Namespaced, IMAGE, "1.2.3").unwrap());
        assert!(objs.iter().all(|o| {
            !matches!(
                o["kind"].as_str(),
                Some("ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition")
            )
        }));
        assert!(objs.iter().any(|o| o["kind"] == "Role"));
    }

    #[test]
    fn an_unpinned_image_is_refused() {
        assert!(matches!(
            render(Install::Cluster, "tekton-mutex:latest", "1.2.3"),
            Err(Error::NotPinned(_))
        ));
    }
}
