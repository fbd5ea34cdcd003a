//! Stopping a pod's processes the way a kubelet does: SIGTERM to the step's process group, up to
//! the grace period for it to end by itself, then SIGKILL.
//!
//! A [`StopHandle`] is kept per running pod; its [`StopSignal`] goes to the task running the
//! pod. A later deletion with a shorter grace period brings the SIGKILL forward, never back
//! (as a kubelet honours a shortened `deletionGracePeriodSeconds`).

use std::process::ExitStatus;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::process::Child;
use tokio::sync::watch;
use tokio::time::Instant;

/// What Kubernetes gives a pod when neither the deletion nor the pod says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// The grace period a kubelet gives a pod being deleted: the deletion's own
/// (`metadata.deletionGracePeriodSeconds`, which the API server sets from the delete options or
/// the pod's spec), else `spec.terminationGracePeriodSeconds`, else 30 s.
pub fn grace_period(pod: &Pod) -> Duration {
    let secs = pod.metadata.deletion_grace_period_seconds.or_else(|| {
        pod.spec
            .as_ref()
            .and_then(|s| s.termination_grace_period_seconds)
    });
    match secs {
        Some(s) => Duration::from_secs(s.max(0) as u64),
        None => DEFAULT_GRACE,
    }
}

/// Asks a pod's processes to stop. Cloneable; dropping it does not stop anything.
#[derive(Debug, Clone)]
pub struct StopHandle(watch::Sender<Option<Instant>>);

/// The receiving side, held by the task running the pod.
#[derive(Debug, Clone)]
pub struct StopSignal(watch::Receiver<Option<Instant>>);

pub fn stop_channel() -> (StopHandle, StopSignal) {
    let (tx, rx) = watch::channel(None);
    (StopHandle(tx), StopSignal(rx))
}

impl StopHandle {
    /// Requests a stop with `grace` before SIGKILL. A second request can only shorten it.
    pub fn request(&self, grace: Duration) {
        let kill_at = Instant::now() + grace;
        self.0.send_if_modified(|current| match current {
            Some(at) if *at <= kill_at => false,
            _ => {
                *current = Some(kill_at);
                true
            }
        });
    }

    pub fn requested(&self) -> bool {
        self.0.borrow().is_some()
    }
}

impl StopSignal {
    /// When SIGKILL is due, once a stop was requested.
    pub fn kill_at(&self) -> Option<Instant> {
        *self.0.borrow()
    }

    pub fn requested(&self) -> bool {
        self.kill_at().is_some()
    }

    /// Resolves once a stop is requested (at once if it already was).
    pub async fn requested_now(&mut self) {
        // An Err means every handle is gone: then no stop can ever come.
        if self.0.wait_for(Option::is_some).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves when the kill deadline may have moved.
    async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// How a step's process ended.
#[derive(Debug)]
pub struct Ended {
    pub status: ExitStatus,
    /// A stop was requested while it ran (whether or not it then needed SIGKILL).
    pub stopped: bool,
}

/// Waits for `child` (leader of process group `pgid`) to exit. Once a stop is requested, sends
/// SIGTERM to the group, then SIGKILL when the grace period runs out.
pub async fn wait_or_stop(
    child: &mut Child,
    pgid: i32,
    signal: &mut StopSignal,
) -> std::io::Result<Ended> {
    tokio::select! {
        status = child.wait() => return Ok(Ended { status: status?, stopped: false }),
        () = signal.requested_now() => {}
    }
    signal_group(pgid, libc::SIGTERM);
    loop {
        let kill_at = signal.kill_at().unwrap_or_else(Instant::now);
        tokio::select! {
            status = child.wait() => return Ok(Ended { status: status?, stopped: true }),
            () = tokio::time::sleep_until(kill_at) => {
                signal_group(pgid, libc::SIGKILL);
                return Ok(Ended { status: child.wait().await?, stopped: true });
            }
            () = signal.changed() => {} // a shorter grace period: recompute the deadline
        }
    }
}

/// Sends `sig` to every process of the group. ESRCH (group already gone) is fine.
pub fn signal_group(pgid: i32, sig: i32) {
    // SAFETY: kill(2) on the step's own process group (created with process_group(0)).
    unsafe { libc::kill(-pgid, sig) };
}

/// Whether any process of the group is still there (zombies included).
pub fn group_exists(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// After the group leader ended: kills what the step left running in its group and waits,
/// bounded, for the group to be gone. Orphaned zombies are reaped by init, not by us, hence
/// the bound.
pub async fn kill_leftovers(pgid: i32) {
    signal_group(pgid, libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(5);
    while group_exists(pgid) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await; // bounded poll for exit, not a sync sleep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(deletion: Option<i64>, spec: Option<i64>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                deletion_grace_period_seconds: deletion,
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::PodSpec {
                termination_grace_period_seconds: spec,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn grace_period_prefers_the_deletion_then_the_spec_then_30s() {
        assert_eq!(
            grace_period(&pod(Some(5), Some(60))),
            Duration::from_secs(5)
        );
        assert_eq!(grace_period(&pod(None, Some(60))), Duration::from_secs(60));
        assert_eq!(grace_period(&pod(None, None)), DEFAULT_GRACE);
        assert_eq!(grace_period(&pod(Some(0), None)), Duration::ZERO);
        assert_eq!(grace_period(&pod(Some(-3), None)), Duration::ZERO);
    }

    #[tokio::test]
    async fn a_second_request_only_shortens_the_grace() {
        let (handle, signal) = stop_channel();
        assert!(!signal.requested());
        handle.request(Duration::from_secs(30));
        let first = signal.kill_at().unwrap();
        handle.request(Duration::from_secs(60));
        assert_eq!(signal.kill_at(), Some(first));
        handle.request(Duration::from_secs(1));
        assert!(signal.kill_at().unwrap() < first);
    }

    /// A step as the pod-runner starts it: its own process group, output to a file.
    struct Step {
        child: Child,
        pgid: i32,
        out: std::path::PathBuf,
        _dir: TempDir,
    }

    struct TempDir(std::path::PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn start(script: &str) -> Step {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "pod-runner-stop-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out.log");
        let file = std::fs::File::create(&out).unwrap();
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let pgid = child.id().unwrap() as i32;
        Step {
            child,
            pgid,
            out,
            _dir: TempDir(dir),
        }
    }

    impl Step {
        fn output(&self) -> String {
            std::fs::read_to_string(&self.out).unwrap_or_default()
        }

        /// Waits (bounded) until the output contains `text`.
        async fn wait_for_output(&self, text: &str) {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !self.output().contains(text) {
                assert!(
                    Instant::now() < deadline,
                    "timed out waiting for {text:?}; output so far:\n{}",
                    self.output()
                );
                tokio::time::sleep(Duration::from_millis(20)).await; // bounded condition poll
            }
        }
    }

    /// Runs `wait_or_stop` on its own task; returns the step's output file and the task.
    fn stop_in_background(
        step: Step,
        signal: StopSignal,
    ) -> (Step, tokio::task::JoinHandle<(Ended, Child)>) {
        let Step {
            mut child,
            pgid,
            out,
            _dir,
        } = step;
        let task = tokio::spawn(async move {
            let mut signal = signal;
            let ended = wait_or_stop(&mut child, pgid, &mut signal).await.unwrap();
            (ended, child)
        });
        let placeholder = tokio::process::Command::new("true").spawn().unwrap();
        (
            Step {
                child: placeholder,
                pgid,
                out,
                _dir,
            },
            task,
        )
    }

    async fn join(task: tokio::task::JoinHandle<(Ended, Child)>) -> Ended {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the step did not end")
            .unwrap()
            .0
    }

    #[tokio::test]
    async fn a_step_that_traps_term_keeps_working_through_its_grace_then_ends_by_itself() {
        let step = start(
            r#"trap 'echo got-term; for i in 1 2 3; do echo working-$i; sleep 1; done; echo ended; exit 0' TERM
               echo ready; while :; do sleep 0.05; done"#,
        );
        step.wait_for_output("ready").await;
        let (handle, signal) = stop_channel();
        let (step, task) = stop_in_background(step, signal);
        handle.request(Duration::from_secs(30));
        step.wait_for_output("working-2").await;
        assert!(
            !task.is_finished(),
            "the step was ended before it finished its TERM handler"
        );
        assert!(
            group_exists(step.pgid),
            "the step's processes are gone while it still works"
        );
        let ended = join(task).await;
        assert!(ended.stopped);
        assert_eq!(
            ended.status.code(),
            Some(0),
            "{:?}; output:\n{}",
            ended.status,
            step.output()
        );
        assert!(step.output().contains("ended"), "{}", step.output());
    }

    #[tokio::test]
    async fn a_step_that_ignores_term_gets_sigkill_when_the_grace_period_ends() {
        use std::os::unix::process::ExitStatusExt;
        let step =
            start(r#"trap 'echo term-ignored' TERM; echo ready; while :; do sleep 0.05; done"#);
        step.wait_for_output("ready").await;
        let (handle, signal) = stop_channel();
        let (step, task) = stop_in_background(step, signal);
        handle.request(Duration::from_secs(1));
        step.wait_for_output("term-ignored").await;
        let ended = join(task).await;
        assert!(ended.stopped);
        assert_eq!(
            ended.status.signal(),
            Some(libc::SIGKILL),
            "{:?}",
            ended.status
        );
    }

    #[tokio::test]
    async fn a_shorter_grace_period_brings_the_sigkill_forward() {
        use std::os::unix::process::ExitStatusExt;
        let step =
            start(r#"trap 'echo term-ignored' TERM; echo ready; while :; do sleep 0.05; done"#);
        step.wait_for_output("ready").await;
        let (handle, signal) = stop_channel();
        let (step, task) = stop_in_background(step, signal);
        handle.request(Duration::from_secs(3600));
        step.wait_for_output("term-ignored").await;
        assert!(!task.is_finished(), "killed before its grace period ended");
        handle.request(Duration::ZERO);
        let ended = join(task).await;
        assert_eq!(
            ended.status.signal(),
            Some(libc::SIGKILL),
            "{:?}",
            ended.status
        );
    }

    #[tokio::test]
    async fn a_step_that_ends_by_itself_is_not_signalled() {
        let mut step = start("echo hi; exit 3");
        let (_handle, mut signal) = stop_channel();
        let ended = wait_or_stop(&mut step.child, step.pgid, &mut signal)
            .await
            .unwrap();
        assert!(!ended.stopped);
        assert_eq!(ended.status.code(), Some(3));
    }

    #[tokio::test]
    async fn what_a_step_leaves_running_in_its_group_is_killed() {
        let mut step = start("sleep 1000 & echo ready");
        let (_handle, mut signal) = stop_channel();
        let ended = wait_or_stop(&mut step.child, step.pgid, &mut signal)
            .await
            .unwrap();
        assert_eq!(ended.status.code(), Some(0));
        assert!(
            group_exists(step.pgid),
            "the background sleep should still be there"
        );
        kill_leftovers(step.pgid).await;
        // Gone, or a zombie waiting for init to reap it: in either case no longer running.
        let running = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read_to_string(e.path().join("stat")).is_ok_and(|stat| {
                let after = stat.rsplit_once(") ").map(|(_, a)| a).unwrap_or("");
                let fields: Vec<&str> = after.split_whitespace().collect();
                fields.get(2) == Some(&step.pgid.to_string().as_str()) && fields[0] != "Z"
            })
        });
        assert!(
            !running,
            "a process of the step's group still runs after kill_leftovers"
        );
    }
}
