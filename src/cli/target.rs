//! What every command shares: where to act ([`Global`], [`Target`]), how long
//! to wait for the controller ([`Wait`]), and failures said for people.

use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::time::Duration;

/// Where to act, as tkn takes it.
#[derive(Args, Clone)]
pub struct Global {
    /// The namespace; default: the kubeconfig context's namespace, else `default`.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig file; default: KUBECONFIG, else ~/.kube/config.
    #[arg(short = 'k', long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Act on the ClusterMutex of that name, not on a Mutex of the namespace.
    #[arg(long, global = true)]
    pub cluster: bool,
}

/// A failure the user can act on; printed as `Error: ...`, exit code 1.
#[derive(Debug)]
pub struct Failure(pub String);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

pub type Result<T> = std::result::Result<T, Failure>;

/// What a command needs to reach the cluster, and which kind of lock it acts on.
pub struct Target {
    pub client: Client,
    pub namespace: String,
    /// `--cluster`: ClusterMutexes, not the namespace's Mutexes.
    pub cluster: bool,
}

impl Target {
    pub fn mutexes(&self) -> Api<Mutex> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn clusters(&self) -> Api<ClusterMutex> {
        Api::all(self.client.clone())
    }
}

/// An API error, said for people: a refusal names the missing permission.
pub fn api_failure(target: &Target, what: &str, e: kube::Error) -> Failure {
    let needs = match target.cluster {
        true => "Queue control on a ClusterMutex needs permission to patch clustermutexes.tekton-mutex.dev \
                 (the tekton-mutex-cluster-operator ClusterRole, bound by a ClusterRoleBinding)."
            .to_string(),
        false => "Queue control needs permission to patch mutexes.tekton-mutex.dev in this namespace \
                  (the tekton-mutex-operator ClusterRole, bound by a RoleBinding)."
            .to_string(),
    };
    match e {
        kube::Error::Api(s) if s.code == 403 => Failure(format!(
            "the API server refused to {what}: {}\n{needs}",
            s.message
        )),
        kube::Error::Api(s) => Failure(format!("could not {what}: {} ({})", s.message, s.code)),
        e => Failure(format!("could not {what}: {e}")),
    }
}

/// The user's kubeconfig, context and namespace, as tkn and kubectl read them.
pub async fn connect(g: &Global) -> Result<Target> {
    let options = KubeConfigOptions {
        context: g.context.clone(),
        ..Default::default()
    };
    let no_config = |e: &dyn std::fmt::Display| Failure(format!("no usable kubeconfig: {e}"));
    let config = match &g.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| Failure(format!("cannot read kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| no_config(&e))?
        }
        None if g.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| no_config(&e))?,
        None => Config::infer().await.map_err(|e| no_config(&e))?,
    };
    let namespace = g
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let client =
        Client::try_from(config).map_err(|e| Failure(format!("cannot reach the cluster: {e}")))?;
    Ok(Target {
        client,
        namespace,
        cluster: g.cluster,
    })
}

/// How long a mutating command waits for the controller's acknowledgement.
#[derive(Args, Clone, Copy)]
pub struct Wait {
    /// Seconds to wait for the controller to act on the request.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub timeout: u64,
}

impl Wait {
    pub fn duration(self) -> Duration {
        Duration::from_secs(self.timeout)
    }
}
