//! One view of a Mutex run, whichever protocol carried it: CustomRun
//! (`tekton.dev/v1beta1`) or Run (`tekton.dev/v1alpha1`).

use crate::params::{self, RunConfig, RunInput, Target};
use crate::release_after;
use crate::run_status;
use jiff::Timestamp;
use kube::Resource;
use tekton_mutex_api::cluster_mutex::ClusterMutex;
use tekton_mutex_api::mutex::{Mutex, RunKind, RunRef};
use tekton_mutex_api::tekton::customrun::CustomRun;
use tekton_mutex_api::tekton::labels::{PIPELINE_LABEL, kept_label};
use tekton_mutex_api::tekton::run::Run;
use tekton_mutex_api::tekton::{Param, RUN_CANCELLED, RunStatus, is_done};

pub mod pending;

/// A field selector for pods that have not ended: a terminating pod is still
/// Running until its processes have stopped.
pub const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

#[derive(Clone, Debug)]
pub struct ObservedRun<'a> {
    pub kind: RunKind,
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub resource_version: Option<String>,
    /// `metadata.generation`: above 1, its spec was edited since it was created. None where an
    /// edit is no re-point (a queued PipelineRun, whose grant is an edit of its spec).
    pub generation: Option<i64>,
    /// `metadata.creationTimestamp`. Every object the API server stores has one; one built by
    /// hand without it reads as the oldest there is (the core reads no clock to make one up).
    pub created: Timestamp,
    pub deleting: bool,
    /// The controlling PipelineRun: (name, uid).
    pub parent: Option<(String, String)>,
    pub pipeline_label: Option<String>,
    pub target: Option<Target<'a>>,
    pub params: &'a [Param],
    pub timeout: Option<&'a str>,
    pub retries: Option<i64>,
    pub cancel_requested: bool,
    /// `spec.statusMessage`: why Tekton (or a person) asked the run to stop.
    pub status_message: Option<&'a str>,
    pub status: RunStatus,
    /// Why its settings cannot be read at all (a queued PipelineRun's bad annotation).
    pub refused: Option<&'a str>,
    /// A PipelineRun queued as a whole that Tekton runs (no longer Pending); false for a
    /// lock run.
    pub started: bool,
}

impl<'a> ObservedRun<'a> {
    pub fn of_custom_run(cr: &'a CustomRun) -> Self {
        let target = match (&cr.spec.custom_ref, &cr.spec.custom_spec) {
            (Some(r), _) => Some(Target::Ref(r)),
            (None, Some(s)) => Some(Target::Spec(s)),
            (None, None) => None,
        };
        Self::common(
            cr,
            RunKind::CustomRun,
            target,
            &cr.spec.params,
            cr.spec.timeout.as_deref(),
            cr.spec.retries,
            (cr.spec.status.as_deref(), cr.spec.status_message.as_deref()),
            cr.status.clone(),
        )
    }

    pub fn of_run(run: &'a Run) -> Self {
        let target = match (&run.spec.task_ref, &run.spec.spec) {
            (Some(r), _) => Some(Target::Ref(r)),
            (None, Some(s)) => Some(Target::Spec(s)),
            (None, None) => None,
        };
        Self::common(
            run,
            RunKind::Run,
            target,
            &run.spec.params,
            run.spec.timeout.as_deref(),
            run.spec.retries,
            (
                run.spec.status.as_deref(),
                run.spec.status_message.as_deref(),
            ),
            run.status.clone(),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn common<K: kube::Resource + Observe>(
        obj: &'a K,
        kind: RunKind,
        target: Option<Target<'a>>,
        params: &'a [Param],
        timeout: Option<&'a str>,
        retries: Option<i64>,
        (spec_status, status_message): (Option<&str>, Option<&'a str>),
        status: Option<RunStatus>,
    ) -> Self {
        let meta = obj.meta();
        let parent = meta
            .owner_references
            .iter()
            .flatten()
            .find(|o| {
                o.controller == Some(true)
                    && o.kind == "PipelineRun"
                    && o.api_version.starts_with("tekton.dev/")
            })
            .map(|o| (o.name.clone(), o.uid.clone()));
        ObservedRun {
            kind,
            name: meta.name.clone().unwrap_or_default(),
            namespace: meta.namespace.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            resource_version: meta.resource_version.clone(),
            generation: meta.generation,
            created: meta
                .creation_timestamp
                .as_ref()
                .map(|t| t.0)
                .unwrap_or(Timestamp::UNIX_EPOCH),
            deleting: meta.deletion_timestamp.is_some(),
            parent,
            pipeline_label: obj.label(PIPELINE_LABEL).map(str::to_string),
            target,
            params,
            timeout,
            retries,
            cancel_requested: spec_status == Some(RUN_CANCELLED),
            status_message: status_message.filter(|m| !m.is_empty()),
            status: status.unwrap_or_default(),
            refused: None,
            started: false,
        }
    }

    pub fn is_mutex(&self) -> bool {
        self.target.as_ref().is_some_and(Target::is_mutex)
    }

    /// Is it a run of ours: of a Mutex, or of a ClusterMutex?
    pub fn is_ours(&self) -> bool {
        self.is_mutex() || cluster_mutex_targets(self).is_some()
    }

    pub fn is_done(&self) -> bool {
        is_done(self.status.succeeded())
    }

    pub fn run_ref(&self) -> RunRef {
        RunRef {
            kind: self.kind,
            name: self.name.clone(),
            uid: self.uid.clone(),
        }
    }

    /// The locks the run names now: their kind and names (Mutex names as the Mutex objects
    /// are named). None if it names none readably (intake then refuses its params).
    pub fn named_locks(&self) -> Option<(String, Vec<String>)> {
        match cluster_mutex_targets(self) {
            Some(targets) => Some((ClusterMutex::kind(&()).into_owned(), targets.ok()?)),
            None if self.is_mutex() => {
                Some((Mutex::kind(&()).into_owned(), self.config().ok()?.keys))
            }
            None => None,
        }
    }

    /// A live run whose status a lock wrote, though its params or taskRef now name another lock,
    /// or its `release-after` another section: it was re-pointed after it was first seen (issue
    /// 23 item 2). A lock run never moves, so the answer is the InvalidParams message naming
    /// what changed; a granted (done) run keeps its hold with the first lock and section instead.
    pub fn repointed(&self) -> Option<String> {
        if self.is_done() {
            return None;
        }
        if let Some(changed) = self.release_after_changed() {
            return Some(changed);
        }
        let Some((was_kind, was_key)) = run_status::written_by(&self.status) else {
            return self.edited_before_first_seen();
        };
        let (kind, names) = self.named_locks()?;
        let was_kind = was_kind.unwrap_or_else(|| kind.clone());
        // A run of several keys is told under all of them (`a,b`).
        let same_keys = was_key.split(',').all(|k| names.iter().any(|n| n == k));
        if was_kind == kind && same_keys {
            return None;
        }
        Some(format!(
            "the run was first queued on {was_kind} {was_key:?}, and its key, keys or taskRef now \
             name {kind} {:?}: a lock run cannot move to another lock; put the key back, or create \
             a new run",
            names.join(",")
        ))
    }

    /// A run no one has told yet whose spec was edited since it was created (`generation` above
    /// 1). Tekton edits a CustomRun's spec only to cancel it, so someone else did: maybe its key,
    /// before the lock first wrote its status and recorded the key. Which key its pipeline
    /// guards is not known, so the run joins none (issue 23 item 2, found by the chaos campaign).
    fn edited_before_first_seen(&self) -> Option<String> {
        let generation = self.generation.filter(|g| *g > 1)?;
        if self.cancel_requested || !self.status.conditions.is_empty() {
            return None;
        }
        Some(format!(
            "the run's spec was edited before the lock first saw it (generation {generation}): \
             a lock run cannot be re-pointed or changed; create a new run"
        ))
    }

    /// The message for a `release-after` that is no longer what the lock recorded at its first
    /// tell. An unreadable value is left to [`Self::config`]'s message.
    fn release_after_changed(&self) -> Option<String> {
        let param = self.params.iter().find(|p| p.name == release_after::PARAM);
        let now = match param {
            Some(p) => release_after::parse(p.value.as_str()?).ok()?,
            None => Vec::new(),
        };
        run_status::release_after_change(&self.status, &now)
    }

    /// The run's settings, or the message for an InvalidParams failure. Its `release-after` is
    /// the one the lock recorded at its first tell, whatever the param says since: a held run
    /// lets go after the section it was granted for.
    pub fn config(&self) -> Result<RunConfig, String> {
        if let Some(why) = self.refused {
            return Err(why.to_string());
        }
        let parsed = self.parse();
        match self.kind {
            RunKind::PipelineRun => {
                parsed.map_err(|m| params::annotations::as_annotation_message(&m))
            }
            RunKind::CustomRun | RunKind::Run => parsed,
        }
    }

    fn parse(&self) -> Result<RunConfig, String> {
        let target = self
            .target
            .clone()
            .ok_or("the run has neither a task reference nor an embedded spec")?;
        let mut cfg = params::parse(&RunInput {
            namespace: &self.namespace,
            target,
            params: self.params,
            timeout: self.timeout,
            retries: self.retries,
        })?;
        if let Some(recorded) = run_status::recorded_release_after(&self.status) {
            cfg.release_after = recorded;
        }
        Ok(cfg)
    }

    /// When the current attempt started waiting.
    pub fn attempt_start(&self) -> Timestamp {
        self.status
            .start_time
            .as_deref()
            .and_then(|s| s.parse().ok())
            .unwrap_or(self.created)
    }

    /// When the run started waiting: its first attempt's start (an earlier
    /// attempt's, after a retry), else its creation.
    pub fn waiting_since(&self) -> Timestamp {
        self.status
            .retries_status
            .first()
            .and_then(|a| a.get("startTime"))
            .and_then(|t| t.as_str())
            .or(self.status.start_time.as_deref())
            .and_then(|s| s.parse().ok())
            .unwrap_or(self.created)
    }
}

/// Helper so callers can write `observe(&obj)` for either kind.
pub trait Observe {
    fn observe(&self) -> ObservedRun<'_>;
    /// One of the labels the controller reads (`tekton::labels`).
    fn label(&self, name: &str) -> Option<&str>;
}

impl Observe for CustomRun {
    fn observe(&self) -> ObservedRun<'_> {
        ObservedRun::of_custom_run(self)
    }

    fn label(&self, name: &str) -> Option<&str> {
        kept_label(&self.spec.kept_labels, &self.metadata, name)
    }
}

impl Observe for Run {
    fn observe(&self) -> ObservedRun<'_> {
        ObservedRun::of_run(self)
    }

    fn label(&self, name: &str) -> Option<&str> {
        kept_label(&self.spec.kept_labels, &self.metadata, name)
    }
}

/// A run that refers to ClusterMutexes: `Some(Ok(names))`, the one named in
/// taskRef.name or, with no name, the several of param `keys`; `Some(Err(message))`
/// when it does so in a way we refuse. None: not a ClusterMutex run.
pub fn cluster_mutex_targets(o: &ObservedRun<'_>) -> Option<Result<Vec<String>, String>> {
    let api_version = ClusterMutex::api_version(&());
    let kind = ClusterMutex::kind(&());
    match o.target.as_ref()? {
        Target::Ref(r) if r.api_version == api_version && r.kind == kind => {
            Some(match r.name.as_deref().filter(|n| !n.is_empty()) {
                Some(n) => Ok(vec![n.to_string()]),
                None => keys_param(o).unwrap_or_else(|| {
                    Err(format!(
                        "a {kind} run names its {kind} in taskRef.name, or several in param \"keys\" \
                         (an administrator creates each)"
                    ))
                }),
            })
        }
        Target::Spec(s) if s.api_version == api_version && s.kind == kind => Some(Err(format!(
            "a {kind} cannot be embedded: an administrator creates it, and a run refers to it with \
             taskRef {{apiVersion: {api_version}, kind: {kind}, name: ...}}"
        ))),
        _ => None,
    }
}

/// The names of param `keys`, if the run has it.
fn keys_param(o: &ObservedRun<'_>) -> Option<Result<Vec<String>, String>> {
    let p = o.params.iter().find(|p| p.name == "keys")?;
    Some(match p.value.as_str() {
        Some(v) => params::keys::parse(v),
        None => Err("param \"keys\" must be a string".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn targets(
        task_ref: serde_json::Value,
        keys: Option<&str>,
    ) -> Option<Result<Vec<String>, String>> {
        let params: Vec<_> = keys
            .map(|k| json!({"name": "keys", "value": k}))
            .into_iter()
            .collect();
        let cr: CustomRun = serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"customRef": task_ref, "params": params},
        }))
        .unwrap();
        cluster_mutex_targets(&cr.observe())
    }

    #[test]
    fn a_cluster_mutex_run_names_one_by_task_ref_or_several_by_keys() {
        let cm = |name: Option<&str>| {
            let mut r = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex"});
            if let Some(n) = name {
                r["name"] = json!(n);
            }
            r
        };
        assert_eq!(targets(cm(Some("db")), None), Some(Ok(vec!["db".into()])));
        assert_eq!(
            targets(cm(None), Some("db, cache")),
            Some(Ok(vec!["db".into(), "cache".into()]))
        );
        let unnamed = targets(cm(None), None).unwrap().unwrap_err();
        assert!(unnamed.contains("param \"keys\""), "{unnamed}");
        let twice = targets(cm(None), Some("db,db")).unwrap().unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
        let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
        assert_eq!(targets(mutex, Some("a,b")), None, "a Mutex run is not one");
    }

    fn told(
        key_param: (&str, &str),
        task_ref: serde_json::Value,
        by: serde_json::Value,
    ) -> CustomRun {
        serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"customRef": task_ref, "params": [{"name": key_param.0, "value": key_param.1}]},
            "status": {"conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "Waiting"}],
                       "extraFields": by},
        }))
        .unwrap()
    }

    #[test]
    fn a_waiting_run_re_pointed_at_another_lock_is_refused_naming_both() {
        let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"});
        let by_staging = json!({"key": "staging", "lockKind": "Mutex"});
        let same = told(("key", "staging"), mutex.clone(), by_staging.clone());
        assert_eq!(same.observe().repointed(), None);
        let moved = told(("key", "prod"), mutex.clone(), by_staging.clone());
        let why = moved.observe().repointed().unwrap();
        assert!(
            why.contains("Mutex \"staging\"") && why.contains("\"prod\""),
            "{why}"
        );
        let cluster = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex", "name": "staging"});
        let to_cluster = told(("key", "staging"), cluster, by_staging.clone());
        assert!(
            to_cluster
                .observe()
                .repointed()
                .unwrap()
                .contains("ClusterMutex")
        );
        // One of its keys told it: not re-pointed. A status no lock wrote: nothing to compare.
        let multi = told(("keys", "db,staging"), mutex.clone(), by_staging);
        assert_eq!(multi.observe().repointed(), None);
        let by_both = json!({"key": "db,staging", "lockKind": "Mutex"});
        let both = told(("keys", "db,staging"), mutex.clone(), by_both.clone());
        assert_eq!(both.observe().repointed(), None);
        let other = told(("keys", "db,prod"), mutex.clone(), by_both);
        assert!(other.observe().repointed().is_some());
        let fresh = told(("key", "prod"), mutex, json!({}));
        assert_eq!(fresh.observe().repointed(), None);
    }

    /// The chaos campaign's seed 601721574: a run re-pointed before the lock's first status write
    /// joined its new key while its pipeline deployed the old one.
    #[test]
    fn a_run_edited_before_the_lock_first_saw_it_is_refused() {
        let run = |generation: i64, spec_status: Option<&str>, status: serde_json::Value| {
            let cr: CustomRun = serde_json::from_value(json!({
                "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
                "metadata": {"name": "r", "namespace": "ns", "generation": generation},
                "spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
                         "params": [{"name": "key", "value": "prod"}], "status": spec_status},
                "status": status,
            }))
            .unwrap();
            cr
        };
        let edited = run(2, None, json!({}));
        let why = edited.observe().repointed().unwrap();
        assert!(
            why.contains("generation 2") && why.contains("create a new run"),
            "{why}"
        );
        assert_eq!(
            run(1, None, json!({})).observe().repointed(),
            None,
            "as created"
        );
        let cancelled = run(2, Some("RunCancelled"), json!({}));
        assert_eq!(cancelled.observe().repointed(), None, "Tekton's own edit");
        let told = json!({"conditions": [{"type": "Succeeded", "status": "Unknown", "reason": "Waiting"}]});
        assert_eq!(
            run(3, None, told).observe().repointed(),
            None,
            "an older lock's tell"
        );
    }

    fn with_release_after(
        param: Option<&str>,
        condition: (&str, &str),
        fields: serde_json::Value,
    ) -> CustomRun {
        let mut params = vec![json!({"name": "key", "value": "staging"})];
        params.extend(param.map(|v| json!({"name": "release-after", "value": v})));
        serde_json::from_value(json!({
            "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
            "metadata": {"name": "r", "namespace": "ns"},
            "spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
                     "params": params},
            "status": {"conditions": [{"type": "Succeeded", "status": condition.0, "reason": condition.1}],
                       "extraFields": fields},
        }))
        .unwrap()
    }

    /// Issue 23 item 2: a waiting run whose `release-after` changed since its first tell is
    /// refused naming the field; a held run keeps the section it was granted for; a run an
    /// older controller told (no record) goes by its param.
    #[test]
    fn a_run_keeps_the_release_after_it_was_first_told_under() {
        let waiting = ("Unknown", "Waiting");
        let recorded = json!({"key": "staging", "lockKind": "Mutex", "releaseAfter": "deploy"});
        let same = with_release_after(Some("deploy"), waiting, recorded.clone());
        assert_eq!(same.observe().repointed(), None);
        let changed = with_release_after(Some("quick"), waiting, recorded.clone());
        let why = changed.observe().repointed().unwrap();
        assert!(
            why.contains("\"release-after\"") && why.contains("\"deploy\""),
            "{why}"
        );
        let dropped = with_release_after(None, waiting, recorded.clone());
        assert!(dropped.observe().repointed().is_some());
        let held = with_release_after(Some("quick"), ("True", "Acquired"), recorded);
        assert_eq!(held.observe().repointed(), None, "a held run is not failed");
        assert_eq!(held.observe().config().unwrap().release_after, ["deploy"]);
        let older = json!({"key": "staging", "lockKind": "Mutex"});
        let untold = with_release_after(Some("quick"), waiting, older);
        assert_eq!(untold.observe().repointed(), None);
        assert_eq!(untold.observe().config().unwrap().release_after, ["quick"]);
    }
}
