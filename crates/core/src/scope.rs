//! Where a lock's runs live, and how their names read in its status. A Mutex
//! serves one namespace and writes plain names; a ClusterMutex serves several
//! and writes `namespace/name` (names never contain a '/').

use tekton_mutex_api::cluster_mutex::{qualify, unqualify};
use tekton_mutex_api::mutex::RunRef;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A Mutex: the runs of this namespace.
    Namespace(String),
    /// A ClusterMutex: runs of every namespace it allows.
    Cluster,
}

impl Scope {
    /// The namespace of the lock object itself (None: cluster-scoped).
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Scope::Namespace(ns) => Some(ns),
            Scope::Cluster => None,
        }
    }

    /// The namespace as a label value: "" for a cluster-scoped lock.
    pub fn label(&self) -> &str {
        self.namespace().unwrap_or_default()
    }

    /// Name `name` of namespace `ns`, as this lock's status writes it.
    pub fn status_name(&self, ns: &str, name: &str) -> String {
        match self {
            Scope::Namespace(_) => name.to_string(),
            Scope::Cluster => qualify(ns, name),
        }
    }

    /// The namespace and name behind a name as the status writes it; None if
    /// it cannot be one of this lock's (a cluster entry without a namespace).
    pub fn local<'a>(&'a self, name: &'a str) -> Option<(&'a str, &'a str)> {
        match self {
            Scope::Namespace(ns) => Some((ns, name)),
            Scope::Cluster => unqualify(name),
        }
    }

    /// A run as the status names it, back in its namespace under its own name.
    pub fn local_run(&self, run: &RunRef) -> Option<(String, RunRef)> {
        let (ns, name) = self.local(&run.name)?;
        let local = RunRef {
            name: name.to_string(),
            ..run.clone()
        };
        Some((ns.to_string(), local))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutex_writes_plain_names_and_a_cluster_mutex_qualified_ones() {
        let ns = Scope::Namespace("team".into());
        assert_eq!(ns.status_name("team", "pr-1"), "pr-1");
        assert_eq!(ns.local("pr-1"), Some(("team", "pr-1")));
        assert_eq!(Scope::Cluster.status_name("team", "pr-1"), "team/pr-1");
        assert_eq!(Scope::Cluster.local("team/pr-1"), Some(("team", "pr-1")));
        assert_eq!(Scope::Cluster.local("pr-1"), None, "no namespace: not ours");
        assert_eq!(Scope::Cluster.label(), "");
    }
}
