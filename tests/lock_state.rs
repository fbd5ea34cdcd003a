//! Lock state that cannot be lost (issue 10), on the local control plane: a
//! Mutex in use survives `kubectl delete` until it is empty, a wiped status is
//! rebuilt from the runs, and the API server refuses a status that lowers
//! `lastToken`. The real Tekton controller runs the PipelineRuns.

mod support;

use anyhow::{Result, ensure};
use kube::api::{DeleteParams, PostParams};
use support::controller::ControllerProcess;
use support::locks::{self, Kind, Lock};
use support::pipelines::*;
use support::timeline::Timeline;
use support::*;
use tekton_mutex::model::mutex::Mutex;
use tekton_mutex::model::tekton::customrun::CustomRun;

const KEY: &str = "k";

async fn holder_a_and_waiter_b(ns: &TestNamespace) -> Result<()> {
    let opts = Opts {
        lock_params: &[("key", KEY), ("supersede", "none")],
        ..Default::default()
    };
    ns.apply(&pipeline("deploy", &opts)).await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy", &[])).await?;
    wait_reason(ns, &lock_run("b"), "Waiting", slow()).await?;
    Ok(())
}

async fn token_of(ns: &TestNamespace, pr: &str) -> Result<i64> {
    token_result(ns, &lock_run(pr)).await
}

async fn mutex_uid(ns: &TestNamespace) -> Result<Option<String>> {
    Ok(ns
        .api::<Mutex>()
        .get_opt(KEY)
        .await?
        .and_then(|m| m.metadata.uid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_deleted_mutex_in_use_releases_nothing_and_goes_once_empty() -> Result<()> {
    let ns = TestNamespace::create("mutex-delete").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    holder_a_and_waiter_b(&ns).await?;
    let first = mutex_uid(&ns).await?;
    ns.kubectl(&["delete", "mutex", KEY, "--wait=false"])?;
    let marked = ns.api::<Mutex>().get(KEY).await?;
    ensure!(
        marked.metadata.deletion_timestamp.is_some(),
        "the Mutex is only marked for deletion"
    );
    // A newcomer waits for the Mutex to go, and says why.
    ns.apply(&pipeline_run("c", "deploy", &[])).await?;
    wait_until("c to wait for the Mutex being deleted", slow(), || async {
        let c = condition_of(&ns, &lock_run("c")).await?;
        Ok(c.filter(|c| {
            c.reason.as_deref() == Some("Waiting")
                && c.message
                    .as_deref()
                    .is_some_and(|m| m.contains("is being deleted"))
        }))
    })
    .await?;
    ensure!(
        condition_of(&ns, &lock_run("b"))
            .await?
            .and_then(|c| c.reason)
            == Some("Waiting".into()),
        "b still waits behind a"
    );
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    ensure!(
        mutex_uid(&ns).await? == first,
        "the Mutex stays while b holds"
    );
    release(&ns, "b").await?;
    wait_reason(&ns, &lock_run("c"), "Acquired", slow()).await?;
    let second = mutex_uid(&ns).await?;
    ensure!(
        second.is_some() && second != first,
        "the old Mutex went once empty, and a new one serves c"
    );
    release(&ns, "c").await?;
    for pr in ["a", "b", "c"] {
        succeeded(&ns, pr).await?;
    }
    let (a, b, c) = (
        token_of(&ns, "a").await?,
        token_of(&ns, "b").await?,
        token_of(&ns, "c").await?,
    );
    ensure!(a < b && b < c, "tokens rise across the delete: {a} {b} {c}");
    timeline.check_exclusion(1)?;
    Ok(())
}

/// Chaos seed 303: once a deleted Mutex went and the runs that showed its tokens were deleted too,
/// the key's new Mutex handed out token 1 again. Tokens continue from the deleted Mutex's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn tokens_continue_after_a_deleted_mutex_and_its_runs_are_gone() -> Result<()> {
    let ns = TestNamespace::create("token-floor").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let opts = Opts {
        lock_params: &[("key", KEY), ("supersede", "none")],
        ..Default::default()
    };
    ns.apply(&pipeline("deploy", &opts)).await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    release(&ns, "a").await?;
    succeeded(&ns, "a").await?;
    let a = token_of(&ns, "a").await?;
    // The Mutex goes, and so does every run that showed a token of it.
    ns.kubectl(&["delete", "mutex", KEY, "--wait=false"])?;
    ns.kubectl(&["delete", "pipelinerun", "a", "--wait=false"])?;
    wait_until("the Mutex and a's lock run to be gone", slow(), || async {
        let mutex = mutex_uid(&ns).await?;
        let run = ns.api::<CustomRun>().get_opt(&lock_run("a")).await?;
        Ok((mutex.is_none() && run.is_none()).then_some(()))
    })
    .await?;
    ns.apply(&pipeline_run("d", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("d"), "Acquired", slow()).await?;
    let d = token_of(&ns, "d").await?;
    ensure!(
        d > a,
        "a token handed out again after the Mutex was deleted: a {a}, d {d}"
    );
    release(&ns, "d").await?;
    succeeded(&ns, "d").await
}

for_both_kinds! {
    a_wiped_status_is_rebuilt_from_the_runs => wiped_status_case;
}

async fn wiped_status_case(kind: Kind) -> Result<()> {
    let ns = TestNamespace::create("status-wipe").await?;
    let lock = Lock::new(kind, &ns).await?;
    let timeline = Timeline::start(ns.client(), ns.name());
    let opts = lock.opts(Opts {
        lock_params: &[("supersede", "none")],
        ..Default::default()
    });
    ns.apply(&pipeline("deploy", &opts)).await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    let object = || -> Result<serde_json::Value> {
        Ok(serde_json::from_str(&ns.kubectl(&[
            "get",
            &lock.kubectl_ref(),
            "-o",
            "json",
        ])?)?)
    };
    // The API server refuses a status that lowers lastToken.
    let mut lowered = object()?;
    let first = lowered["status"]["lastToken"].as_i64().unwrap_or_default();
    ensure!(first >= 1, "{}", lowered["status"]);
    lowered["status"]["lastToken"] = (first - 1).into();
    lowered["status"]["holders"] = serde_json::json!([]);
    let refused = ns.replace_status(&lowered);
    ensure!(
        matches!(&refused, Err(e) if e.to_string().contains("lastToken never goes down")),
        "a status lowering lastToken was accepted: {refused:?}"
    );

    // Wipe it: the object put back without a status.
    ns.wipe_status(&lock.kubectl_ref())?;

    // Rebuilt: a holds again with its token, b still waits, and nothing was granted.
    let rebuilt = wait_until("the status to be rebuilt", slow(), || async {
        let st = lock.status(&ns).await?;
        let holds_a = st
            .holders
            .iter()
            .any(|h| h.pipeline_run.as_deref() == Some(lock.name_of("a").as_str()));
        Ok((holds_a && st.queue.len() == 1).then_some(st))
    })
    .await?;
    // a keeps its token; lastToken stands at the ledger's floor, the end of the block of tokens
    // the first grant reserved, so that no token of that block is handed out again.
    ensure!(
        rebuilt.last_token == first + tekton_mutex::model::mutex::TOKEN_BLOCK - 1
            && rebuilt.holders[0].token == first,
        "{rebuilt:?}"
    );
    ensure!(
        condition_of(&ns, &lock_run("b"))
            .await?
            .and_then(|c| c.reason)
            == Some("Waiting".into()),
        "b still waits behind a"
    );
    release(&ns, "a").await?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    release(&ns, "b").await?;
    for pr in ["a", "b"] {
        succeeded(&ns, pr).await?;
    }
    let (a, b) = (token_of(&ns, "a").await?, token_of(&ns, "b").await?);
    ensure!(a < b, "b's token {b} above a's {a}");
    timeline.check_exclusion(1)?;
    Ok(())
}

/// Chaos seed 85783656: a run's token was shown by its lock run alone once it let go; that
/// lock run went with its PipelineRun (as Tekton's pruning deletes old runs) while others
/// waited, so the key never went idle and the ledger had nothing for it; then the status was
/// wiped, and the next grant handed the same token out again. Every token is now in the ledger
/// before the lock status that hands it out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_wiped_status_never_reuses_the_token_of_a_pruned_run() -> Result<()> {
    let ns = TestNamespace::create("wipe-pruned").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    holder_a_and_waiter_b(&ns).await?;
    let a = token_of(&ns, "a").await?;
    let frozen = |on: bool| {
        let patch = serde_json::json!({"spec": {"frozen": on}}).to_string();
        ns.kubectl(&["patch", "mutex", KEY, "--type=merge", "-p", &patch])
    };
    // Frozen, b keeps waiting once a lets go: the key is never idle.
    frozen(true)?;
    release(&ns, "a").await?;
    succeeded(&ns, "a").await?;
    ns.kubectl(&["delete", "pipelinerun", "a", "--wait=false"])?;
    wait_until("a's hold and its lock run to be gone", slow(), || async {
        let status = ns.api::<Mutex>().get(KEY).await?.status.unwrap_or_default();
        let run = ns.api::<CustomRun>().get_opt(&lock_run("a")).await?;
        Ok((status.holders.is_empty() && run.is_none()).then_some(()))
    })
    .await?;
    ns.wipe_status(&format!("mutex/{KEY}"))?;
    frozen(false)?;
    wait_reason(&ns, &lock_run("b"), "Acquired", slow()).await?;
    let b = token_of(&ns, "b").await?;
    ensure!(b > a, "b was granted token {b}, not above a's {a}");
    release(&ns, "b").await?;
    succeeded(&ns, "b").await
}

/// Standalone lock run `name` of key `KEY`.
fn standalone(name: &str) -> Result<CustomRun> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "tekton.dev/v1beta1", "kind": "CustomRun",
        "metadata": {"name": name},
        "spec": {"customRef": {"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex"},
                 "params": [{"name": "key", "value": KEY}]},
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn two_thousand_runs_through_one_key_leave_a_small_status() -> Result<()> {
    const RUNS: usize = 2000;
    // Capacity 10 lets them pass quickly; what the status keeps does not depend on it.
    const IN_FLIGHT: usize = 20;
    let ns = TestNamespace::create("many-runs").await?;
    let _shared = locks::shared().await;
    let _c = ControllerProcess::start(ns.name()).await?;
    let mutex = serde_json::json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
        "metadata": {"name": KEY}, "spec": {"capacity": 10}});
    ns.apply(&mutex.to_string()).await?;
    let runs = ns.api::<CustomRun>();
    let (mut created, mut finished, mut largest) = (0, 0, 0);
    while finished < RUNS {
        while created < RUNS && created - finished < IN_FLIGHT {
            runs.create(
                &PostParams::default(),
                &standalone(&format!("run-{created}"))?,
            )
            .await?;
            created += 1;
        }
        // A standalone run holds until it is deleted: delete each holder.
        let acquired = wait_until("the next grants", slow(), || async {
            let list = runs.list(&Default::default()).await?;
            let names: Vec<String> = list
                .items
                .iter()
                .filter(|cr| {
                    cr.metadata.deletion_timestamp.is_none()
                        && cr
                            .status
                            .as_ref()
                            .and_then(|s| s.succeeded())
                            .and_then(|c| c.reason.as_deref())
                            == Some("Acquired")
                })
                .filter_map(|cr| cr.metadata.name.clone())
                .collect();
            Ok((!names.is_empty()).then_some(names))
        })
        .await?;
        for name in &acquired {
            runs.delete(name, &DeleteParams::default()).await?;
        }
        finished += acquired.len();
        let size = serde_json::to_vec(&mutex_status(&ns, KEY).await?)?.len();
        largest = largest.max(size);
    }
    let st = wait_until("the last holder to be released", slow(), || async {
        let st = mutex_status(&ns, KEY).await?;
        Ok(st.holders.is_empty().then_some(st))
    })
    .await?;
    let size = serde_json::to_vec(&st)?.len();
    eprintln!("status after {RUNS} runs: {size} bytes (largest seen: {largest} bytes)");
    ensure!(st.last_token >= RUNS as i64, "{st:?}");
    ensure!(st.groups.is_empty(), "standalone runs leave no marks");
    ensure!(size < 16 * 1024, "the status grew to {size} bytes");
    ensure!(largest < 16 * 1024, "the status reached {largest} bytes");
    Ok(())
}
