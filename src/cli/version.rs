//! `tkn mutex version`: this client's version, and the controller's as its
//! install records it (ConfigMap `tekton-mutex-info`, key `version`, in the
//! controller's namespace). The client's line needs no cluster.

use super::target::{Global, Result, Target, connect, unreachable};
use clap::Args;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

/// The ConfigMap the install writes its version in.
const INFO: &str = "tekton-mutex-info";

#[derive(Args)]
pub struct VersionArgs {
    /// The namespace tekton-mutex is installed in.
    #[arg(long, default_value = "tekton-mutex", value_name = "NAMESPACE")]
    controller_namespace: String,
}

/// Always succeeds: a controller that cannot be asked is `unknown`, with why.
pub async fn run(global: &Global, a: VersionArgs) -> Result<()> {
    println!("client: {}", crate::VERSION);
    let controller = match connect(global).await {
        Ok(target) => controller_version(&target, &a.controller_namespace).await,
        Err(e) => Err(e.0),
    };
    match controller {
        Ok(v) => println!("controller: {v}"),
        Err(why) => println!("controller: unknown ({why})"),
    }
    Ok(())
}

/// The version the ConfigMap records, or why there is none to tell.
pub async fn controller_version(
    target: &Target,
    namespace: &str,
) -> std::result::Result<String, String> {
    let api: Api<ConfigMap> = Api::namespaced(target.client.clone(), namespace);
    let found = api.get_opt(INFO).await.map_err(|e| match e {
        kube::Error::Api(s) => format!("cannot read ConfigMap {namespace}/{INFO}: {}", s.message),
        e => unreachable(&target.server, &e).unwrap_or_else(|| e.to_string()),
    })?;
    let cm = found.ok_or_else(|| format!("no ConfigMap {namespace}/{INFO}"))?;
    cm.data
        .and_then(|mut d| d.remove("version"))
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| format!("ConfigMap {namespace}/{INFO} has no data.version"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::target::tests::unreachable_target;

    #[tokio::test]
    async fn an_unreachable_controller_is_unknown_with_the_reason() {
        let target = unreachable_target().await;
        let why = controller_version(&target, "tekton-mutex")
            .await
            .unwrap_err();
        assert!(
            why.starts_with("cannot reach the Kubernetes API at https://127.0.0.1:1"),
            "{why}"
        );
    }
}
