//! The labels Tekton puts on a PipelineRun's children that the controller reads,
//! and how a cached run keeps them.

use kube::core::ObjectMeta;

/// Label Tekton copies from the PipelineRun: the Pipeline's name.
pub const PIPELINE_LABEL: &str = "tekton.dev/pipeline";
/// Label Tekton puts on every child of a PipelineRun, pods included.
pub const PIPELINE_RUN_LABEL: &str = "tekton.dev/pipelineRun";
/// The PipelineRun's uid, on its children (Tekton v0.50 and later).
pub const PIPELINE_RUN_UID_LABEL: &str = "tekton.dev/pipelineRunUID";
/// Label Tekton puts on a pipeline task's children and pods: the task's name.
pub const PIPELINE_TASK_LABEL: &str = "tekton.dev/pipelineTask";

/// The labels the controller reads on a run or a PipelineRun, once the cache
/// has taken them out of the object's label map. A map allocates room for
/// eleven entries from its first: half a KiB per object, for a few short values.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeptLabels {
    pipeline: Option<Box<str>>,
    pipeline_run: Option<Box<str>>,
    pipeline_task: Option<Box<str>>,
}

impl KeptLabels {
    /// Keeps the labels the controller reads and drops the label map.
    pub fn take(meta: &mut ObjectMeta) -> Self {
        let mut labels = meta.labels.take().unwrap_or_default();
        let mut keep = |name: &str| labels.remove(name).map(String::into_boxed_str);
        KeptLabels {
            pipeline: keep(PIPELINE_LABEL),
            pipeline_run: keep(PIPELINE_RUN_LABEL),
            pipeline_task: keep(PIPELINE_TASK_LABEL),
        }
    }

    fn get(&self, name: &str) -> Option<&str> {
        let value = match name {
            PIPELINE_LABEL => &self.pipeline,
            PIPELINE_RUN_LABEL => &self.pipeline_run,
            PIPELINE_TASK_LABEL => &self.pipeline_task,
            _ => {
                debug_assert!(false, "label {name} is not kept on cached runs");
                &None
            }
        };
        value.as_deref()
    }
}

/// An object's label: from what the cache kept if it took the labels out
/// (`kept`), else from its label map.
pub fn kept_label<'a>(
    kept: &'a Option<KeptLabels>,
    meta: &'a ObjectMeta,
    name: &str,
) -> Option<&'a str> {
    match kept {
        Some(labels) => labels.get(name),
        None => meta.labels.as_ref()?.get(name).map(String::as_str),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_reads_the_same_labels_before_and_after_they_are_taken_out() {
        let mut meta = ObjectMeta {
            labels: Some(
                [
                    (PIPELINE_LABEL, "deploy"),
                    (PIPELINE_RUN_LABEL, "deploy-1"),
                    ("app.kubernetes.io/part-of", "shop"),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ),
            ..Default::default()
        };
        let read = |kept: &Option<KeptLabels>, meta: &ObjectMeta| {
            [PIPELINE_LABEL, PIPELINE_RUN_LABEL, PIPELINE_TASK_LABEL]
                .map(|name| kept_label(kept, meta, name).map(str::to_string))
        };
        let before = read(&None, &meta);
        let kept = Some(KeptLabels::take(&mut meta));
        assert_eq!(meta.labels, None);
        assert_eq!(read(&kept, &meta), before);
        assert_eq!(before[1].as_deref(), Some("deploy-1"));
    }
}
