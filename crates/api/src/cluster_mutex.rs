//! The `ClusterMutex` custom resource (`tekton-mutex.dev/v1alpha1`, cluster-scoped):
//! one lock shared by the namespaces an administrator allows. Runs never create
//! one; they refer to it by name:
//! `taskRef: {apiVersion: tekton-mutex.dev/v1alpha1, kind: ClusterMutex, name: prod-db}`.
//!
//! Its status is a [`MutexStatus`], decided by the same core as a Mutex's. Runs
//! come from several namespaces, so in that status run and PipelineRun names are
//! qualified by namespace (`ns/name`; names never contain a '/'), and supersede
//! groups are too unless `spec.crossNamespaceSupersede` is set.

use crate::mutex::{LockSpec, MutexStatus};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

// The label selectors live with the run selector; their old paths stay.
pub use crate::selector::{NamespaceSelector, SelectorOperator, SelectorRequirement};

/// The lock's settings and who may use it; by default no namespace may.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "tekton-mutex.dev",
    version = "v1alpha1",
    kind = "ClusterMutex",
    plural = "clustermutexes",
    status = "MutexStatus",
    shortname = "cmtx",
    category = "tekton",
    category = "tekton-pipelines",
    printcolumn = r#"{"name":"Holders","type":"string","jsonPath":".status.holding"}"#,
    printcolumn = r#"{"name":"Waiting","type":"integer","jsonPath":".status.waiting"}"#,
    printcolumn = r#"{"name":"Last-Token","type":"integer","jsonPath":".status.lastToken"}"#,
    printcolumn = r#"{"name":"Capacity","type":"integer","jsonPath":".spec.capacity"}"#,
    printcolumn = r#"{"name":"Frozen","type":"boolean","jsonPath":".spec.frozen"}"#,
    printcolumn = r#"{"name":"Namespaces","type":"string","jsonPath":".spec.namespaces"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A lock shared by the namespaces an administrator allows: runs refer to it by name \
           (taskRef kind ClusterMutex). Only an administrator creates one; its status is the \
           lock state, written by the controller only."
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "!has(self.sequenceFrom) || has(self.selector)",
    "message": "sequenceFrom reads the sequence of the PipelineRuns a selector takes: give spec.selector too"
}]))]
pub struct ClusterMutexSpec {
    #[serde(flatten)]
    pub lock: LockSpec,
    /// Namespaces whose runs may use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// Namespaces whose labels match may use it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<NamespaceSelector>,
    /// Let a newer run supersede older runs of its group from other namespaces
    /// too; by default supersede stays within a namespace.
    #[serde(default)]
    pub cross_namespace_supersede: bool,
    /// Let `priority` order runs across namespaces too (a platform team's own deploys ahead
    /// of every tenant's). By default namespaces take turns, and a run's priority and
    /// sequence, its tenant's own claims, order that namespace's runs only. Only for a
    /// ClusterMutex whose namespaces trust each other: any of them may then send its runs
    /// with a high priority.
    #[serde(default)]
    pub cross_namespace_priority: bool,
    /// How many runs of one namespace may wait at once; one more fails with
    /// reason `QueueFull`, naming the namespace. Default: `maxQueue / 4`, at least 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_queue_per_namespace: Option<u32>,
    /// The PipelineRuns of the allowed namespaces that it takes by itself, with no
    /// annotation: made Pending as they are created, and queued whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<crate::selector::RunSelector>,
    /// Read each selected PipelineRun's sequence (an integer, higher = newer: a build
    /// number) from one of its params or labels, as the `sequence` param would give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_from: Option<crate::selector::ValueFrom>,
}

impl ClusterMutexSpec {
    /// The queue's share for one namespace: no tenant can fill it for the others.
    pub fn namespace_share(&self) -> u32 {
        self.max_queue_per_namespace
            .unwrap_or((self.lock.max_queue / 4).max(1))
    }

    /// Must the namespace's labels be read to know whether it is allowed?
    pub fn needs_labels(&self, namespace: &str) -> bool {
        !self.namespaces.iter().any(|n| n == namespace) && self.namespace_selector.is_some()
    }

    /// May runs of this namespace (with these labels) use it?
    pub fn allows(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.namespaces.iter().any(|n| n == namespace)
            || self
                .namespace_selector
                .as_ref()
                .is_some_and(|s| s.matches(labels))
    }

    /// The supersede group of a run of this namespace.
    pub fn group(&self, namespace: &str, group: &str) -> String {
        if self.cross_namespace_supersede {
            group.to_string()
        } else {
            qualify(namespace, group)
        }
    }
}

/// Why a run of `namespace` may not use ClusterMutex `name`, and how to allow it.
pub fn forbidden(name: &str, namespace: &str) -> String {
    format!(
        "namespace {namespace} may not use ClusterMutex {name}: an administrator allows it by adding it to \
         spec.namespaces (kubectl patch clustermutex {name} --type=json \
         -p '[{{\"op\":\"add\",\"path\":\"/spec/namespaces/-\",\"value\":\"{namespace}\"}}]') \
         or by labelling the namespace to match spec.namespaceSelector"
    )
}

/// `ns/name`: how a ClusterMutex status names a run or a PipelineRun.
pub fn qualify(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The namespace and name of a qualified name.
pub fn unqualify(qualified: &str) -> Option<(&str, &str)> {
    qualified.split_once('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn spec(v: serde_json::Value) -> ClusterMutexSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn defaults_are_a_mutex_s() {
        let s = spec(json!({}));
        assert_eq!(s.lock, LockSpec::default());
        assert!(!s.cross_namespace_supersede);
        assert!(
            !s.allows("any", &labels(&[])),
            "nothing is allowed by default"
        );
    }

    #[test]
    fn namespaces_by_name_or_by_labels() {
        let s = spec(json!({
            "namespaces": ["team-a"],
            "namespaceSelector": {
                "matchLabels": {"env": "prod"},
                "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["test"]}],
            },
        }));
        assert!(s.allows("team-a", &labels(&[])));
        assert!(!s.needs_labels("team-a"));
        assert!(s.needs_labels("team-b"));
        assert!(s.allows("team-b", &labels(&[("env", "prod")])));
        assert!(!s.allows("team-b", &labels(&[("env", "prod"), ("tier", "test")])));
        assert!(!s.allows("team-b", &labels(&[("env", "dev")])));
        let exists = NamespaceSelector {
            match_expressions: vec![SelectorRequirement {
                key: "locks".into(),
                operator: SelectorOperator::Exists,
                values: vec![],
            }],
            ..Default::default()
        };
        assert!(exists.matches(&labels(&[("locks", "")])));
        assert!(!exists.matches(&labels(&[])));
        assert!(NamespaceSelector::default().matches(&labels(&[])));
    }

    #[test]
    fn supersede_stays_in_a_namespace_unless_asked() {
        let s = spec(json!({}));
        assert_eq!(s.group("team-a", "deploy"), "team-a/deploy");
        let cross = spec(json!({"crossNamespaceSupersede": true}));
        assert_eq!(cross.group("team-a", "deploy"), "deploy");
        assert_eq!(unqualify("team-a/pr-1"), Some(("team-a", "pr-1")));
    }

    #[test]
    fn forbidden_says_how_to_allow() {
        let m = forbidden("prod-db", "team-c");
        assert!(
            m.contains("namespace team-c may not use ClusterMutex prod-db"),
            "{m}"
        );
        assert!(
            m.contains("spec.namespaces") && m.contains("namespaceSelector"),
            "{m}"
        );
    }
}
