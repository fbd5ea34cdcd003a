//! Label selectors: which PipelineRuns a lock takes by itself (`spec.selector`), where a
//! Mutex reads their key from (`spec.keyFrom`) and a lock their sequence (`sequenceFrom`),
//! for platform teams that own neither the pipelines nor their triggers; and which
//! namespaces may use a ClusterMutex (`spec.namespaceSelector`). The admission policy of
//! config/admission/ makes a selected PipelineRun Pending as it is created; the controller
//! then queues it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The PipelineRuns a lock takes by itself, queued whole: those that match every part
/// given. At least one part must be given: an empty selector would take every run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "size(self.?matchLabels.orValue({})) + size(self.?matchExpressions.orValue([])) + size(self.?pipelines.orValue([])) > 0",
    "message": "a selector takes the PipelineRuns that match all its parts: give matchLabels, matchExpressions or pipelines (an empty selector would take every PipelineRun)"
}]))]
pub struct RunSelector {
    /// Labels the PipelineRun must carry, each with this value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on the PipelineRun's labels, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
    /// The Pipelines (`spec.pipelineRef.name`) whose runs it takes; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub pipelines: Vec<String>,
}

/// Where a value of a selected PipelineRun comes from (its key, its sequence): exactly one
/// of `param` and `label`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.param) != has(self.label)",
    "message": "give exactly one of param and label"
}]))]
pub struct ValueFrom {
    /// The name of a param of the PipelineRun (`spec.params`) whose string value it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub param: Option<String>,
    /// A label of the PipelineRun whose value it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317))]
    pub label: Option<String>,
}

impl RunSelector {
    /// Does a PipelineRun with these labels, of this Pipeline, match every part?
    pub fn matches(&self, labels: &BTreeMap<String, String>, pipeline: Option<&str>) -> bool {
        let by_pipeline = self.pipelines.is_empty()
            || pipeline.is_some_and(|p| self.pipelines.iter().any(|n| n == p));
        by_pipeline && labels_match(&self.match_labels, &self.match_expressions, labels)
    }

    /// Is any part given (the CRD refuses a selector without one)?
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty()
            && self.match_expressions.is_empty()
            && self.pipelines.is_empty()
    }
}

/// A label selector's two parts, as Kubernetes reads them: every label given has its value,
/// and every requirement holds.
fn labels_match(
    match_labels: &BTreeMap<String, String>,
    match_expressions: &[SelectorRequirement],
    labels: &BTreeMap<String, String>,
) -> bool {
    match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
        && match_expressions
            .iter()
            .all(|r| requirement_holds(r, labels))
}

/// One requirement of a label selector, as Kubernetes reads it.
pub fn requirement_holds(r: &SelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    match r.operator {
        SelectorOperator::In => value.is_some_and(|v| r.values.contains(v)),
        SelectorOperator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
        SelectorOperator::Exists => value.is_some(),
        SelectorOperator::DoesNotExist => value.is_none(),
    }
}

/// A label selector over namespaces, as Kubernetes writes them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceSelector {
    /// Labels the namespace must carry, each with this value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements on the namespace's labels, all of which must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One requirement on a namespace's labels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SelectorRequirement {
    /// The label's key.
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: SelectorOperator,
    /// The label's values for In and NotIn; empty for Exists and DoesNotExist.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl NamespaceSelector {
    /// Every requirement holds. An empty selector matches every namespace.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        labels_match(&self.match_labels, &self.match_expressions, labels)
    }
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

    #[test]
    fn every_part_given_must_match() {
        let s: RunSelector = serde_json::from_value(json!({
            "matchLabels": {"env": "staging"},
            "matchExpressions": [{"key": "skip-lock", "operator": "DoesNotExist"}],
            "pipelines": ["promote", "deploy"],
        }))
        .unwrap();
        assert!(s.matches(&labels(&[("env", "staging")]), Some("deploy")));
        assert!(!s.matches(&labels(&[("env", "staging")]), Some("test")));
        assert!(!s.matches(&labels(&[("env", "staging")]), None));
        assert!(!s.matches(&labels(&[("env", "prod")]), Some("deploy")));
        assert!(!s.matches(
            &labels(&[("env", "staging"), ("skip-lock", "")]),
            Some("deploy")
        ));
        let any_pipeline = RunSelector {
            match_labels: labels(&[("env", "staging")]),
            ..Default::default()
        };
        assert!(any_pipeline.matches(&labels(&[("env", "staging")]), None));
        assert!(RunSelector::default().is_empty() && !any_pipeline.is_empty());
    }
}
