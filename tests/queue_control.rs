//! Queue control by people (issue 15) on the local control plane: the real
//! Tekton controller runs real Pipelines, tekton-mutex runs as a process, and
//! every command goes through `tkn-mutex` (describe also through the real
//! `tkn mutex`, found on PATH by tkn's plugin convention). Each command is
//! tried on a Mutex and, with `--cluster`, on a ClusterMutex.

mod support;

use anyhow::{Result, ensure};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::ResourceExt;
use kube::api::{ListParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;
use support::cli::{tkn_mutex, tkn_plugin};
use support::controller::ControllerProcess;
use support::locks::{self, Kind, Lock};
use support::pipelines::*;
use support::*;
use tekton_mutex::model::cluster_mutex::ClusterMutex;
use tekton_mutex::model::mutex::{Mutex, MutexStatus};
use tekton_mutex::model::requests::{Action, Verdict};
use tekton_mutex::model::tekton::pipelinerun::PipelineRun;

const KEY: &str = "staging";

for_both_kinds! {
    describe_lists_the_exact_queue_order => describe_case;
    freeze_holds_back_a_waiter_and_unfreeze_lets_it_through => freeze_case;
    release_force_hands_over_with_a_higher_token => release_case;
    clear_fails_every_waiter_with_cleared => clear_case;
    promote_moves_a_waiter_to_the_front => promote_case;
    forget_drops_a_poisoned_supersede_mark => forget_case;
    oversized_words_are_refused_and_the_key_still_grants => bounded_case;
    an_oversized_clear_with_twelve_waiters_is_refused_and_the_key_hands_over => oversized_clear_case;
    a_reason_at_the_bound_is_told_in_every_event => long_reason_case;
}

/// A test's queue: its namespace, its lock (a Mutex named after the namespace,
/// or a ClusterMutex), and PipelineRuns `prs` created one after the other; the
/// first holds the lock, the rest wait.
struct Queued {
    ns: TestNamespace,
    lock: Lock,
}

async fn queued(kind: Kind, prefix: &str, prs: &[&str]) -> Result<Queued> {
    let ns = TestNamespace::create(prefix).await?;
    let lock = Lock::new(kind, &ns).await?;
    let opts = lock.opts(Opts {
        lock_params: &[("supersede", "none")],
        ..Default::default()
    });
    ns.apply(&pipeline("deploy", &opts)).await?;
    for (i, pr) in prs.iter().enumerate() {
        ns.apply(&pipeline_run(pr, "deploy", &[])).await?;
        // One at a time, so the queue order is the creation order.
        wait_until(&format!("{pr} to be enrolled"), slow(), || async {
            let st = lock.status(&ns).await?;
            Ok((st.holders.len() + st.queue.len() == i + 1).then_some(()))
        })
        .await?;
    }
    wait_reason(&ns, &lock_run(prs[0]), "Acquired", slow()).await?;
    Ok(Queued { ns, lock })
}

impl Queued {
    /// The lock's name: `tkn mutex`'s KEY argument.
    fn key(&self) -> &str {
        self.ns.name()
    }

    /// The waiting PipelineRuns in grant order, by their names in this namespace.
    async fn queue(&self) -> Result<Vec<String>> {
        let st = self.lock.status(&self.ns).await?;
        Ok(st
            .queue
            .iter()
            .filter_map(|w| w.pipeline_run.as_deref())
            .map(|pr| pr.rsplit('/').next().unwrap_or(pr).to_string())
            .collect())
    }

    /// `tkn-mutex ARGS -n NS`, with `--cluster` for a ClusterMutex.
    fn tkn_mutex(&self, args: &[&str]) -> Result<support::cli::Ran> {
        tkn_mutex(&[args, &self.flags()].concat())
    }

    /// A clear with a 200 KB reason, written by hand as annotation
    /// `request.tekton-mutex.dev/<id>` through the API (one command-line argument cannot
    /// carry 200 KB: the shell fails with E2BIG before `tkn mutex` or kubectl runs).
    async fn write_huge_clear(&self, id: &str) -> Result<()> {
        let (ns, key) = (&self.ns, self.key());
        let huge = "y".repeat(200 * 1024);
        let by_hand = json!({"action": "clear", "by": "admin", "reason": huge}).to_string();
        let annotation = format!("request.tekton-mutex.dev/{id}");
        let patch = json!({"metadata": {"annotations": {annotation: by_hand}}});
        let (params, merge) = (
            kube::api::PatchParams::default(),
            kube::api::Patch::Merge(&patch),
        );
        match self.lock.kind {
            Kind::Mutex => drop(ns.api::<Mutex>().patch(key, &params, &merge).await?),
            Kind::ClusterMutex => {
                let api: kube::Api<ClusterMutex> = kube::Api::all(ns.client());
                drop(api.patch(key, &params, &merge).await?)
            }
        }
        Ok(())
    }

    /// The lock's status once it acknowledges request `id`.
    async fn answer(&self, id: &str, within: std::time::Duration) -> Result<MutexStatus> {
        wait_until(
            &format!("the controller to answer {id}"),
            within,
            || async {
                let st = self.lock.status(&self.ns).await?;
                Ok(st
                    .observed_requests
                    .iter()
                    .any(|r| r.id == id)
                    .then_some(st))
            },
        )
        .await
    }

    /// The lock object's request annotations.
    async fn request_annotations(&self) -> Result<Vec<String>> {
        let key = self.key();
        let annotations = match self.lock.kind {
            Kind::Mutex => self.ns.api::<Mutex>().get(key).await?.annotations().clone(),
            Kind::ClusterMutex => {
                let api: kube::Api<ClusterMutex> = kube::Api::all(self.ns.client());
                api.get(key).await?.annotations().clone()
            }
        };
        Ok(annotations
            .into_keys()
            .filter(|k| k.starts_with("request.tekton-mutex.dev/"))
            .collect())
    }

    fn flags(&self) -> Vec<&str> {
        let mut flags = vec!["-n", self.ns.name()];
        if self.lock.kind == Kind::ClusterMutex {
            flags.push("--cluster");
        }
        flags
    }
}

async fn describe_case(kind: Kind) -> Result<()> {
    let q = queued(kind, "qc-describe", &["run-1", "run-2", "run-3", "run-4"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let text = tkn_plugin(&[&["describe", key][..], &q.flags()].concat())?.stdout()?;
    let queue_text = text
        .split("Queue (in grant order)\n")
        .nth(1)
        .unwrap_or_default();
    let listed: Vec<&str> = queue_text
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let expected: Vec<String> = ["run-2", "run-3", "run-4"]
        .iter()
        .map(|pr| q.lock.name_of(pr))
        .collect();
    ensure!(listed == expected, "describe said:\n{text}");
    ensure!(
        text.contains("run-1-lock"),
        "the holder and its lock run:\n{text}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&q.tkn_mutex(&["describe", key, "-o", "json"])?.stdout()?)?;
    let order: Vec<&str> = json["queue"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|w| w["pipelineRun"].as_str())
        .collect();
    ensure!(order == expected, "-o json {order:?} vs the status");
    ensure!(json["holders"][0]["state"] == "Running", "{json}");
    let list = tkn_plugin(&[&["list"][..], &q.flags()].concat())?.stdout()?;
    ensure!(
        list.starts_with("KEY ") && list.contains("run-1 (") && list.contains(" ago)"),
        "list said:\n{list}"
    );
    let by_context = q
        .tkn_mutex(&["list", "--context", "tekton-mutex-local"])?
        .stdout()?;
    ensure!(by_context.contains("run-1 ("), "{by_context}");
    let no_context = q.tkn_mutex(&["list", "--context", "nope"])?;
    ensure!(
        no_context.code == Some(1) && no_context.stderr.contains("kubeconfig"),
        "{no_context:?}"
    );
    let unknown = q.tkn_mutex(&["describe", "nope"])?;
    let kind_name = match kind {
        Kind::Mutex => "Mutex",
        Kind::ClusterMutex => "ClusterMutex",
    };
    ensure!(
        unknown.code == Some(1) && unknown.stderr.contains(&format!("no {kind_name} \"nope\"")),
        "{unknown:?}"
    );
    release(ns, "run-1").await?;
    Ok(())
}

async fn freeze_case(kind: Kind) -> Result<()> {
    let q = queued(kind, "qc-freeze", &["run-1", "run-2"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let out = q
        .tkn_mutex(&["freeze", key, "--reason", "change freeze"])?
        .stdout()?;
    ensure!(out.contains("frozen"), "{out}");
    release(ns, "run-1").await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "run-1", slow())
        .await?;
    let c = wait_reason(ns, &lock_run("run-2"), "Frozen", slow()).await?;
    ensure!(
        c.status == "Unknown"
            && c.message
                .as_deref()
                .is_some_and(|m| m.contains("change freeze")),
        "{c:?}"
    );
    // The holder is gone and the waiter still waits: frozen, not merely slow.
    wait_until("run-1 to be released", slow(), || async {
        Ok(q.lock.status(ns).await?.holders.is_empty().then_some(()))
    })
    .await?;
    ensure!(q.queue().await? == ["run-2"]);
    ensure!(
        condition_of(ns, &lock_run("run-2"))
            .await?
            .and_then(|c| c.reason)
            .as_deref()
            == Some("Frozen")
    );
    q.tkn_mutex(&["unfreeze", key])?.stdout()?;
    wait_reason(ns, &lock_run("run-2"), "Acquired", slow()).await?;
    release(ns, "run-2").await?;
    Ok(())
}

async fn release_case(kind: Kind) -> Result<()> {
    let q = queued(kind, "qc-release", &["run-1", "run-2"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let old: i64 = result_of(ns, &lock_run("run-1"), "token")
        .await?
        .unwrap_or_default()
        .parse()?;
    let unforced = q.tkn_mutex(&["release", key, "--holder", "run-1"])?;
    ensure!(
        unforced.code == Some(1) && unforced.stderr.contains("--force"),
        "{unforced:?}"
    );
    let wrong = q.tkn_mutex(&["release", key, "--holder", "run-2", "--force"])?;
    ensure!(
        wrong.code == Some(1) && wrong.stderr.contains("does not hold"),
        "{wrong:?}"
    );
    let args = ["release", key, "--holder", "run-1", "--force"];
    let out = q
        .tkn_mutex(&[&args[..], &["--reason", "hung in finally"]].concat())?
        .stdout()?;
    ensure!(out.contains("released") && out.contains("run-1"), "{out}");
    wait_reason(ns, &lock_run("run-2"), "Acquired", slow()).await?;
    let new: i64 = result_of(ns, &lock_run("run-2"), "token")
        .await?
        .unwrap_or_default()
        .parse()?;
    ensure!(new > old, "token {new} after {old}");
    // The new holder is told first; the cancel of the old one follows.
    let pr = wait_until("run-1 to be cancelled", slow(), || async {
        let pr = ns.api::<PipelineRun>().get("run-1").await?;
        Ok(pr.spec.status.is_some().then_some(pr))
    })
    .await?;
    let note = pr
        .annotations()
        .get("tekton-mutex.dev/released-by")
        .cloned()
        .unwrap_or_default();
    ensure!(
        note.contains("released by admin") && note.contains("hung in finally"),
        "{note:?}"
    );
    release(ns, "run-2").await?;
    Ok(())
}

async fn clear_case(kind: Kind) -> Result<()> {
    let q = queued(kind, "qc-clear", &["run-1", "run-2", "run-3"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let out = q
        .tkn_mutex(&["clear", key, "--reason", "bad release"])?
        .stdout()?;
    ensure!(out.contains("cleared 2 waiters"), "{out}");
    for pr in ["run-2", "run-3"] {
        let c = wait_reason(ns, &lock_run(pr), "Cleared", slow()).await?;
        ensure!(
            c.status == "False"
                && c.message
                    .as_deref()
                    .is_some_and(|m| m.contains("cleared by admin")),
            "{c:?}"
        );
        let cancelled = |p: PipelineRun| p.spec.status.as_deref() == Some("CancelledRunFinally");
        wait_until(&format!("{pr} to be cancelled"), slow(), || async {
            Ok(cancelled(ns.api::<PipelineRun>().get(pr).await?).then_some(()))
        })
        .await?;
    }
    let st = q.lock.status(ns).await?;
    ensure!(st.queue.is_empty() && st.holders.len() == 1, "{st:?}");
    release(ns, "run-1").await?;
    Ok(())
}

async fn promote_case(kind: Kind) -> Result<()> {
    let q = queued(kind, "qc-promote", &["run-1", "run-2", "run-3", "run-4"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let missing = q.tkn_mutex(&["promote", key, "run-9"])?;
    ensure!(
        missing.code == Some(1) && missing.stderr.contains("not waiting"),
        "{missing:?}"
    );
    q.tkn_mutex(&["promote", key, "run-4"])?.stdout()?;
    ensure!(q.queue().await? == ["run-4", "run-2", "run-3"]);
    release(ns, "run-1").await?;
    wait_reason(ns, &lock_run("run-4"), "Acquired", slow()).await?;
    ensure!(q.queue().await? == ["run-2", "run-3"]);
    for pr in ["run-4", "run-2", "run-3"] {
        release(ns, pr).await?;
    }
    Ok(())
}

/// Issue 23 item 10: a run with a huge `sequence` marks its group so that every
/// later run is refused as stale; `tkn mutex forget` drops the mark.
async fn forget_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("qc-forget").await?;
    let lock = Lock::new(kind, &ns).await?;
    let opts = lock.opts(Opts {
        lock_params: &[("sequence", "$(params.build)")],
        ..Default::default()
    });
    let mut p: serde_json::Value = serde_json::from_str(&pipeline("deploy", &opts))?;
    p["spec"]["params"] = json!([{"name": "build"}]);
    ns.apply(&p.to_string()).await?;
    let poison = (1_i64 << 53).to_string();
    ns.apply(&pipeline_run("typo", "deploy", &[("build", &poison)]))
        .await?;
    wait_reason(&ns, &lock_run("typo"), "Acquired", slow()).await?;
    release(&ns, "typo").await?;
    ns.wait_for_succeeded("tekton.dev/v1", "PipelineRun", "typo", slow())
        .await?;
    ns.apply(&pipeline_run("b41", "deploy", &[("build", "41")]))
        .await?;
    wait_superseded(&ns, &lock_run("b41")).await?;
    let mut flags = vec!["-n", ns.name()];
    if kind == Kind::ClusterMutex {
        flags.push("--cluster");
    }
    let missing = tkn_mutex(&[&["forget", ns.name(), "nope"][..], &flags].concat())?;
    ensure!(
        missing.code == Some(1) && missing.stderr.contains("no supersede mark"),
        "{missing:?}"
    );
    let out = tkn_mutex(&[&["forget", ns.name(), "deploy"][..], &flags].concat())?.stdout()?;
    ensure!(out.contains("forgot the supersede mark"), "{out}");
    ns.apply(&pipeline_run("b42", "deploy", &[("build", "42")]))
        .await?;
    wait_reason(&ns, &lock_run("b42"), "Acquired", slow()).await?;
    let marks = lock.status(&ns).await?.groups;
    ensure!(
        marks.iter().all(|m| m.newest.sequence == Some(42)),
        "the mark is b42's, not the typo's again: {marks:?}"
    );
    release(&ns, "b42").await?;
    Ok(())
}

/// Issue 23 item 8: a 200 KB reason copied into every dismissed entry once wedged a key (its
/// status grew past what the API server takes). Words over 1 KiB are refused: by the CLI before
/// sending, by the controller when written by hand, by the CRD for `spec.frozenReason`.
async fn bounded_case(kind: Kind) -> Result<()> {
    let q = queued(kind, "qc-bounded", &["run-1", "run-2"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let long = "x".repeat(2000);
    let cli = q.tkn_mutex(&["clear", key, "--reason", &long])?;
    ensure!(
        cli.code == Some(1)
            && cli.stderr.contains("not sent")
            && cli.stderr.contains("at most 1024"),
        "{cli:?}"
    );
    let kind_name = if kind == Kind::Mutex {
        "mutex"
    } else {
        "clustermutex"
    };
    q.write_huge_clear("by-hand").await?;
    let st = q.answer("by-hand", slow()).await?;
    let answer = st
        .observed_requests
        .iter()
        .find(|r| r.id == "by-hand")
        .unwrap();
    ensure!(
        answer.message.contains("at most 1024") && answer.message.len() < 300,
        "refused, briefly: {answer:?}"
    );
    ensure!(q.queue().await? == ["run-2"], "nobody was cleared");
    ensure!(
        serde_json::to_string(&st)?.len() < 16 * 1024,
        "the status stays small"
    );
    let freeze = json!({"spec": {"frozen": true, "frozenReason": long}}).to_string();
    let refused = ns.kubectl(&["patch", kind_name, key, "--type=merge", "-p", &freeze]);
    ensure!(
        matches!(&refused, Err(e) if e.to_string().contains("frozenReason")),
        "the CRD refuses a long frozenReason: {refused:?}"
    );
    release(ns, "run-1").await?;
    wait_reason(ns, &lock_run("run-2"), "Acquired", slow()).await?;
    release(ns, "run-2").await?;
    Ok(())
}

/// How long a grant may take before it counts as a stall: a bound, not a performance
/// target. A hand-over takes about a second on the local cluster; the stall reported in
/// issue 37 item 6 was 60 s.
const STALL: std::time::Duration = std::time::Duration::from_secs(20);

/// Issue 37 item 6: "a clear request with a 200 KB reason on a key with 12 waiters: the key
/// grants nothing to a new run for 60 s after its holder ends". The clear is refused at once,
/// as the clear it is and by whom, naming the bound; its annotation goes; nobody is cleared;
/// the holder's end hands the key to the next waiter at once, and a new run joins the queue.
async fn oversized_clear_case(kind: Kind) -> Result<()> {
    let prs: Vec<String> = (1..=13).map(|i| format!("run-{i}")).collect();
    let names: Vec<&str> = prs.iter().map(String::as_str).collect();
    let q = queued(kind, "qc-oversized", &names).await?;
    let ns = &q.ns;
    q.write_huge_clear("huge").await?;
    let st = q.answer("huge", STALL).await?;
    let ack = st
        .observed_requests
        .iter()
        .find(|r| r.id == "huge")
        .unwrap();
    ensure!(
        ack.verdict == Verdict::Refused
            && ack.action == Some(Action::Clear)
            && ack.by == "admin"
            && ack.message.contains("reason")
            && ack.message.contains("at most 1024")
            && ack.message.len() < 300,
        "refused as a clear by admin, briefly, naming the bound: {ack:?}"
    );
    wait_until("the request annotation to go", STALL, || async {
        Ok(q.request_annotations().await?.is_empty().then_some(()))
    })
    .await?;
    let mut waiting = q.queue().await?;
    waiting.sort();
    let mut waiters = names[1..].to_vec();
    waiters.sort();
    ensure!(waiting == waiters, "nobody was cleared: {waiting:?}");
    ensure!(
        serde_json::to_string(&st)?.len() < 16 * 1024,
        "the status stays small"
    );
    let holder_ended = std::time::Instant::now();
    release(ns, "run-1").await?;
    ns.apply(&pipeline_run("new-run", "deploy", &[])).await?;
    wait_reason(ns, &lock_run("run-2"), "Acquired", STALL).await?;
    let granted = holder_ended.elapsed();
    // Anywhere in the queue: runs created in the same second are ordered by name.
    wait_until("the new run to join the queue", STALL, || async {
        Ok(q.queue()
            .await?
            .iter()
            .any(|pr| pr == "new-run")
            .then_some(()))
    })
    .await?;
    eprintln!("next grant {granted:?} after the holder's gate opened");
    let waiting = condition_of(ns, &lock_run("run-3")).await?;
    ensure!(
        waiting
            .as_ref()
            .and_then(|c| c.message.as_deref())
            .is_some_and(|m| m.len() < 1024),
        "nothing of the reason reached a waiter: {waiting:?}"
    );
    release(ns, "run-2").await?;
    Ok(())
}

/// A clear whose reason is at the bound (1,024 bytes) is done, and each Event that quotes
/// the reason is recorded, its note cut to what the API server takes: the API server refused
/// them (a note is at most 1,024 bytes), and the cleared run's Event and its PipelineRun's
/// were lost, said only in the controller's log.
async fn long_reason_case(kind: Kind) -> Result<()> {
    let q = queued(kind, "qc-long-reason", &["run-1", "run-2"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let reason = "r".repeat(1024);
    let out = q
        .tkn_mutex(&["clear", key, "--reason", &reason])?
        .stdout()?;
    ensure!(out.contains("cleared 1 waiter"), "{out}");
    for name in [lock_run("run-2"), "run-2".into()] {
        let note = wait_event(ns, &name, "Cleared")
            .await?
            .note
            .unwrap_or_default();
        ensure!(
            note.len() <= 1024 && note.contains("rrrr") && note.ends_with("..."),
            "{name}: {note}"
        );
    }
    release(ns, "run-1").await?;
    Ok(())
}

/// Waits for an Event with `reason` on object `name`.
async fn wait_event(ns: &TestNamespace, name: &str, reason: &str) -> Result<Event> {
    let api = ns.api::<Event>();
    wait_until(&format!("a {reason} Event on {name}"), slow(), || {
        let api = api.clone();
        async move {
            let events = api.list(&ListParams::default()).await?;
            Ok(events.items.into_iter().find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            }))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_user_without_patch_rights_is_refused_by_the_api_server() -> Result<()> {
    let q = queued(Kind::Mutex, "qc-rbac", &["run-1", "run-2"]).await?;
    let (ns, key) = (&q.ns, q.key());
    let kubeconfig = viewer_kubeconfig(ns).await?;
    let as_viewer = |args: &[&str]| {
        tkn_mutex(
            &[
                args,
                &[
                    "-n",
                    ns.name(),
                    "--kubeconfig",
                    kubeconfig.to_str().unwrap(),
                ],
            ]
            .concat(),
        )
    };
    let seen = as_viewer(&["describe", key])?.stdout()?;
    ensure!(seen.contains("run-2"), "a viewer may look: {seen}");
    for args in [
        &["freeze", key][..],
        &["release", key, "--holder", "run-1", "--force"],
        &["clear", key],
    ] {
        let r = as_viewer(args)?;
        ensure!(
            r.code == Some(1)
                && r.stderr.contains("the API server refused")
                && r.stderr.contains("tekton-mutex-operator"),
            "{args:?}: {r:?}"
        );
    }
    // A ClusterMutex needs the cluster role, and the refusal names it.
    let r = as_viewer(&["freeze", key, "--cluster"])?;
    ensure!(
        r.code == Some(1) && r.stderr.contains("tekton-mutex-cluster-operator"),
        "{r:?}"
    );
    let st = q.lock.status(ns).await?;
    ensure!(
        st.holders.len() == 1 && st.queue.len() == 1 && !st.frozen,
        "nothing changed: {st:?}"
    );
    release(ns, "run-1").await?;
    release(ns, "run-2").await?;
    Ok(())
}

/// A kubeconfig for ServiceAccount `viewer`, which may only read mutexes and runs.
async fn viewer_kubeconfig(ns: &TestNamespace) -> Result<std::path::PathBuf> {
    let pp = PostParams::default();
    ns.api::<ServiceAccount>()
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "viewer"}}))?,
        )
        .await?;
    let role = json!({
        "metadata": {"name": "mutex-viewer"},
        "rules": [
            {"apiGroups": ["tekton-mutex.dev"], "resources": ["mutexes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["tekton.dev"], "resources": ["pipelineruns", "customruns", "runs"], "verbs": ["get", "list"]},
            {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["list"]},
        ],
    });
    ns.api::<Role>()
        .create(&pp, &serde_json::from_value(role)?)
        .await?;
    let binding = json!({
        "metadata": {"name": "mutex-viewer"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mutex-viewer"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": ns.name()}],
    });
    ns.api::<RoleBinding>()
        .create(&pp, &serde_json::from_value(binding)?)
        .await?;
    let request: TokenRequest =
        serde_json::from_value(json!({"spec": {"audiences": [], "expirationSeconds": 3600}}))?;
    let token = ns
        .api::<ServiceAccount>()
        .create_subresource::<TokenRequest, TokenRequest>("token", "viewer", &pp, &request)
        .await?
        .status
        .map(|s| s.token)
        .unwrap_or_default();
    let mut kc = Kubeconfig::read_from(kubeconfig_path())?;
    for user in &mut kc.auth_infos {
        if let Some(auth) = user.auth_info.as_mut() {
            auth.token = Some(token.clone().into());
        }
    }
    let path = repo_root().join(format!("target/test-logs/viewer-{}.kubeconfig", ns.name()));
    std::fs::create_dir_all(path.parent().unwrap())?;
    std::fs::write(&path, serde_saphyr::to_string(&kc)?)?;
    Ok(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn without_a_controller_a_request_times_out_and_says_so() -> Result<()> {
    // No cluster-wide controller of another test may serve this namespace.
    let _alone = locks::shared().await;
    let ns = TestNamespace::create("qc-timeout").await?;
    support::controller::install_crd(&repo_root().join("config/300-crd.yaml")).await?;
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": KEY}, "spec": {}});
    ns.apply(&mutex.to_string()).await?;
    let r = tkn_mutex(&["clear", KEY, "--timeout", "1", "-n", ns.name()])?;
    ensure!(
        r.code == Some(1)
            && r.stderr
                .contains("did not acknowledge the request within 1s")
            && r.stderr.contains("request.tekton-mutex.dev/"),
        "{r:?}"
    );
    // The request stays for the controller to act on when it runs.
    let _c = ControllerProcess::start(ns.name()).await?;
    wait_until("the controller to act on the request", slow(), || async {
        let m = ns
            .api::<tekton_mutex::model::mutex::Mutex>()
            .get(KEY)
            .await?;
        let acked = m
            .status
            .as_ref()
            .is_some_and(|s| s.observed_requests.len() == 1);
        let left = m
            .annotations()
            .keys()
            .any(|k| k.starts_with("request.tekton-mutex.dev/"));
        Ok((acked && !left).then_some(()))
    })
    .await?;
    Ok(())
}

/// The admission policy of config/ installed for one test (it is cluster-wide),
/// and removed when the test ends.
struct AdmissionPolicy(std::path::PathBuf);

impl AdmissionPolicy {
    fn install() -> Result<AdmissionPolicy> {
        let file = repo_root().join("config/400-admission-policy.yaml");
        kubectl(&["apply", "-f", file.to_str().unwrap()])?;
        Ok(AdmissionPolicy(file))
    }
}

impl Drop for AdmissionPolicy {
    fn drop(&mut self) {
        let _ = kubectl(&[
            "delete",
            "--ignore-not-found",
            "-f",
            self.0.to_str().unwrap(),
        ]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_forged_requester_is_refused_by_the_api_server() -> Result<()> {
    let q = queued(Kind::Mutex, "qc-forged", &["run-1", "run-2"]).await?;
    let (ns, key) = (&q.ns, q.key());
    // A Mutex no controller serves, to see the policy take effect on.
    let probe = TestNamespace::create("qc-forged-probe").await?;
    let mutex = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": "probe"}, "spec": {}});
    probe.apply(&mutex.to_string()).await?;
    let _policy = AdmissionPolicy::install()?;
    let annotate = |ns: &TestNamespace, name: &str, id: &str, value: &str| {
        let annotation = format!("request.tekton-mutex.dev/{id}={value}");
        ns.kubectl(&["annotate", "--overwrite", "mutex", name, &annotation])
    };
    let forged = r#"{"action":"clear","by":"security-oncall"}"#;
    wait_until("the admission policy to take effect", slow(), || async {
        match annotate(&probe, "probe", "forged", forged) {
            Err(e) if e.to_string().contains("must be \"admin\"") => Ok(Some(())),
            Err(e) => Err(e),
            Ok(_) => {
                probe.kubectl(&[
                    "annotate",
                    "mutex",
                    "probe",
                    "request.tekton-mutex.dev/forged-",
                ])?;
                Ok(None)
            }
        }
    })
    .await?;
    // On the served Mutex: refused, and nothing changed.
    let refused = annotate(ns, key, "forged", forged);
    ensure!(
        matches!(&refused, Err(e) if e.to_string().contains("must be \"admin\"")),
        "{refused:?}"
    );
    ensure!(q.queue().await? == ["run-2"], "the queue is as it was");
    // Your own name passes, and so does tkn mutex (which writes it).
    annotate(&probe, "probe", "own", r#"{"action":"clear","by":"admin"}"#)?;
    let edited = annotate(
        &probe,
        "probe",
        "own",
        r#"{"action":"clear","by":"admin","force":true}"#,
    );
    ensure!(
        matches!(&edited, Err(e) if e.to_string().contains("cannot be edited")),
        "{edited:?}"
    );
    let out = q.tkn_mutex(&["clear", key])?.stdout()?;
    ensure!(out.contains("cleared 1 waiter"), "{out}");
    let st = q.lock.status(ns).await?;
    ensure!(
        st.observed_requests.iter().all(|r| r.by == "admin"),
        "{:?}",
        st.observed_requests
    );
    release(ns, "run-1").await?;
    Ok(())
}
