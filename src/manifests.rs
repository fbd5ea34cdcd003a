//! The install manifests for a release, rendered from config/ (built in):
//! the image pinned by digest, `app.kubernetes.io/version` on every object
//! and pod, and the version in the `tekton-mutex-info` ConfigMap.
//! `tekton-mutex manifests` prints them; hack/release.sh writes them to
//! release.yaml (cluster-wide) and release-namespaced.yaml.

use serde_json::{Map, Value};

/// The generated CRD's file: written by `tekton-mutex crd`, checked by tests/crd_drift.rs.
pub const CRD_FILE: &str = "300-crd.yaml";
/// The ConfigMap that tells tools which version is installed (Tekton's `pipelines-info`).
pub const INFO_CONFIG_MAP: &str = "tekton-mutex-info";

/// The files of a config/ directory, built in, in name order: the order in which
/// `kubectl apply -f` applies them, and in which the release lists their objects.
macro_rules! config {
    ($($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!("../config/", $file)))),*]
    };
}

/// config/: the cluster-wide install.
pub const CLUSTER: &[(&str, &str)] = config![
    "100-namespace.yaml",
    "200-clusterrole-aggregate.yaml",
    // The role for people who control queues (`tkn mutex`): see the README's "Queue control".
    "200-clusterrole-operator.yaml",
    "200-clusterrole.yaml",
    "200-role.yaml",
    "200-serviceaccount.yaml",
    "201-clusterrolebinding.yaml",
    "201-rolebinding.yaml",
    "300-crd.yaml",
    // Refuses a queue-control request that names another requester: see the file.
    "400-admission-policy.yaml",
    "400-config-info.yaml",
    // Refuses starting a PipelineRun that waits for a lock, but by its grant: see the file.
    "401-admission-only-a-grant-starts.yaml",
    // Refuses lowering or removing the token ledger's entries, but by the controller.
    "402-admission-token-ledger.yaml",
    "500-controller.yaml",
];

/// config/namespaced/: one namespace's install, without the CRD.
pub const NAMESPACED: &[(&str, &str)] = config![
    "namespaced/200-role-operator.yaml",
    "namespaced/200-role.yaml",
    "namespaced/200-serviceaccount.yaml",
    "namespaced/201-rolebinding.yaml",
    "namespaced/400-config-info.yaml",
    "namespaced/500-controller.yaml",
];

/// config/admission/: the policy that makes a PipelineRun to be queued Pending at create. Its
/// own release file: a cluster that does not serve MutatingAdmissionPolicy could not apply
/// release.yaml with it.
pub const ADMISSION: &[(&str, &str)] = config!["admission/queue-at-create.yaml"];

/// Which API version of MutatingAdmissionPolicy to render the admission policy for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AdmissionApi {
    /// GA, Kubernetes 1.36 and later.
    V1,
    /// Beta, Kubernetes 1.34 and 1.35 (behind the MutatingAdmissionPolicy feature gate).
    V1beta1,
}

/// The admission policy (config/admission/), for `api`, labelled with `version`.
pub fn render_admission(api: AdmissionApi, version: &str) -> Result<String, Error> {
    let api_version = match api {
        AdmissionApi::V1 => "admissionregistration.k8s.io/v1",
        AdmissionApi::V1beta1 => "admissionregistration.k8s.io/v1beta1",
    };
    let mut out = format!(
        "# tekton-mutex {version}: the admission policy, rendered by `tekton-mutex manifests` from config/admission/. Do not edit.\n"
    );
    for (_, text) in ADMISSION {
        let docs: Vec<Value> = serde_saphyr::from_str_multiple(text)?;
        for mut obj in docs.into_iter().filter(|d| !d.is_null()) {
            label(&mut obj["metadata"], version);
            obj["apiVersion"] = api_version.into();
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(&obj)?);
        }
    }
    Ok(out)
}

/// Which install to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Install {
    /// CRD, namespace, ClusterRoles, Deployment: serves every namespace.
    Cluster,
    /// Roles and Deployment for one namespace (named `pipelines`; see
    /// config/namespaced/). The CRD is installed once, separately.
    Namespaced,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the built-in manifests do not parse: {0}")]
    Yaml(#[from] serde_saphyr::Error),
    #[error("the manifests do not serialize: {0}")]
    Write(#[from] serde_saphyr::SerializeError),
    #[error("image {0:?} is not pinned by digest (expected NAME@sha256:...)")]
    NotPinned(String),
}

pub fn render(install: Install, image: &str, version: &str) -> Result<String, Error> {
    if !image.contains("@sha256:") {
        return Err(Error::NotPinned(image.into()));
    }
    let files = match install {
        Install::Cluster => CLUSTER,
        Install::Namespaced => NAMESPACED,
    };
    let mut out = format!(
        "# tekton-mutex {version}: rendered by `tekton-mutex manifests` from config/. Do not edit.\n"
    );
    for (file, text) in files {
        // The types, not the committed file: a stale file cannot reach a release.
        let source = match *file == CRD_FILE {
            true => crate::crd_yaml(),
            false => text.to_string(),
        };
        let docs: Vec<Value> = serde_saphyr::from_str_multiple(&source)?;
        for mut obj in docs {
            if obj.is_null() {
                continue;
            }
            label(&mut obj["metadata"], version);
            if obj["kind"] == "Deployment" {
                pin(&mut obj["spec"]["template"], image, version);
            }
            if obj["kind"] == "ConfigMap" && obj["metadata"]["name"] == INFO_CONFIG_MAP {
                obj["data"]["version"] = version.into();
            }
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(&obj)?);
        }
    }
    Ok(out)
}

/// Adds the version label to an object's (or a pod template's) metadata.
fn label(metadata: &mut Value, version: &str) {
    let Some(meta) = metadata.as_object_mut() else {
        return;
    };
    let labels = meta
        .entry("labels")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Some(labels) = labels.as_object_mut() {
        labels.insert("app.kubernetes.io/version".into(), version.into());
        labels.insert("app.kubernetes.io/part-of".into(), "tekton-mutex".into());
    }
}

fn pin(template: &mut Value, image: &str, version: &str) {
    label(&mut template["metadata"], version);
    if let Some(containers) = template["spec"]["containers"].as_array_mut() {
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
        serde_saphyr::from_str_multiple::<Value, Vec<Value>>(text)
            .unwrap()
            .into_iter()
            .collect()
    }

    fn objects(install: Install) -> Vec<Value> {
        docs(&render(install, IMAGE, "1.2.3").unwrap())
    }

    fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
        objs.iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the install"))
    }

    /// (kind, name) of every object, in order.
    fn ids(objs: &[Value]) -> Vec<(&str, &str)> {
        objs.iter()
            .map(|o| (o["kind"].as_str(), o["metadata"]["name"].as_str()))
            .map(|(kind, name)| (kind.unwrap(), name.unwrap()))
            .collect()
    }

    #[test]
    fn the_admission_policy_renders_for_either_api_version() {
        for (api, version) in [(AdmissionApi::V1, "v1"), (AdmissionApi::V1beta1, "v1beta1")] {
            let objs = docs(&render_admission(api, "1.2.3").unwrap());
            let kinds: Vec<&str> = objs.iter().map(|o| o["kind"].as_str().unwrap()).collect();
            assert_eq!(
                kinds.len(),
                8,
                "four policies and their bindings: {kinds:?}"
            );
            for o in &objs {
                let expected = format!("admissionregistration.k8s.io/{version}");
                assert_eq!(o["apiVersion"], expected.as_str());
                assert_eq!(
                    o["metadata"]["labels"]["app.kubernetes.io/version"],
                    "1.2.3"
                );
            }
        }
    }

    #[test]
    fn every_file_of_config_is_rendered_in_name_order() {
        for (dir, files, prefix) in [
            ("config", CLUSTER, ""),
            ("config/namespaced", NAMESPACED, "namespaced/"),
            ("config/admission", ADMISSION, "admission/"),
        ] {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
            let mut on_disk: Vec<String> = std::fs::read_dir(path)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|name| name.ends_with(".yaml"))
                .map(|name| format!("{prefix}{name}"))
                .collect();
            on_disk.sort();
            let built_in: Vec<&str> = files.iter().map(|(file, _)| *file).collect();
            assert_eq!(built_in, on_disk, "src/manifests.rs renders {dir}/");
        }
    }

    #[test]
    fn cluster_install_has_everything_once_pinned_and_labelled() {
        let objs = objects(Install::Cluster);
        let (crd, vap) = ("CustomResourceDefinition", "ValidatingAdmissionPolicy");
        let expected = [
            ("Namespace", "tekton-mutex"),
            ("ClusterRole", "tekton-mutex-aggregate-edit"),
            ("ClusterRole", "tekton-mutex-aggregate-view"),
            ("ClusterRole", "tekton-mutex-operator"),
            ("ClusterRole", "tekton-mutex-cluster-operator"),
            ("ClusterRole", "tekton-mutex"),
            ("Role", "tekton-mutex-leader-election"),
            ("Role", "tekton-mutex-info"),
            ("ServiceAccount", "tekton-mutex"),
            ("ClusterRoleBinding", "tekton-mutex"),
            ("RoleBinding", "tekton-mutex-leader-election"),
            ("RoleBinding", "tekton-mutex-info"),
            (crd, "mutexes.tekton-mutex.dev"),
            (crd, "clustermutexes.tekton-mutex.dev"),
            (vap, "tekton-mutex-requester"),
            ("ValidatingAdmissionPolicyBinding", "tekton-mutex-requester"),
            ("ConfigMap", INFO_CONFIG_MAP),
            (vap, "tekton-mutex-only-a-grant-starts"),
            (
                "ValidatingAdmissionPolicyBinding",
                "tekton-mutex-only-a-grant-starts",
            ),
            (vap, "tekton-mutex-token-ledger"),
            (
                "ValidatingAdmissionPolicyBinding",
                "tekton-mutex-token-ledger",
            ),
            ("Deployment", "tekton-mutex"),
            ("Service", "tekton-mutex"),
        ];
        assert_eq!(ids(&objs), expected);
        for o in &objs {
            assert_eq!(
                o["metadata"]["labels"]["app.kubernetes.io/version"],
                "1.2.3"
            );
        }
        let d = find(&objs, "Deployment", "tekton-mutex");
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
    fn namespaced_install_stays_in_its_namespace() {
        let objs = objects(Install::Namespaced);
        let expected = [
            ("Role", "tekton-mutex-operator"),
            ("Role", "tekton-mutex"),
            ("ServiceAccount", "tekton-mutex"),
            ("RoleBinding", "tekton-mutex"),
            ("ConfigMap", INFO_CONFIG_MAP),
            ("Deployment", "tekton-mutex"),
            ("Service", "tekton-mutex"),
        ];
        assert_eq!(ids(&objs), expected);
        // Nothing cluster-scoped, and one namespace for the README's sed to replace.
        for o in &objs {
            assert_eq!(o["metadata"]["namespace"], "pipelines", "{o:?}");
        }
        let operator = find(&objs, "Role", "tekton-mutex-operator");
        let cluster = objects(Install::Cluster);
        let cluster_operator = find(&cluster, "ClusterRole", "tekton-mutex-operator");
        assert_eq!(operator["rules"], cluster_operator["rules"]);
    }

    /// Tools read the installed version there, as from Tekton's `pipelines-info`.
    #[test]
    fn the_info_config_map_holds_the_release_version() {
        for install in [Install::Cluster, Install::Namespaced] {
            let objs = objects(install);
            let info = find(&objs, "ConfigMap", INFO_CONFIG_MAP);
            assert_eq!(info["data"]["version"], "1.2.3", "{install:?}");
        }
        let cluster = objects(Install::Cluster);
        let reader = find(&cluster, "Role", "tekton-mutex-info");
        assert_eq!(reader["rules"][0]["resourceNames"][0], INFO_CONFIG_MAP);
    }

    /// Prometheus picks the port by its name; it must reach the port the
    /// controller serves /metrics on, on the controller's pods.
    #[test]
    fn the_metrics_service_reaches_the_controller_pods() {
        for install in [Install::Cluster, Install::Namespaced] {
            let objs = objects(install);
            let service = &find(&objs, "Service", "tekton-mutex")["spec"];
            let pod = &find(&objs, "Deployment", "tekton-mutex")["spec"]["template"];
            let selector = service["selector"].as_object().unwrap();
            assert!(!selector.is_empty(), "{install:?}");
            for (k, v) in selector {
                assert_eq!(&pod["metadata"]["labels"][k.as_str()], v);
            }
            let port = &service["ports"][0];
            assert_eq!(port["name"], "http-metrics", "{install:?}");
            let container = &pod["spec"]["containers"][0];
            let served = container["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == port["targetPort"])
                .expect("the targetPort names a port of the container");
            let args: Vec<&str> = container["args"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let addr = args.windows(2).find(|w| w[0] == "--http-addr").unwrap()[1];
            let container_port = served["containerPort"].as_u64().unwrap();
            assert!(addr.ends_with(&format!(":{container_port}")), "{addr}");
        }
    }

    /// Whoever may edit a namespace manages its Mutexes, whoever may view
    /// reads them; neither writes a status, edit gets no ClusterMutex.
    #[test]
    fn edit_and_view_take_in_the_locks() {
        let objs = objects(Install::Cluster);
        let yaml = |s: &str| serde_saphyr::from_str::<Value>(s).unwrap();
        let label = "rbac.authorization.k8s.io/aggregate-to-";
        let edit = find(&objs, "ClusterRole", "tekton-mutex-aggregate-edit");
        assert_eq!(edit["metadata"]["labels"][&format!("{label}edit")], "true");
        let verbs = "[create, delete, deletecollection, get, list, patch, update, watch]";
        let rules =
            format!("[{{apiGroups: [tekton-mutex.dev], resources: [mutexes], verbs: {verbs}}}]");
        assert_eq!(edit["rules"], yaml(&rules));
        let view = find(&objs, "ClusterRole", "tekton-mutex-aggregate-view");
        assert_eq!(view["metadata"]["labels"][&format!("{label}view")], "true");
        let rules = "[{apiGroups: [tekton-mutex.dev], resources: [mutexes, clustermutexes], \
                     verbs: [get, list, watch]}]";
        assert_eq!(view["rules"], yaml(rules));
    }

    #[test]
    fn an_unpinned_image_is_refused() {
        assert!(matches!(
            render(Install::Cluster, "tekton-mutex:latest", "1.2.3"),
            Err(Error::NotPinned(_))
        ));
    }
}
