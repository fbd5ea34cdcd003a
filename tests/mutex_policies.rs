//! Mutex policies (issue 4) on the local control plane: supersede, stale
//! arrivals, sequence, priority, order, capacity, wait, crash safety.

mod support;

use anyhow::{Result, ensure};
use futures::future::try_join_all;
use kube::ResourceExt;
use serde_json::json;
use support::controller::ControllerProcess;
use support::locks::{self, Kind, Lock};
use support::pipelines::*;
use support::timeline::Timeline;
use support::*;
use tekton_mutex::model::tekton::pipelinerun::PipelineRun;

async fn reason(ns: &TestNamespace, pr: &str) -> Result<Option<String>> {
    Ok(condition_of(ns, &lock_run(pr))
        .await?
        .and_then(|c| c.reason))
}

async fn pipeline_run_reason(ns: &TestNamespace, pr: &str) -> Result<(String, String)> {
    let c = ns
        .wait_for_succeeded("tekton.dev/v1", "PipelineRun", pr, slow())
        .await?;
    Ok((c.status, c.reason))
}

/// The PipelineRun was cancelled (with `mode`) and has finished as Tekton's
/// `Cancelled`, not `Failed`: its superseded lock run ended CustomRunCancelled.
async fn ended_cancelled(ns: &TestNamespace, pr: &str, mode: &str) -> Result<()> {
    let (st, why) = pipeline_run_reason(ns, pr).await?;
    let spec_status = ns.api::<PipelineRun>().get(pr).await?.spec.status;
    ensure!(
        st == "False" && why == "Cancelled" && spec_status.as_deref() == Some(mode),
        "{pr}: {st}/{why}, spec.status {spec_status:?}"
    );
    Ok(())
}

/// Creates PipelineRuns concurrently (all within about a second).
async fn create_at_once(
    ns: &TestNamespace,
    pipeline: &str,
    runs: &[(&str, &[(&str, &str)])],
) -> Result<()> {
    let yamls: Vec<String> = runs
        .iter()
        .map(|(name, params)| pipeline_run(name, pipeline, params))
        .collect();
    try_join_all(yamls.iter().map(|y| ns.apply(y))).await?;
    Ok(())
}

for_both_kinds! {
    supersede_pending_runs_first_then_newest_and_cancels_the_rest => supersede_pending_case;
    supersede_none_runs_all_in_order => supersede_none_case;
    supersede_running_cancels_holder_and_waits_for_its_finally => supersede_running_case;
    capacity_two_never_has_more_than_two_holders => capacity_case;
    wait_false_skips_instead_of_queueing => wait_false_case;
}

/// Of PipelineRuns `prs`: the latest created (seconds, as Kubernetes keeps it), then the greatest name.
async fn newest_of(ns: &TestNamespace, prs: &[String]) -> Result<String> {
    let mut ranked = Vec::new();
    for pr in prs {
        let created = ns.api::<PipelineRun>().get(pr).await?.creation_timestamp();
        ranked.push((created.map(|t| t.0), pr.clone()));
    }
    ranked.sort();
    Ok(ranked.pop().map(|(_, pr)| pr).unwrap_or_default())
}

/// PipelineRuns whose creation order is also their name order, then the newest.
fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

async fn supersede_pending_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("supersede-pending").await?;
    let lock = Lock::new(kind, &ns).await?;
    ns.apply(&pipeline(
        "promote",
        &lock.opts(Opts {
            finally: true,
            ..Default::default()
        }),
    ))
    .await?;
    let prs = names("p", 5);
    for pr in &prs {
        release_finally(&ns, pr).await?; // finally tasks run freely in this test
    }
    ns.apply(&pipeline_run(&prs[0], "promote", &[])).await?;
    wait_reason(&ns, &lock_run(&prs[0]), "Acquired", slow()).await?;
    let rest: Vec<(&str, &[(&str, &str)])> =
        prs[1..].iter().map(|p| (p.as_str(), &[][..])).collect();
    create_at_once(&ns, "promote", &rest).await?;
    // Created at once, they may straddle a second: the newest is the latest
    // creationTimestamp (seconds), then the greatest name, as the controller ranks them.
    let newest = newest_of(&ns, &prs[1..]).await?;
    let older: Vec<&String> = prs[1..].iter().filter(|p| **p != newest).collect();
    for pr in &older {
        let c = wait_superseded(&ns, &lock_run(pr)).await?;
        ensure!(c.status == "False", "{pr}: {c:?}");
        // By a newer one: the newest, or one in between that arrived first.
        let by = format!("Superseded: newer PipelineRun {}", lock.name_of("p"));
        ensure!(
            c.message.as_deref().is_some_and(|m| m.contains(&by)),
            "{c:?}"
        );
        ended_cancelled(&ns, pr, "CancelledRunFinally").await?;
        ensure!(
            ns.kubectl(&["get", "configmap", &format!("finally-ran-{pr}")])
                .is_ok(),
            "{pr}'s finally task ran"
        );
    }
    wait_reason(&ns, &lock_run(&newest), "Waiting", slow()).await?;
    let order = drive_grants(&ns, &["p0", &newest], 2).await?;
    ensure!(
        order == ["p0", newest.as_str()],
        "the first, then the newest: {order:?}"
    );
    ensure!(
        pipeline_run_reason(&ns, &newest).await?.0 == "True",
        "the newest deploys"
    );
    let events = ns.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=Superseded",
        "-o",
        "wide",
    ])?;
    for pr in &older {
        ensure!(
            events.contains(pr.as_str()),
            "an Event records who superseded {pr}:\n{events}"
        );
    }
    Ok(())
}

async fn supersede_none_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("supersede-none").await?;
    let lock = Lock::new(kind, &ns).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    ns.apply(&pipeline(
        "promote",
        &lock.opts(Opts {
            lock_params: &[("supersede", "none")],
            ..Default::default()
        }),
    ))
    .await?;
    ns.apply(&pipeline_run("n0", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("n0"), "Acquired", slow()).await?;
    for pr in ["n1", "n2", "n3", "n4"] {
        ns.apply(&pipeline_run(pr, "promote", &[])).await?;
    }
    let order = drive_grants(&ns, &["n0", "n1", "n2", "n3", "n4"], 5).await?;
    ensure!(order == ["n0", "n1", "n2", "n3", "n4"], "{order:?}");
    for pr in &order {
        ensure!(pipeline_run_reason(&ns, pr).await?.0 == "True", "{pr} ran");
    }
    timeline.check_exclusion(1)?;
    Ok(())
}

async fn supersede_running_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("supersede-running").await?;
    let lock = Lock::new(kind, &ns).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    ns.apply(&pipeline(
        "promote",
        &lock.opts(Opts {
            lock_params: &[("supersede", "running")],
            finally: true,
            ..Default::default()
        }),
    ))
    .await?;
    // Created within the same second, age falls back to the name: v1 < v2.
    ns.apply(&pipeline_run("v1", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("v1"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("v2", "promote", &[])).await?;
    // The holder is asked to stop gracefully; its finally task starts and blocks on its gate.
    wait_until("the holder to be cancelled", slow(), || async {
        let pr = ns.api::<PipelineRun>().get("v1").await?;
        Ok((pr.spec.status.as_deref() == Some("CancelledRunFinally")).then_some(()))
    })
    .await?;
    wait_until("v1's finally task to start", slow(), || async {
        Ok(ns
            .kubectl(&["get", "taskruns", "-o", "name"])?
            .contains("v1-cleanup")
            .then_some(()))
    })
    .await?;
    ensure!(
        reason(&ns, "v2").await?.as_deref() == Some("Waiting"),
        "v2 waits while v1's finally runs"
    );
    ensure!(
        lock.status(&ns).await?.holding == lock.name_of("v1"),
        "v1 keeps the slot during its finally"
    );
    release_finally(&ns, "v1").await?;
    wait_reason(&ns, &lock_run("v2"), "Acquired", slow()).await?;
    let old = ns.api::<PipelineRun>().get("v1").await?;
    ensure!(
        old.is_done(),
        "v1 is done, finally included, when v2 acquires"
    );
    ensure!(
        old.annotations().get("tekton-mutex.dev/superseded-by") == Some(&lock.name_of("v2")),
        "the cancelled holder names who superseded it: {:?}",
        old.annotations()
    );
    // In API-server order: v1's completion strictly precedes v2's grant.
    timeline.check_exclusion(1)?;
    let events = ns.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=Superseded",
        "-o",
        "wide",
    ])?;
    ensure!(
        events.contains(&format!(
            "superseded by newer PipelineRun {}",
            lock.name_of("v2")
        )),
        "{events}"
    );
    release(&ns, "v2").await?;
    release_finally(&ns, "v2").await?;
    ensure!(
        pipeline_run_reason(&ns, "v2").await?.0 == "True",
        "v2 deploys"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn two_pipelines_sharing_a_key_never_supersede_each_other() -> Result<()> {
    let ns = TestNamespace::create("two-pipelines").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let shared = Opts {
        lock_params: &[("key", "shared")],
        ..Default::default()
    };
    ns.apply(&pipeline("app-a", &shared)).await?;
    ns.apply(&pipeline("app-b", &shared)).await?;
    ns.apply(&pipeline_run("a0", "app-a", &[])).await?;
    wait_reason(&ns, &lock_run("a0"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b0", "app-b", &[])).await?;
    ns.apply(&pipeline_run("a1", "app-a", &[])).await?;
    wait_reason(&ns, &lock_run("a1"), "Waiting", slow()).await?;
    ns.apply(&pipeline_run("b1", "app-b", &[])).await?;
    ns.apply(&pipeline_run("a2", "app-a", &[])).await?;
    // a2 supersedes a1 (same pipeline), b1 supersedes b0; nobody crosses pipelines.
    let a1 = wait_superseded(&ns, &lock_run("a1")).await?;
    ensure!(
        a1.message.as_deref().is_some_and(|m| m.contains("a2")),
        "{a1:?}"
    );
    let b0 = wait_superseded(&ns, &lock_run("b0")).await?;
    ensure!(
        b0.message.as_deref().is_some_and(|m| m.contains("b1")),
        "{b0:?}"
    );
    let order = drive_grants(&ns, &["a0", "b1", "a2"], 3).await?;
    ensure!(
        order[0] == "a0"
            && order[1..].contains(&"b1".to_string())
            && order[1..].contains(&"a2".to_string()),
        "{order:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn sequence_decides_order_and_stale_arrivals_are_refused() -> Result<()> {
    let ns = TestNamespace::create("sequence").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let seq = [("sequence", "$(params.build)")];
    let queue = [
        ("sequence", "$(params.build)"),
        ("supersede", "none"),
        ("key", "queue"),
    ];
    let p = |name: &str, params: &[(&str, &str)]| {
        let mut y: serde_json::Value = serde_json::from_str(&pipeline(
            name,
            &Opts {
                lock_params: params,
                ..Default::default()
            },
        ))
        .unwrap();
        y["spec"]["params"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "build"}));
        y.to_string()
    };
    ns.apply(&p("ordered", &queue)).await?;
    ns.apply(&p("deploy", &seq)).await?;

    // A pure queue ordered by sequence: created 9, 7, 8 while 5 holds; granted 5, 7, 8, 9.
    ns.apply(&pipeline_run("q5", "ordered", &[("build", "5")]))
        .await?;
    wait_reason(&ns, &lock_run("q5"), "Acquired", slow()).await?;
    for (name, build) in [("q9", "9"), ("q7", "7"), ("q8", "8")] {
        ns.apply(&pipeline_run(name, "ordered", &[("build", build)]))
            .await?;
    }
    wait_until("three waiters", slow(), || async {
        Ok((mutex_status(&ns, "queue").await?.queue.len() == 3).then_some(()))
    })
    .await?;
    let order = drive_grants(&ns, &["q5", "q7", "q8", "q9"], 4).await?;
    ensure!(
        order == ["q5", "q7", "q8", "q9"],
        "granted by sequence: {order:?}"
    );

    // Stale: build 20 was granted; build 19 arriving later must never deploy.
    ns.apply(&pipeline_run("d20", "deploy", &[("build", "20")]))
        .await?;
    wait_reason(&ns, &lock_run("d20"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("d19", "deploy", &[("build", "19")]))
        .await?;
    let c = wait_superseded(&ns, &lock_run("d19")).await?;
    ensure!(
        c.message.as_deref().is_some_and(|m| m.contains("d20")),
        "{c:?}"
    );
    ended_cancelled(&ns, "d19", "CancelledRunFinally").await?;
    // Even after d20 finished, the group remembers it.
    release(&ns, "d20").await?;
    pipeline_run_reason(&ns, "d20").await?;
    ns.apply(&pipeline_run("d18", "deploy", &[("build", "18")]))
        .await?;
    wait_superseded(&ns, &lock_run("d18")).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn priority_goes_first_and_newest_first_reverses_the_queue() -> Result<()> {
    let ns = TestNamespace::create("priority").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    ns.apply(&json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex", "metadata": {"name": "lifo"},
        "spec": {"order": "newest-first"}}).to_string()).await?;
    let p = |name: &str, params: &[(&str, &str)], mutex: Option<&str>| {
        pipeline(
            name,
            &Opts {
                lock_params: params,
                mutex_name: mutex,
                ..Default::default()
            },
        )
    };
    ns.apply(&p("low", &[("supersede", "none"), ("key", "prio")], None))
        .await?;
    ns.apply(&p(
        "high",
        &[("supersede", "none"), ("key", "prio"), ("priority", "10")],
        None,
    ))
    .await?;
    ns.apply(&p("lifo", &[("supersede", "none")], Some("lifo")))
        .await?;

    ns.apply(&pipeline_run("l0", "low", &[])).await?;
    wait_reason(&ns, &lock_run("l0"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("l1", "low", &[])).await?;
    wait_reason(&ns, &lock_run("l1"), "Waiting", slow()).await?;
    ns.apply(&pipeline_run("h1", "high", &[])).await?;
    wait_reason(&ns, &lock_run("h1"), "Waiting", slow()).await?;
    let order = drive_grants(&ns, &["l0", "l1", "h1"], 3).await?;
    ensure!(
        order == ["l0", "h1", "l1"],
        "higher priority first: {order:?}"
    );

    ns.apply(&pipeline_run("n0", "lifo", &[])).await?;
    wait_reason(&ns, &lock_run("n0"), "Acquired", slow()).await?;
    for pr in ["n1", "n2", "n3"] {
        ns.apply(&pipeline_run(pr, "lifo", &[])).await?;
    }
    wait_until("three waiters", slow(), || async {
        Ok((mutex_status(&ns, "lifo").await?.queue.len() == 3).then_some(()))
    })
    .await?;
    let order = drive_grants(&ns, &["n0", "n1", "n2", "n3"], 4).await?;
    ensure!(order == ["n0", "n3", "n2", "n1"], "newest first: {order:?}");
    Ok(())
}

async fn capacity_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("capacity").await?;
    let lock = Lock::with_spec(kind, &ns, json!({"capacity": 2})).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    ns.apply(&pipeline(
        "work",
        &lock.opts(Opts {
            lock_params: &[("supersede", "none")],
            ..Default::default()
        }),
    ))
    .await?;
    let prs = names("c", 6);
    let runs: Vec<(&str, &[(&str, &str)])> = prs.iter().map(|p| (p.as_str(), &[][..])).collect();
    create_at_once(&ns, "work", &runs).await?;
    wait_until("two holders and four waiters", slow(), || async {
        let s = lock.status(&ns).await?;
        Ok((s.holders.len() == 2 && s.queue.len() == 4).then_some(()))
    })
    .await?;
    let refs: Vec<&str> = prs.iter().map(String::as_str).collect();
    drive_grants(&ns, &refs, 6).await?;
    for pr in &prs {
        ensure!(pipeline_run_reason(&ns, pr).await?.0 == "True", "{pr} ran");
    }
    let grants = timeline.check_exclusion(2)?;
    ensure!(grants.len() == 6, "{grants:?}");
    ensure!(
        timeline.check_exclusion(1).is_err(),
        "with capacity 2, two really did hold at once"
    );
    Ok(())
}

async fn wait_false_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("wait-false").await?;
    let lock = Lock::new(kind, &ns).await?;
    ns.apply(&pipeline(
        "try",
        &lock.opts(Opts {
            lock_params: &[("wait", "false")],
            when_acquired: true,
            ..Default::default()
        }),
    ))
    .await?;
    ns.apply(&pipeline_run("t0", "try", &[])).await?;
    wait_reason(&ns, &lock_run("t0"), "Acquired", slow()).await?;
    ensure!(
        result_of(&ns, &lock_run("t0"), "acquired")
            .await?
            .as_deref()
            == Some("true"),
        "acquired=true"
    );
    ns.apply(&pipeline_run("t1", "try", &[])).await?;
    let c = wait_reason(&ns, &lock_run("t1"), "NotAcquired", slow()).await?;
    ensure!(c.status == "True", "{c:?}");
    ensure!(
        result_of(&ns, &lock_run("t1"), "acquired")
            .await?
            .as_deref()
            == Some("false"),
        "acquired=false"
    );
    let (st, _) = pipeline_run_reason(&ns, "t1").await?;
    ensure!(st == "True", "t1 completes, its deploy skipped");
    let skipped = ns.kubectl(&[
        "get",
        "pipelinerun",
        "t1",
        "-o",
        "jsonpath={.status.skippedTasks[*].name}",
    ])?;
    ensure!(
        skipped.contains("deploy"),
        "deploy was skipped: {skipped:?}"
    );
    ensure!(
        lock.status(&ns).await?.holding == lock.name_of("t0"),
        "t1 holds nothing"
    );
    release(&ns, "t0").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn crash_between_supersede_steps_still_cancels() -> Result<()> {
    let _shared = locks::shared().await;
    let ns = TestNamespace::create("crash-supersede").await?;
    let mut faulty = ControllerProcess::start_with_env(
        ns.name(),
        &[("TEKTON_MUTEX_FAULT", "exit-after-lock-write")],
    )
    .await?;
    ns.apply(&pipeline("promote", &Opts::default())).await?;
    ns.apply(&pipeline_run("a", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "promote", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    ns.apply(&pipeline_run("c", "promote", &[])).await?;
    // c supersedes b: the controller records it in the lock state, then dies
    // before cancelling b's PipelineRun and marking b.
    let exit = faulty.wait_exit(slow()).await?;
    ensure!(
        exit.code() == Some(86),
        "the fault hook fired: {exit:?}\n{}",
        faulty.log_text()
    );
    ensure!(
        mutex_status(&ns, ns.name())
            .await?
            .queue
            .iter()
            .all(|w| w.pipeline_run.as_deref() != Some("b")),
        "b left the queue"
    );
    ensure!(
        reason(&ns, "b").await?.as_deref() == Some("Waiting"),
        "b not marked yet"
    );
    let b = ns.api::<PipelineRun>().get("b").await?;
    ensure!(
        b.spec.status.is_none(),
        "b's PipelineRun was not cancelled yet: {:?}",
        b.spec.status
    );
    let _healthy = ControllerProcess::start(ns.name()).await?;
    ended_cancelled(&ns, "b", "CancelledRunFinally").await?;
    let c = wait_superseded(&ns, &lock_run("b")).await?;
    ensure!(
        c.message
            .as_deref()
            .is_some_and(|m| m.contains("newer PipelineRun c")),
        "{c:?}"
    );
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("c"), "Acquired", slow()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn every_invalid_policy_value_is_refused() -> Result<()> {
    let ns = TestNamespace::create("invalid-policy").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    // Any key of 1 to 1024 bytes is accepted (mapped to an object name); longer is not.
    let too_long = "k".repeat(1025);
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "v-supersede",
            "supersede",
            "always",
            "allowed values are pending, none, running",
        ),
        (
            "v-cancel-mode",
            "cancel-mode",
            "Kill",
            "allowed values are CancelledRunFinally, Cancelled, StoppedRunFinally",
        ),
        (
            "v-sequence",
            "sequence",
            "v81",
            "param \"sequence\" must be an integer",
        ),
        (
            "v-priority",
            "priority",
            "urgent",
            "param \"priority\" must be an integer",
        ),
        ("v-wait", "wait", "later", "allowed values are true, false"),
        (
            "v-group",
            "group",
            "",
            "param \"group\" must be 1 to 253 characters",
        ),
        (
            "v-key",
            "key",
            &too_long,
            "a key may have at most 1024 bytes",
        ),
    ];
    for (pr, param, value, _) in cases {
        ns.apply(&pipeline(
            pr,
            &Opts {
                lock_params: &[(param, value)],
                ..Default::default()
            },
        ))
        .await?;
        ns.apply(&pipeline_run(pr, pr, &[])).await?;
    }
    for (pr, _, _, want) in cases {
        let c = wait_reason(&ns, &lock_run(pr), "InvalidParams", slow()).await?;
        let msg = c.message.unwrap_or_default();
        ensure!(msg.contains(want), "{pr}: {msg:?} should say {want:?}");
        ensure!(
            pipeline_run_reason(&ns, pr).await?.0 == "False",
            "{pr}'s PipelineRun fails"
        );
    }
    Ok(())
}
