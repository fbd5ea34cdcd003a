//! A PipelineRun queued as a whole (created `PipelineRunPending` with a key
//! annotation) seen as a lock's member: a run of kind `PipelineRun` that is its
//! own PipelineRun. Its params come from its annotations, its status is the
//! record the controller keeps on it, and its wait is bounded by its queue timeout.

use super::ObservedRun;
use crate::params::Target;
use crate::params::annotations::{self, AnnotatedLock};
use jiff::Timestamp;
use kube::ResourceExt;
use sha2::Digest;
use std::sync::Arc;
use tekton_mutex_api::mutex::RunKind;
use tekton_mutex_api::tekton::RunStatus;
use tekton_mutex_api::tekton::labels::PIPELINE_LABEL;
use tekton_mutex_api::tekton::pipelinerun::PipelineRun;

/// A PipelineRun with the key annotation, read for the lock.
#[derive(Clone, Debug)]
pub struct PendingRun {
    pub object: Arc<PipelineRun>,
    lock: Result<AnnotatedLock, String>,
    /// What the controller last told it, if the record is bound to this PipelineRun.
    record: Option<RunStatus>,
    /// Its default supersede group: its `pipelineRef` ([`pipeline_group`]), else the
    /// Pipeline label Tekton puts on a started PipelineRun.
    pipeline: Option<String>,
}

impl PendingRun {
    /// None unless the PipelineRun carries the key annotation.
    pub fn of(object: Arc<PipelineRun>) -> Option<PendingRun> {
        let annotations = object.metadata.annotations.as_ref()?;
        let lock = annotations::read(annotations)?;
        let record = bound_record(annotations.get(annotations::RECORD), object.uid());
        let pipeline = object
            .spec
            .pipeline_ref
            .as_ref()
            .and_then(pipeline_group)
            .or_else(|| object.label(PIPELINE_LABEL).map(str::to_string));
        Some(PendingRun {
            object,
            lock,
            record,
            pipeline,
        })
    }

    /// Has the controller ever written its record for this very PipelineRun (it was queued)?
    pub fn recorded(&self) -> bool {
        self.record.is_some()
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
                .unwrap_or(Timestamp::UNIX_EPOCH),
            deleting: meta.deletion_timestamp.is_some(),
            pipeline_label: self.pipeline.clone(),
            target,
            params,
            timeout,
            retries: None,
            cancel_requested: self.object.stop_requested() && !self.recorded_done(),
            status_message: None,
            status: self.record.clone().unwrap_or_default(),
            refused,
            // A stop (Cancelled, ...) is no start: anyone may cancel a waiting run.
            started: !self.object.is_pending() && !self.object.stop_requested(),
        }
    }

    fn recorded_done(&self) -> bool {
        let record = self.record.as_ref();
        record.is_some_and(|r| tekton_mutex_api::tekton::is_done(r.succeeded()))
    }
}

/// The default supersede group of a PipelineRun by its `pipelineRef`, the same before and
/// after it starts: the Pipeline's name; for a remote Pipeline (a resolver, issue 37 item 9),
/// the resolver and where the Pipeline lives, without its version (`revision`, `version`, a
/// bundle's tag or digest), so that every build of one Pipeline is one group.
pub fn pipeline_group(r: &tekton_mutex_api::tekton::pipelinerun::PipelineRef) -> Option<String> {
    if let Some(name) = &r.name {
        return Some(name.clone());
    }
    let resolver = r.resolver.as_deref()?;
    let mut place: Vec<String> = r
        .params
        .iter()
        .filter(|p| !matches!(p.name.as_str(), "revision" | "version"))
        .map(|p| {
            let value = p
                .value
                .as_str()
                .map_or_else(|| p.value.to_string(), str::to_string);
            let value = match p.name.as_str() {
                "bundle" => without_version(&value).to_string(),
                _ => value,
            };
            format!("{}={value}", p.name)
        })
        .collect();
    place.sort();
    let digest = sha2::Sha256::digest(place.join("\n").as_bytes());
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{resolver}-{hex}"))
}

/// An image reference without its tag or digest (`registry/repo:tag@sha256:...` -> `registry/repo`).
fn without_version(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rfind(':') {
        Some(colon) if !image[colon..].contains('/') => &image[..colon],
        _ => image,
    }
}

/// `status.extraFields` key of the record naming the uid of the PipelineRun it was written
/// for. The record is an annotation, which anyone who can edit the PipelineRun can copy or
/// write: bound to the uid, a copy's record (a Rerun, `kubectl get -o yaml` and create) is
/// no record at all, and the copy is a new member.
pub const MEMBER_FIELD: &str = "member";

/// The record, if it was written for the PipelineRun of `uid`; None otherwise (absent,
/// unreadable, copied from another PipelineRun, or from before records were bound).
fn bound_record(text: Option<&String>, uid: Option<String>) -> Option<RunStatus> {
    let record: RunStatus = serde_json::from_str(text?).ok()?;
    let member = record.extra_fields.as_ref()?.get(MEMBER_FIELD)?.as_str()?;
    (Some(member) == uid.as_deref()).then_some(record)
}

/// A queued PipelineRun's claim to hold the key, as the lock's own status vouches for it.
/// The record says what the controller told it, but it is an annotation its author can
/// write: it counts as a grant only if the lock's status (which only the controller writes)
/// lists this PipelineRun, by uid, as a holder with that token. So no annotation can grant
/// a slot, add a holder, or raise `lastToken`. The limit: a status wiped by hand while a
/// queued PipelineRun holds forgets that hold.
pub fn vouched_token(
    claimed: Option<i64>,
    uid: &str,
    status: &tekton_mutex_api::mutex::MutexStatus,
) -> Option<i64> {
    let token = claimed?;
    let listed = status
        .holders
        .iter()
        .any(|h| h.run.uid == uid && h.token == token);
    listed.then_some(token)
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
        let record = granted_record("u1", 4);
        let granted = pending(
            json!({"tekton-mutex.dev/key": "k", "tekton-mutex.dev/lock-record": record.to_string()}),
            None,
        );
        assert!(!granted.started_unqueued());
        let o = granted.observe();
        assert!(o.is_done());
        assert_eq!(crate::run_status::acquired_token(&o.status), Some(4));
    }

    fn granted_record(member: &str, token: i64) -> serde_json::Value {
        json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
               "results": [{"name": "token", "value": token.to_string()}],
               "extraFields": {"key": "k", "member": member}})
    }

    /// Issue 37 item 1: a Rerun copies the annotations, the record included. The copy has
    /// another uid, so the record is not its own: the copy is a new member, never a holder.
    #[test]
    fn a_copied_record_is_no_record_so_a_copy_is_a_new_member() {
        let copied = granted_record("the-original-uid", 4);
        let copy = pending(
            json!({"tekton-mutex.dev/key": "k", "tekton-mutex.dev/lock-record": copied.to_string()}),
            Some("PipelineRunPending"),
        );
        assert!(!copy.recorded());
        let o = copy.observe();
        assert!(!o.is_done(), "it waits like any new member");
        assert_eq!(crate::run_status::acquired_token(&o.status), None);
        let started = pending(
            json!({"tekton-mutex.dev/key": "k", "tekton-mutex.dev/lock-record": copied.to_string()}),
            None,
        );
        assert!(
            started.started_unqueued(),
            "a copy not Pending is NotQueued"
        );
        let unbound = json!({"conditions": [{"type": "Succeeded", "status": "True", "reason": "Acquired"}],
                             "results": [{"name": "token", "value": "4"}]});
        let old = pending(
            json!({"tekton-mutex.dev/key": "k", "tekton-mutex.dev/lock-record": unbound.to_string()}),
            Some("PipelineRunPending"),
        );
        assert!(!old.recorded(), "a record bound to no uid is no record");
    }

    /// Issue 37 item 4: a record its author wrote grants nothing the lock's status does not list.
    #[test]
    fn only_the_locks_status_vouches_for_a_queued_grant() {
        use tekton_mutex_api::mutex::{Age, Holder, MutexStatus, RunRef, Supersede};
        let holder = |uid: &str, token| Holder {
            run: RunRef {
                kind: RunKind::PipelineRun,
                name: "promote-1".into(),
                uid: uid.into(),
            },
            pipeline_run: Some("promote-1".into()),
            pipeline_run_uid: Some(uid.into()),
            token,
            since: Timestamp::UNIX_EPOCH,
            waited_seconds: 0,
            group: "g".into(),
            age: Age {
                sequence: None,
                created: Timestamp::UNIX_EPOCH,
                name: "promote-1".into(),
            },
            supersede: Supersede::Pending,
        };
        let status = MutexStatus {
            holders: vec![holder("u1", 4)],
            last_token: 4,
            ..MutexStatus::default()
        };
        assert_eq!(vouched_token(Some(4), "u1", &status), Some(4));
        assert_eq!(vouched_token(Some(5), "u1", &status), None, "another token");
        assert_eq!(vouched_token(Some(4), "u2", &status), None, "another uid");
        let forged = tekton_mutex_api::mutex::MAX_TOKEN;
        assert_eq!(vouched_token(Some(forged), "u2", &status), None);
        assert_eq!(vouched_token(None, "u1", &status), None);
    }

    /// Issue 37 item 9: PipelineRuns of one remote Pipeline are one supersede group, whatever
    /// revision they run, before and after Tekton starts them; another Pipeline is another.
    #[test]
    fn a_resolver_ref_gives_one_group_per_remote_pipeline() {
        let git = |revision: &str, path: &str| {
            serde_json::from_value::<tekton_mutex_api::tekton::pipelinerun::PipelineRef>(json!({
                "resolver": "git",
                "params": [{"name": "url", "value": "https://example.com/org/repo.git"},
                           {"name": "revision", "value": revision},
                           {"name": "pathInRepo", "value": path}]}))
            .unwrap()
        };
        let a = pipeline_group(&git("abc123", "promote.yaml")).unwrap();
        assert_eq!(
            Some(a.clone()),
            pipeline_group(&git("def456", "promote.yaml"))
        );
        assert_ne!(
            Some(a.clone()),
            pipeline_group(&git("abc123", "build.yaml"))
        );
        assert!(a.starts_with("git-"), "{a}");
        let bundle = |image: &str| {
            serde_json::from_value::<tekton_mutex_api::tekton::pipelinerun::PipelineRef>(json!({
                "resolver": "bundles",
                "params": [{"name": "bundle", "value": image}, {"name": "name", "value": "promote"}]}))
            .unwrap()
        };
        assert_eq!(
            pipeline_group(&bundle("registry.example/p:v1")),
            pipeline_group(&bundle("registry.example/p:v2@sha256:0123"))
        );
        assert_eq!(without_version("localhost:5000/p"), "localhost:5000/p");
        let named = serde_json::from_value(json!({"name": "promote"})).unwrap();
        assert_eq!(pipeline_group(&named).as_deref(), Some("promote"));
    }
}
