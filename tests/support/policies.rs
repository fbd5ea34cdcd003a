//! A ValidatingAdmissionPolicy of config/ installed for one test: cluster-wide objects, so each
//! is renamed for the test's namespace and bound to it alone, and the controller's identity in
//! it is this test's controller's (it runs as the kubeconfig's user, not the release's
//! ServiceAccount). Removed when the test ends.

use super::{TestNamespace, apply_yaml, kubectl, repo_root};
use anyhow::Result;
use serde_json::json;

/// The release's controller identity, as the policies of config/ name it.
const RELEASE_CONTROLLER: &str = "system:serviceaccount:tekton-mutex:tekton-mutex";

pub struct NamespacePolicy(Vec<(String, String)>);

impl NamespacePolicy {
    /// Installs `config/<file>` for `ns`.
    pub async fn install(ns: &TestNamespace, file: &str) -> Result<NamespacePolicy> {
        let whoami = [
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ];
        let controller = kubectl(&whoami)?;
        let text = std::fs::read_to_string(repo_root().join("config").join(file))?
            .replace(RELEASE_CONTROLLER, controller.trim());
        Self::install_yaml(ns, &text).await
    }

    /// Installs the policy and binding of `text` for `ns`.
    pub async fn install_yaml(ns: &TestNamespace, text: &str) -> Result<NamespacePolicy> {
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(text)?;
        let mut names = Vec::new();
        for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
            let base = doc["metadata"]["name"].as_str().unwrap_or("");
            let name = format!("{base}-{}", ns.name());
            doc["metadata"]["name"] = json!(name);
            if let Some(policy) = doc.pointer_mut("/spec/policyName") {
                *policy = json!(name.clone());
                doc["spec"]["matchResources"] = json!({"namespaceSelector": {"matchLabels":
                    {"kubernetes.io/metadata.name": ns.name()}}});
            }
            let kind = doc["kind"].as_str().unwrap_or("").to_lowercase();
            names.push((kind, name));
            apply_yaml(&ns.client(), None, &doc.to_string()).await?;
        }
        Ok(NamespacePolicy(names))
    }
}

impl Drop for NamespacePolicy {
    fn drop(&mut self) {
        for (kind, name) in &self.0 {
            if let Err(e) = kubectl(&["delete", "--ignore-not-found", kind, name]) {
                eprintln!("could not remove {kind} {name}: {e:#}");
            }
        }
    }
}

/// A ServiceAccount `tenant` of `ns` allowed `verbs` on `resource` there (a tenant with edit
/// rights, as far as the test needs): runs `kubectl -n ns ARGS` as it.
pub fn tenant(
    ns: &TestNamespace,
    resource: &str,
    verbs: &str,
) -> Result<impl Fn(&[&str]) -> Result<String>> {
    let role = format!("tenant-{}", resource.replace('.', "-"));
    ns.kubectl(&["create", "serviceaccount", "tenant"])?;
    let (resource_flag, verbs_flag) = (format!("--resource={resource}"), format!("--verb={verbs}"));
    ns.kubectl(&["create", "role", &role, &resource_flag, &verbs_flag])?;
    let sa = format!("--serviceaccount={}:tenant", ns.name());
    ns.kubectl(&[
        "create",
        "rolebinding",
        "tenant",
        &format!("--role={role}"),
        &sa,
    ])?;
    let config = super::ops::service_account_kubeconfig(ns.name(), "tenant")?;
    let namespace = ns.name().to_string();
    Ok(move |args: &[&str]| {
        let path = config.to_string_lossy();
        let mut all = vec!["--kubeconfig", path.as_ref(), "-n", &namespace];
        all.extend_from_slice(args);
        kubectl(&all)
    })
}
