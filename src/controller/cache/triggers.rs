//! Which Mutexes an event concerns. A run's event concerns its own key. A
//! PipelineRun's event, or one of its pods', concerns the keys its lock runs
//! belong to and the keys it holds (its lock run may have been deleted). Both
//! are looked up in the caches' indexes, never by scanning a cache.

use crate::controller::cache::index::{Indexed, Tag, namespace_of};
use crate::core::observe::pending::PendingRun;
use crate::core::observe::{Observe, cluster_mutex_targets};
use crate::core::params::annotations;
use crate::model::mutex::Mutex;
use crate::model::tekton::customrun::CustomRun;
use crate::model::tekton::labels::PIPELINE_RUN_LABEL;
use crate::model::tekton::pipelinerun::PipelineRun;
use crate::model::tekton::run::Run;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;

#[derive(Clone)]
pub struct Triggers {
    pub custom_runs: Option<Indexed<CustomRun>>,
    pub runs: Option<Indexed<Run>>,
    pub mutexes: Indexed<Mutex>,
}

impl Triggers {
    /// The Mutexes that PipelineRun `ns/name` waits for or holds.
    pub fn of_pipeline_run(&self, ns: Option<String>, name: &str) -> Vec<ObjectRef<Mutex>> {
        let tag = Tag::pipeline_run(ns.as_deref().unwrap_or_default(), name);
        let mut refs = Vec::new();
        if let Some(c) = &self.custom_runs {
            refs.extend(c.get(&tag).iter().flat_map(|r| mutex_of(r.as_ref())));
        }
        if let Some(c) = &self.runs {
            refs.extend(c.get(&tag).iter().flat_map(|r| mutex_of(r.as_ref())));
        }
        // The Mutexes whose status names this PipelineRun as a holder.
        refs.extend(
            self.mutexes
                .get(&tag)
                .iter()
                .map(|m| ObjectRef::from_obj(m.as_ref())),
        );
        refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        refs.dedup();
        refs
    }
}

/// The Mutex objects a run belongs to (one per key), if it is a valid Mutex run.
pub fn mutex_of<K: Observe>(obj: &K) -> Vec<ObjectRef<Mutex>> {
    let o = obj.observe();
    if !o.is_mutex() {
        return Vec::new();
    }
    let Ok(cfg) = o.config() else {
        return Vec::new();
    };
    cfg.keys
        .iter()
        .map(|k| ObjectRef::new(k).within(&o.namespace))
        .collect()
}

/// A Mutex run is found by its keys and by its PipelineRun, a ClusterMutex run
/// by its ClusterMutex and by its PipelineRun; other runs not at all.
pub fn run_tags<K: Observe + Resource>(run: &K) -> Vec<Tag> {
    let ns = namespace_of(run);
    let mut tags: Vec<Tag> = mutex_of(run)
        .iter()
        .map(|m| Tag::key(&ns, &m.name))
        .collect();
    if let Some(Ok(names)) = crate::core::observe::cluster_mutex_targets(&run.observe()) {
        tags.extend(names.iter().map(|n| Tag::cluster_mutex(n)));
    }
    if tags.is_empty() {
        return tags;
    }
    if let Some(pr) = run.label(PIPELINE_RUN_LABEL) {
        tags.push(Tag::pipeline_run(&ns, pr));
    }
    tags
}

/// A PipelineRun queued as a whole is found by the lock it queues on: its
/// Mutex's key, or its ClusterMutex. Any other PipelineRun by nothing.
pub fn queued_tags(pr: &PipelineRun) -> Vec<Tag> {
    let opted_in = pr
        .metadata
        .annotations
        .as_ref()
        .is_some_and(annotations::opted_in);
    // Cloned only for the few PipelineRuns that ask to be queued.
    let Some(queued) = opted_in
        .then(|| PendingRun::of(Arc::new(pr.clone())))
        .flatten()
    else {
        return Vec::new();
    };
    let o = queued.observe();
    if let Some(Ok(names)) = cluster_mutex_targets(&o) {
        return names.iter().map(|n| Tag::cluster_mutex(n)).collect();
    }
    match o.config() {
        Ok(cfg) if o.is_mutex() => cfg.keys.iter().map(|k| Tag::key(&o.namespace, k)).collect(),
        _ => Vec::new(),
    }
}

/// The Mutexes a PipelineRun queued as a whole waits for or holds as such.
pub fn queued_mutexes(pr: &PipelineRun) -> Vec<ObjectRef<Mutex>> {
    queued_tags(pr)
        .into_iter()
        .filter_map(|t| match t {
            Tag::Key { namespace, key } => Some(ObjectRef::new(&key).within(&namespace)),
            _ => None,
        })
        .collect()
}

/// The ClusterMutexes a PipelineRun queued as a whole waits for or holds as such.
pub fn queued_cluster_mutexes<K: Resource<DynamicType = ()>>(
    pr: &PipelineRun,
) -> Vec<ObjectRef<K>> {
    queued_tags(pr)
        .into_iter()
        .filter_map(|t| match t {
            Tag::ClusterMutex { name } => Some(ObjectRef::new(&name)),
            _ => None,
        })
        .collect()
}

/// A Mutex is found by the PipelineRuns that hold it.
pub fn mutex_tags(m: &Mutex) -> Vec<Tag> {
    let ns = namespace_of(m);
    m.status
        .iter()
        .flat_map(|s| &s.holders)
        .filter_map(|h| h.pipeline_run.as_deref())
        .map(|pr| Tag::pipeline_run(&ns, pr))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run_of(task_ref: serde_json::Value, params: serde_json::Value) -> CustomRun {
        serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
            "metadata": {"name": "r", "namespace": "ns",
                         "labels": {PIPELINE_RUN_LABEL: "deploy-1"}},
            "spec": {"customRef": task_ref, "params": params},
        }))
        .unwrap()
    }

    #[test]
    fn a_run_is_found_by_its_lock_and_its_pipeline_run() {
        let mutex = run_of(
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"}),
            json!([{"name": "key", "value": "prod"}]),
        );
        let pr = Tag::pipeline_run("ns", "deploy-1");
        assert_eq!(run_tags(&mutex), [Tag::key("ns", "prod"), pr.clone()]);
        let cluster = run_of(
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
                   "name": "shared-db"}),
            json!([]),
        );
        assert_eq!(run_tags(&cluster), [Tag::cluster_mutex("shared-db"), pr]);
        let other = run_of(
            json!({"apiVersion": "example.dev/v1", "kind": "Approval"}),
            json!([]),
        );
        assert!(run_tags(&other).is_empty());
    }
}
