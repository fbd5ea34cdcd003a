use super::*;
use serde_json::{Value, json};

/// A PipelineRun the admission policy made Pending (and marked), unless `spec` sets a status.
fn pr(labels: Value, mut annotations: Value, mut spec: Value) -> PipelineRun {
    if spec.get("status").is_none() {
        spec["status"] = json!("PipelineRunPending");
        annotations[PENDING_FOR] = json!("Mutex/staging");
    }
    serde_json::from_value(json!({
        "apiVersion": "tekton.dev/v1", "kind": "PipelineRun",
        "metadata": {"name": "deploy-1", "namespace": "jx", "labels": labels,
                     "annotations": annotations},
        "spec": spec,
    }))
    .unwrap()
}

fn mutex(name: &str, spec: Value) -> Mutex {
    serde_json::from_value(json!({
        "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": name, "namespace": "jx"}, "spec": spec,
    }))
    .unwrap()
}

fn cluster_mutex(name: &str, spec: Value) -> ClusterMutex {
    serde_json::from_value(json!({
        "apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

fn queued_on(s: &Selection) -> (&str, Option<&str>, bool) {
    match s {
        Selection::Stamp { by, annotations } => (
            annotations[KEY].as_str(),
            Some(by.as_str()),
            annotations.get(CLUSTER_MUTEX).is_some_and(|c| c == "true"),
        ),
        other => panic!("not queued: {other:?}"),
    }
}

fn staging_run() -> PipelineRun {
    pr(
        json!({"env": "staging"}),
        json!({}),
        json!({"pipelineRef": {"name": "promote"},
               "params": [{"name": "environment", "value": "jx-staging"}]}),
    )
}

#[test]
fn a_mutex_takes_the_runs_its_selector_matches_on_its_own_key() {
    let m = mutex("staging", json!({"selector": {"pipelines": ["promote"]}}));
    let s = select(&staging_run(), &[&m], &[], |_| true);
    assert_eq!(queued_on(&s), ("staging", Some("Mutex/staging"), false));
    let keyed = mutex(
        "env",
        json!({"selector": {"matchLabels": {"env": "staging"}},
                                   "key": "https://example.org/staging"}),
    );
    let s = select(&staging_run(), &[&keyed], &[], |_| true);
    assert_eq!(queued_on(&s).0, "https://example.org/staging");
    let other = mutex(
        "prod",
        json!({"selector": {"matchLabels": {"env": "prod"}}}),
    );
    // A run no selector takes is left alone (a marked one is told nobody takes it: below).
    let unmarked = pr(json!({"env": "staging"}), json!({}), json!({"status": ""}));
    assert_eq!(
        select(&unmarked, &[&other], &[], |_| true),
        Selection::Unselected
    );
    let no_selector = mutex("plain", json!({}));
    assert_eq!(
        select(&unmarked, &[&no_selector], &[], |_| true),
        Selection::Unselected
    );
}

#[test]
fn key_from_reads_a_param_or_a_label_and_names_what_is_missing() {
    let by_param = mutex(
        "envs",
        json!({"selector": {"pipelines": ["promote"]},
                                        "keyFrom": {"param": "environment"}}),
    );
    let s = select(&staging_run(), &[&by_param], &[], |_| true);
    assert_eq!(queued_on(&s), ("jx-staging", Some("Mutex/envs"), false));
    let by_label = mutex(
        "envs",
        json!({"selector": {"pipelines": ["promote"]},
                                        "keyFrom": {"label": "env"}}),
    );
    assert_eq!(
        queued_on(&select(&staging_run(), &[&by_label], &[], |_| true)).0,
        "staging"
    );
    let missing = mutex(
        "envs",
        json!({"selector": {"pipelines": ["promote"]},
                                       "keyFrom": {"param": "target"}}),
    );
    let Selection::Refused(m) = select(&staging_run(), &[&missing], &[], |_| true) else {
        panic!("a missing param is refused")
    };
    assert!(
        m.contains("Mutex/envs") && m.contains("no param \"target\""),
        "{m}"
    );
    let bad = pr(
        json!({"env": ""}),
        json!({}),
        json!({"pipelineRef": {"name": "promote"}}),
    );
    let Selection::Refused(m) = select(&bad, &[&by_label], &[], |_| true) else {
        panic!("an empty key is refused")
    };
    assert!(m.contains("key is empty"), "{m}");
}

#[test]
fn a_cluster_mutex_takes_only_runs_of_the_namespaces_it_allows() {
    let c = cluster_mutex(
        "prod-db",
        json!({"selector": {"matchLabels": {"env": "staging"}}}),
    );
    let s = select(&staging_run(), &[], &[&c], |_| true);
    assert_eq!(
        queued_on(&s),
        ("prod-db", Some("ClusterMutex/prod-db"), true)
    );
    let elsewhere = pr(json!({"env": "staging"}), json!({}), json!({"status": ""}));
    assert_eq!(
        select(&elsewhere, &[], &[&c], |_| false),
        Selection::Unselected
    );
}

#[test]
fn two_takers_or_annotations_naming_another_lock_are_refused() {
    let a = mutex("a", json!({"selector": {"pipelines": ["promote"]}}));
    let b = mutex(
        "b",
        json!({"selector": {"matchLabels": {"env": "staging"}}}),
    );
    let Selection::Refused(m) = select(&staging_run(), &[&a, &b], &[], |_| true) else {
        panic!("two takers are refused")
    };
    assert!(m.contains("Mutex/a and Mutex/b"), "{m}");
    let escaping = pr(
        json!({"env": "staging"}),
        json!({KEY: "elsewhere"}),
        json!({"pipelineRef": {"name": "promote"}}),
    );
    let Selection::Refused(m) = select(&escaping, &[&a], &[], |_| true) else {
        panic!("a run cannot leave its selector's lock by annotation")
    };
    assert!(m.contains("remove those annotations"), "{m}");
    let c = cluster_mutex("prod-db", json!({"selector": {"pipelines": ["promote"]}}));
    let local = pr(
        json!({}),
        json!({KEY: "prod-db"}),
        json!({"pipelineRef": {"name": "promote"}}),
    );
    assert!(matches!(
        select(&local, &[], &[&c], |_| true),
        Selection::Refused(_)
    ));
    // Once stamped, its annotations agree with its selector: nothing more to write.
    let Selection::Stamp { annotations, .. } = select(&staging_run(), &[&a], &[], |_| true) else {
        panic!("queued")
    };
    let stamped = pr(
        json!({"env": "staging"}),
        serde_json::to_value(&annotations).unwrap(),
        json!({"pipelineRef": {"name": "promote"}}),
    );
    assert!(matches!(
        select(&stamped, &[&a], &[], |_| true),
        Selection::Stamped
    ));
}

#[test]
fn a_selected_run_that_started_unqueued_is_told_so() {
    let m = mutex("staging", json!({"selector": {"pipelines": ["promote"]}}));
    let started = pr(
        json!({}),
        json!({}),
        json!({"pipelineRef": {"name": "promote"}, "status": ""}),
    );
    let Selection::NotQueued(m) = select(&started, &[&m], &[], |_| true) else {
        panic!("a selected run not Pending is NotQueued")
    };
    assert!(
        m.contains("Mutex/staging") && m.contains("queue-at-create.yaml"),
        "{m}"
    );
}

#[test]
fn sequence_from_stamps_the_runs_sequence_or_names_what_is_missing() {
    let run = pr(
        json!({}),
        json!({}),
        json!({"pipelineRef": {"name": "promote"},
               "params": [{"name": "version", "value": " 81 "}]}),
    );
    let m = mutex(
        "staging",
        json!({"selector": {"pipelines": ["promote"]},
                                    "sequenceFrom": {"param": "version"}}),
    );
    let Selection::Stamp { annotations, .. } = select(&run, &[&m], &[], |_| true) else {
        panic!("stamped")
    };
    assert_eq!(annotations[SEQUENCE], "81");
    let by_label = mutex(
        "staging",
        json!({"selector": {"pipelines": ["promote"]},
                                           "sequenceFrom": {"label": "build"}}),
    );
    let Selection::Refused(m) = select(&run, &[&by_label], &[], |_| true) else {
        panic!("a missing label is refused")
    };
    assert!(m.contains("sequenceFrom.label build"), "{m}");
}

#[test]
fn only_a_run_the_policy_made_pending_or_annotated_is_taken() {
    let m = mutex("staging", json!({"selector": {"pipelines": ["promote"]}}));
    let spec = json!({"pipelineRef": {"name": "promote"}, "status": "PipelineRunPending"});
    // Held back by someone else (an approval, another queue): not ours to start.
    let theirs = pr(json!({}), json!({}), spec.clone());
    assert_eq!(select(&theirs, &[&m], &[], |_| true), Selection::Unselected);
    let annotated = pr(json!({}), json!({KEY: "staging"}), spec);
    assert!(matches!(
        select(&annotated, &[&m], &[], |_| true),
        Selection::Stamp { .. }
    ));
    // Started by Tekton: past selection.
    let mut started = pr(
        json!({}),
        json!({}),
        json!({"pipelineRef": {"name": "promote"}, "status": ""}),
    );
    started.status = Some(Default::default());
    assert_eq!(
        select(&started, &[&m], &[], |_| true),
        Selection::Unselected
    );
}

#[test]
fn a_run_made_pending_for_a_selector_that_no_longer_takes_it_is_let_go() {
    let Selection::LetGo { lock, message } = select(&staging_run(), &[], &[], |_| true) else {
        panic!("a run waiting for nothing is let go")
    };
    assert_eq!(lock, "Mutex/staging");
    assert!(message.contains("no selector takes it now"), "{message}");
}

#[test]
fn a_sequence_that_is_no_integer_is_refused_with_a_bounded_message() {
    let long = "9".repeat(300);
    let run = pr(
        json!({"build": long}),
        json!({}),
        json!({"pipelineRef": {"name": "promote"}}),
    );
    let m = mutex(
        "staging",
        json!({"selector": {"pipelines": ["promote"]},
                                    "sequenceFrom": {"label": "build"}}),
    );
    let Selection::Refused(message) = select(&run, &[&m], &[], |_| true) else {
        panic!("refused")
    };
    assert!(
        message.contains("not an integer") && message.len() < 300,
        "{message}"
    );
}
