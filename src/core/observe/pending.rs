//! A PipelineRun queued as a whole (created `PipelineRunPending` with a key
//! annotation) seen as a lock's member: a run of kind `PipelineRun` that is its
//! own PipelineRun. Its params come from its annotations, its status is the
//! record the controller keeps on it, and its wait is bounded by its queue timeout.

use super::ObservedRun;
use crate::core::params::Target;
use crate::core::params::annotations::{self, AnnotatedLock};
use crate::model::mutex::RunKind;
use crate::model::tekton::RunStatus;
use crate::model::tekton::labels::PIPELINE_LABEL;
use crate::model::tekton::pipelinerun::PipelineRun;
use jiff::Timestamp;
use std::sync::Arc;

/// A PipelineRun with the key annotation, read for the lock.
#[derive(Clone, Debug)]
pub struct PendingRun {
    pub object: Arc<PipelineRun>,
    lock: Result<AnnotatedLock, String>,
    /// What the controller last told it (empty before it was first seen).
    record: RunStatus,
    /// Its Pipeline's name: the label once Tekton has started it, else its `pipelineRef`.
    pipeline: Option<String>,
}

impl PendingRun {
    /// None unless the PipelineRun carries the key annotation.
    pub fn of(object: Arc<PipelineRun>) -> Option<PendingRun> {
        let annotations = object.metadata.annotations.as_ref()?;
        let lock = annotations::read(annotations)?;
        let record = annotations
            .get(annotations::RECORD)
            .and_then(|r| serde_json::from_str(r).ok())
            .unwrap_or_default();
        let pipeline = object
            .label(PIPELINE_LABEL)
            .map(str::to_string)
            .or_else(|| object.spec.pipeline_ref.as_ref()?.name.clone());
        Some(PendingRun {
            object,
            lock,
            record,
            pipeline,
        })
    }

    /// Has the controller ever written its record (it was queued, or refused)?
    pub fn recorded(&self) -> bool {
        self.object
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::RECORD))
    }

    /// A PipelineRun that Tekton already started before the lock recorded it:
    /// the lock cannot hold it back any more, so it leaves it alone.
    pub fn started_unqueued(&self) -> bool {
        !self.recorded() && !self.object.is_pending()
    }

    pub fn observe(&self) -> ObservedRun<'_> {
        let meta = &self.object.metadata;
        let (target, params, timeout, refused) = match &self.lock {
            Ok(l) => (
                Some(Target::Ref(&l.task_ref)),
                l.params.as_slice(),
                l.queue_timeout.as_deref(),
                None,
            ),
            Err(e) => (None, &[][..], None, Some(e.as_str())),
        };
        let (name, uid) = (
            meta.name.clone().unwrap_or_default(),
            meta.uid.clone().unwrap_or_default(),
        );
        ObservedRun {
            kind: RunKind::PipelineRun,
            parent: Some((name.clone(), uid.clone())),
            name,
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid,
            resource_version: meta.resource_version.clone(),
            generation: None,
            created: meta
                .creation_timestamp
                .as_ref()
                .map(|t| t.0)
                .unwrap_or_else(Timestamp::now),
            deleting: meta.deletion_timestamp.is_some(),
            pipeline_label: self.pipeline.clone(),
            target,
            params,
            timeout,
            retries: None,
            cancel_requested: self.object.stop_requested() && !self.recorded_done(),
            status_message: None,
            status: self.record.clone(),
            refused,
        }
    }

    fn recorded_done(&self) -> bool {
        crate::model::tekton::is_done(self.record.succeeded())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pending(annotations: serde_json::Value, status: Option<&str>) -> PendingRun {
        let pr: PipelineRun = serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
            "metadata": {"name": "promote-1", "namespace": "ns", "uid": "u1",
                         "annotations": annotations},
            "spec": {"status": status, "pipelineRef": {"name": "promote-unguarded"}},
        }))
        .unwrap();
        PendingRun::of(Arc::new(pr)).unwrap()
    }

    #[test]
    fn a_pending_pipeline_run_is_a_run_of_its_key_and_its_own_pipeline_run() {
        let p = pending(
            json!({"tekton-mutex.dev/key": "jx-staging", "tekton-mutex.dev/queue-timeout": "1h"}),
            Some("PipelineRunPending"),
        );
        let o = p.observe();
        assert_eq!(o.kind, RunKind::PipelineRun);
        assert_eq!(o.parent, Some(("promote-1".into(), "u1".into())));
        assert_eq!(o.pipeline_label.as_deref(), Some("promote-unguarded"));
        let cfg = o.config().unwrap();
        assert_eq!(cfg.key, "jx-staging");
        assert!(!o.is_done() && !p.started_unqueued());
    }

    #[test]
    fn bad_annotations_refuse_it_naming_the_annotation() {
        let p = pending(
            json!({"tekton-mutex.dev/key": "k", "tekton-mutex.dev/priority": "high"}),
            Some("PipelineRunPending"),
        );
        let why = p.observe().config().unwrap_err();
        assert!(
            why.contains("annotation tekton-mutex.dev/priority"),
            "{why}"
        );
        let unknown = pending(
            json!({"tekton-mutex.dev/key": "k", "tekton-mutex.dev/wait-for": "x"}),
            Some("PipelineRunPending"),
        );
        assert!(
            unknown
                .observe()
                .config()
                .unwrap_err()
                .contains("unknown annotation")
        );
    }

    #[test]
    fn one_started_before_the_lock_saw_it_is_left_alone() {
        let p = pending(json!({"tekton-mutex.dev/key": "k"}), None);
        assert!(p.started_unqueued());
        let record = json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
                            "results": [{"name": "token", "value": "4"}]});
        let granted = pending(
            json!({"tekton-mutex.dev/key": "k", "tekton-mutex.dev/lock-record": record.to_string()}),
            None,
        );
        assert!(!granted.started_unqueued());
        let o = granted.observe();
        assert!(o.is_done());
        assert_eq!(crate::core::run_status::acquired_token(&o.status), Some(4));
    }
}
