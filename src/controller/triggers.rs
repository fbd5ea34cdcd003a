//! Which Mutexes an event concerns. A run's event concerns its own key. A
//! PipelineRun's event, or one of its pods', concerns the keys its lock runs
//! belong to and the keys it holds (its lock run may have been deleted).

use crate::mutex::Mutex;
use crate::observe::{Observe, PIPELINE_RUN_LABEL};
use crate::tekton::customrun::CustomRun;
use crate::tekton::run::Run;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};

#[derive(Clone)]
pub struct Triggers {
    pub custom_runs: Option<Store<CustomRun>>,
    pub runs: Option<Store<Run>>,
    pub mutexes: Store<Mutex>,
}

impl Triggers {
    /// The Mutexes that PipelineRun `ns/name` waits for or holds.
    pub fn of_pipeline_run(&self, ns: Option<String>, name: &str) -> Vec<ObjectRef<Mutex>> {
        let mut refs = Vec::new();
        if let Some(s) = &self.custom_runs {
            refs.extend(mutexes_of_children(s, &ns, name));
        }
        if let Some(s) = &self.runs {
            refs.extend(mutexes_of_children(s, &ns, name));
        }
        refs.extend(self.held_by(&ns, name));
        refs.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        refs.dedup();
        refs
    }

    /// The Mutexes whose status names this PipelineRun as a holder.
    fn held_by(&self, ns: &Option<String>, name: &str) -> Vec<ObjectRef<Mutex>> {
        self.mutexes
            .state()
            .iter()
            .filter(|m| m.namespace() == *ns)
            .filter(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.holders
                        .iter()
                        .any(|h| h.pipeline_run.as_deref() == Some(name))
                })
            })
            .map(|m| ObjectRef::from_obj(m.as_ref()))
            .collect()
    }
}

/// The Mutexes that the lock runs of this PipelineRun belong to.
fn mutexes_of_children<K>(
    store: &Store<K>,
    ns: &Option<String>,
    name: &str,
) -> Vec<ObjectRef<Mutex>>
where
    K: Observe + Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .state()
        .iter()
        .filter(|c| {
            c.namespace() == *ns
                && c.labels().get(PIPELINE_RUN_LABEL).map(String::as_str) == Some(name)
        })
        .flat_map(|c| mutex_of(c.as_ref()))
        .collect()
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
