//! Deletions are never lost to a relist (issue 49): a holder deleted while the controller's
//! watches are broken, with etcd compacted meanwhile so that they cannot resume where they were
//! (410 Gone: the controller must list again), is released within seconds of the watches coming
//! back, not at the next periodic resync. It restarts the cluster's kube-apiserver, so it is a
//! test binary of its own (cargo runs one binary at a time). Two mechanisms release it: the
//! shared cache tells every consumer of the objects a relist lacks (pinned by the hermetic test
//! `a_relist_tells_of_the_objects_deleted_while_the_watch_was_broken`), and the lock controller's
//! own relist reconciles every lock; this test holds the promise end to end, whichever acts.

mod support;

use anyhow::{Result, ensure};
use std::time::Instant;
use support::components::{compact_etcd, restart_component, wait_api};
use support::controller::ControllerProcess;
use support::pipelines::*;
use support::*;

/// Well below the controller's periodic resync (5 minutes), which would release it anyway.
const WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

fn signal(controller: &ControllerProcess, sig: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([sig, &controller.pid().to_string()])
        .status()?;
    ensure!(status.success(), "kill {sig} failed");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn a_holder_deleted_while_the_watches_are_broken_is_released_after_the_relist() -> Result<()>
{
    let ns = TestNamespace::create("relist").await?;
    let controller = ControllerProcess::start(ns.name()).await?;
    let opts = Opts {
        lock_params: &[("key", "env"), ("supersede", "none")],
        ..Default::default()
    };
    ns.apply(&pipeline("deploy", &opts)).await?;
    ns.apply(&pipeline_run("a", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("a"), "Acquired", slow()).await?;
    ns.apply(&pipeline_run("b", "deploy", &[])).await?;
    wait_reason(&ns, &lock_run("b"), "Waiting", slow()).await?;
    // The controller stops hearing anything; the holder goes, its lock run with it.
    signal(&controller, "-STOP")?;
    ns.kubectl(&["delete", "pipelinerun", "a", "--wait=true", "--timeout=60s"])?;
    let lock_run_a = lock_run("a");
    wait_until("a's lock run to be gone", slow(), || async {
        let gone = ns
            .get_opt("tekton.dev/v1beta1", "CustomRun", &lock_run_a)
            .await?
            .is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    // Its watches cannot resume: etcd forgets the history, the API server restarts.
    let revision = compact_etcd()?;
    restart_component("kube-apiserver", std::time::Duration::ZERO).await?;
    wait_api(&ns.client()).await?;
    signal(&controller, "-CONT")?;
    let back = Instant::now();
    wait_reason(&ns, &lock_run("b"), "Acquired", WITHIN).await?;
    // The fault took: the watches could not resume and were listed again.
    let log = controller.log_text();
    ensure!(
        log.contains("too old resource version"),
        "the controller's watches did not expire; the test proves nothing"
    );
    eprintln!(
        "MEASUREMENT relist: b granted {:.1} s after the watches came back (etcd compacted at {revision})",
        back.elapsed().as_secs_f64()
    );
    release(&ns, "b").await?;
    succeeded(&ns, "b").await?;
    Ok(())
}
