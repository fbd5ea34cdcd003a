//! What every command shares: where to act ([`Global`], [`Target`]), how long
//! to wait for the controller ([`Wait`]), and failures said for people.

use crate::core::duration::parse_go_duration;
use crate::model::cluster_mutex::ClusterMutex;
use crate::model::mutex::Mutex;
use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use std::time::Duration;

/// Where to act, as tkn takes it (`-k/--kubeconfig`, `-c/--context`, `-n/--namespace`).
#[derive(Args, Clone, Default)]
pub struct Global {
    /// The namespace; default: the kubeconfig context's namespace, else `default`.
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig context to use.
    #[arg(short = 'c', long, global = true)]
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
    /// The API server's URL, to name it when it cannot be reached.
    pub server: String,
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
        e => match unreachable(&target.server, &e) {
            Some(said) => Failure(said),
            None => Failure(format!("could not {what}: {e}")),
        },
    }
}

/// A call that got no answer from the API server, said with the server's URL:
/// kube's own message (`ServiceError: client error (Connect)`) names neither
/// the server nor the cause, which is deeper in the error's sources.
pub fn unreachable(server: &str, e: &kube::Error) -> Option<String> {
    match e {
        kube::Error::HyperError(_) | kube::Error::Service(_) => Some(format!(
            "cannot reach the Kubernetes API at {server}: {}",
            causes(e)
        )),
        _ => None,
    }
}

/// The error's sources joined with `: `, each said once (wrappers often repeat their source).
fn causes(e: &dyn std::error::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    let mut next = e.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !said.iter().any(|s| s.contains(&text)) {
            said.push(text);
        }
        next = cause.source();
    }
    match said.is_empty() {
        true => e.to_string(),
        false => said.join(": "),
    }
}

/// The user's kubeconfig, context and namespace, as tkn and kubectl read them.
pub async fn connect(g: &Global) -> Result<Target> {
    target(load_config(g).await?, g)
}

async fn load_config(g: &Global) -> Result<Config> {
    let options = KubeConfigOptions {
        context: g.context.clone(),
        ..Default::default()
    };
    let no_config = |e: &dyn std::fmt::Display| Failure(format!("no usable kubeconfig: {e}"));
    match &g.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| Failure(format!("cannot read kubeconfig {}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| no_config(&e))
        }
        None if g.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| no_config(&e)),
        None => Config::infer().await.map_err(|e| no_config(&e)),
    }
}

/// A client for `config` (no request is made yet), in the namespace the flags or the context say.
pub fn target(config: Config, g: &Global) -> Result<Target> {
    let namespace = g
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let server = config.cluster_url.to_string();
    let server = server.trim_end_matches('/').to_string();
    let client = Client::try_from(config).map_err(|e| {
        Failure(format!(
            "cannot set up a client for the Kubernetes API at {server}: {e}"
        ))
    })?;
    Ok(Target {
        client,
        server,
        namespace,
        cluster: g.cluster,
    })
}

/// How long a mutating command waits for the controller's acknowledgement.
#[derive(Args, Clone, Copy)]
pub struct Wait {
    /// How long to wait for the controller to act on the request: 30s, 2m, 1h30m
    /// (a plain number is seconds).
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = parse_timeout)]
    pub timeout: Duration,
}

impl Wait {
    pub fn duration(self) -> Duration {
        self.timeout
    }

    /// The timeout as Go (and so kubectl and tkn) writes durations: `1s`, `2m0s`, `1h30m0s`.
    pub fn text(self) -> String {
        let secs = self.timeout.as_secs();
        let (h, m) = (secs / 3600, secs / 60 % 60);
        let s = (secs % 60) as f64 + f64::from(self.timeout.subsec_millis()) / 1000.0;
        match (h, m) {
            (0, 0) => format!("{s}s"),
            (0, _) => format!("{m}m{s}s"),
            _ => format!("{h}h{m}m{s}s"),
        }
    }
}

/// `--timeout`: a Go duration as tkn's flags take (`30s`, `2m`, `1h30m`), or a plain
/// number of seconds, which this flag took before it took durations.
pub fn parse_timeout(s: &str) -> std::result::Result<Duration, String> {
    match s.trim().parse::<u64>() {
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(_) => parse_go_duration(s),
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    #[test]
    fn timeouts_take_go_durations_and_plain_seconds() {
        let parsed = |s: &str| parse_timeout(s).map(|d| d.as_secs());
        assert_eq!(parsed("30s"), Ok(30));
        assert_eq!(parsed("2m"), Ok(120));
        assert_eq!(parsed("1h30m"), Ok(5400));
        assert_eq!(parsed("45"), Ok(45), "plain seconds, as before");
        assert!(parse_timeout("30 seconds").is_err());
        assert!(parse_timeout("-5s").is_err());
        let text = |s: &str| {
            Wait {
                timeout: parse_timeout(s).unwrap(),
            }
            .text()
        };
        assert_eq!(text("1"), "1s");
        assert_eq!(text("1.5s"), "1.5s");
        assert_eq!(text("2m"), "2m0s");
        assert_eq!(text("1h30m"), "1h30m0s");
    }

    /// A kubeconfig whose server is a closed port of this machine: connecting is
    /// refused at once, no cluster involved.
    pub async fn unreachable_target() -> Target {
        let yaml = r#"
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: ci}}]
current-context: x
"#;
        let kc = Kubeconfig::from_yaml(yaml).unwrap();
        let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .unwrap();
        target(config, &Global::default()).unwrap()
    }

    #[tokio::test]
    async fn an_unreachable_server_is_named() {
        let target = unreachable_target().await;
        assert_eq!(target.namespace, "ci", "the context's namespace");
        let Err(Failure(e)) = target.lock("staging").await else {
            panic!("nothing listens on port 1");
        };
        assert!(
            e.starts_with("cannot reach the Kubernetes API at https://127.0.0.1:1: "),
            "{e}"
        );
    }
}
