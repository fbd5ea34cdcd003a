//! Issue 38: the release as users install, upgrade and uninstall it, on the real kubelet
//! (`TEKTON_MUTEX_KUBELET=real hack/cluster.sh up`; docs/kubelets.md, "The install and upgrade
//! tests"). No controller runs on the host: the two replicas of release.yaml run as pods on
//! containerd, from the image hack/release.sh pushed to the cluster's loopback registry.
//!
//! - `real_kubelet::the_release_installs_fails_over_and_uninstalls`: `kubectl apply` of
//!   release.yaml, both replicas ready, the founding scenario (hack/demo.sh) against them, the
//!   leader failed three times while a key is held and waited for (its pod deleted, its pod
//!   force-deleted, its process killed): the waiter is granted, with no double grant; then the
//!   README's uninstall, and nothing stays stuck.
//! - `real_kubelet::an_upgrade_keeps_every_lock`: the release of an earlier commit
//!   (`TEKTON_MUTEX_UPGRADE_FROM`, default 487de83) installed, keys held and waited for, the new
//!   release.yaml applied over it: every held key stays held, the waiters are granted in order
//!   with tokens above the last, nothing twice, and a ClusterMutex deleted before the upgrade
//!   continues its tokens from the ledger the old release kept.
//!
//! The test bed's one deviation from release.yaml is [`testbed_patch`]: there is no pod network
//! here (docs/kubelets.md), so the pods run with `hostNetwork: true` and reach the API server on
//! 127.0.0.1; two replicas then share one network namespace, so each serves its probes on a port
//! of its own (`--http-addr 127.0.0.1:0`) and the kubelet's probes, which cannot tell them apart,
//! are replaced by this test reading each replica's port from its log and asking its /readyz.
//! release.yaml itself is applied unchanged, through a kustomize overlay that adds the patch.
//!
//! hack/test.sh runs these in its real-kubelet lane only: the pod-runner lane skips
//! `real_kubelet::`, and they fail at once, saying so, on a cluster of the other lane.

mod support;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::timeline::{Change, Entry, Grant, Timeline};

/// The install's namespace and Deployment, as release.yaml names them.
const NS: &str = "tekton-mutex";
const DEPLOYMENT: &str = "tekton-mutex";
const LEASE: &str = "tekton-mutex";
const POD_SELECTOR: &str = "app.kubernetes.io/name=tekton-mutex";
/// The version the release under test is built as: the one tests/release.rs builds, so that in
/// hack/test.sh, which runs that test first, cargo finds the binary built (a new version string
/// compiles the crate again: minutes).
const NEW_VERSION: &str = "0.0.0-releasetest";
/// The commit the upgrade starts from: the last one landed before issue 38.
const DEFAULT_UPGRADE_FROM: &str = "487de83";

/// Checks on what the independent watch saw: for each key (the PipelineRuns `key_of` maps to
/// it), never more than `capacity` PipelineRuns holding at once (a PipelineRun holds from its
/// lock run turning Acquired until it is done), each lock run Acquired with one token only
/// (a second token would be a second grant), and tokens strictly increasing in grant order.
/// Returns each key's grants in order.
fn check_grants(
    timeline: &Timeline,
    capacity: usize,
    key_of: impl Fn(&str) -> Option<String>,
) -> Result<BTreeMap<String, Vec<Grant>>> {
    let mut tokens_of: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    let mut keys: Vec<String> = Vec::new();
    for e in timeline.entries() {
        if let Change::Run {
            pipeline_run,
            reason: Some(r),
            token: Some(t),
            ..
        } = &e.change
            && r == "Acquired"
        {
            let seen = tokens_of.entry(pipeline_run.clone()).or_default();
            if !seen.contains(t) {
                seen.push(*t);
            }
            if let Some(k) = key_of(pipeline_run)
                && !keys.contains(&k)
            {
                keys.push(k);
            }
        }
    }
    for (pr, tokens) in &tokens_of {
        ensure!(
            tokens.len() == 1,
            "{pr} was granted more than once: tokens {tokens:?}"
        );
    }
    let mut out = BTreeMap::new();
    for key in keys {
        let grants = timeline
            .check_exclusion_among(capacity, |pr| key_of(pr).as_deref() == Some(key.as_str()))
            .with_context(|| format!("key {key}"))?;
        for w in grants.windows(2) {
            ensure!(
                w[1].token > w[0].token,
                "key {key}: {} was granted token {} after {} had {}",
                w[1].pipeline_run,
                w[1].token,
                w[0].pipeline_run,
                w[0].token
            );
        }
        out.insert(key, grants);
    }
    Ok(out)
}

/// The checks above catch what they are there for (no cluster needed).
#[test]
fn the_grant_checks_catch_a_double_grant() {
    fn acquired(rv: u64, pr: &str, token: i64) -> Entry {
        Entry {
            rv,
            at: Instant::now(),
            change: Change::Run {
                name: format!("{pr}-lock"),
                pipeline_run: pr.into(),
                reason: Some("Acquired".into()),
                token: Some(token),
            },
        }
    }
    fn done(rv: u64, pr: &str) -> Entry {
        Entry {
            rv,
            at: Instant::now(),
            change: Change::Parent {
                name: pr.into(),
                done: true,
                deleted: false,
            },
        }
    }
    let key = |_: &str| Some("k".to_string());
    let check = |entries: Vec<Entry>| check_grants(&Timeline::from_entries(entries), 1, key);
    // One at a time, tokens rising: fine.
    let ok = check(vec![acquired(1, "a", 1), done(2, "a"), acquired(3, "b", 2)]).unwrap();
    assert_eq!(ok["k"].len(), 2);
    // b granted while a still holds.
    let e = check(vec![acquired(1, "a", 1), acquired(2, "b", 2)]).unwrap_err();
    assert!(format!("{e:#}").contains("held the slot at once"), "{e:#}");
    // b granted a token that is not above a's.
    let e = check(vec![acquired(1, "a", 5), done(2, "a"), acquired(3, "b", 5)]).unwrap_err();
    assert!(
        format!("{e:#}").contains("was granted token 5 after"),
        "{e:#}"
    );
    // a granted twice (a new controller granting it again after a failover or an upgrade).
    let e = check(vec![acquired(1, "a", 1), acquired(2, "a", 2)]).unwrap_err();
    assert!(format!("{e:#}").contains("granted more than once"), "{e:#}");
}

mod real_kubelet {
    use super::support::pipelines::{
        Opts, drive_grants, lock_run, pipeline, pipeline_run, release, result_of, slow, succeeded,
        wait_reason,
    };
    use super::support::*;
    use super::*;

    // ------------------------------------------------------------------ the test bed

    fn cluster_dir() -> PathBuf {
        std::env::var_os("TEKTON_MUTEX_CLUSTER_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo_root().join(".cluster"))
    }

    fn cluster_file(name: &str) -> Result<String> {
        let path = cluster_dir().join(name);
        Ok(std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (is the cluster up?)", path.display()))?
            .trim()
            .to_string())
    }

    /// These tests need pods that really run: the real-kubelet lane.
    fn require_real_kubelet() -> Result<()> {
        let lane = cluster_file("lane").unwrap_or_default();
        ensure!(
            lane == "real",
            "the cluster up is of lane {lane:?}: these tests run the release as pods, and need \
             TEKTON_MUTEX_KUBELET=real hack/cluster.sh up (docs/kubelets.md)"
        );
        Ok(())
    }

    /// What the test bed changes in release.yaml's Deployment, and only that (docs/kubelets.md,
    /// "The install and upgrade tests"): no pod network here, so host network and the API
    /// server's loopback address (no kube-proxy); then both replicas share the node's ports, so
    /// each serves /healthz, /readyz and /metrics on a free loopback port instead of 8080, and
    /// the declared port (the scheduler would refuse the second replica for host port 8080) and
    /// the kubelet's probes (which cannot reach a port that differs per pod) go; the test asks
    /// each replica's /readyz itself ([`wait_replicas`]). A strategic-merge patch, applied
    /// with release.yaml through a kustomize overlay ([`apply_release`]).
    pub(super) fn testbed_patch(apiserver_port: &str) -> Value {
        json!({"spec": {"template": {"spec": {
            "hostNetwork": true,
            "containers": [{
                "name": "controller",
                "args": ["run", "--http-addr", "127.0.0.1:0", "--leader-elect"],
                "ports": null,
                "livenessProbe": null,
                "readinessProbe": null,
                "env": [
                    {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                    {"name": "KUBERNETES_SERVICE_PORT", "value": apiserver_port},
                ],
            }],
        }}}})
    }

    // ------------------------------------------------------------------ releases

    struct Release {
        version: String,
        yaml: PathBuf,
        image: String,
    }

    /// `<source>/hack/release.sh VERSION 127.0.0.1:<registry port>`, written to `dist`:
    /// containerd pulls from the cluster's loopback registry under that very name
    /// (docs/kubelets.md). An earlier commit's script writes to its own target/dist/VERSION.
    fn build_release(source: &Path, version: &str, dist: &Path) -> Result<Release> {
        let registry = format!("127.0.0.1:{}", cluster_file("registry.port")?);
        let t0 = Instant::now();
        let status = without_cargo_test_env(&mut Command::new(source.join("hack/release.sh")))
            .args([version, &registry])
            .env("TEKTON_MUTEX_DIST_DIR", dist)
            .current_dir(source)
            .status()
            .context("running hack/release.sh")?;
        ensure!(
            status.success(),
            "{}/hack/release.sh {version} {registry} failed: {status}",
            source.display()
        );
        eprintln!(
            "MEASUREMENT release {version} from {}: built and pushed in {:.0} s",
            source.display(),
            t0.elapsed().as_secs_f64()
        );
        let image = std::fs::read_to_string(dist.join("image.txt"))?
            .trim()
            .to_string();
        ensure!(
            image.starts_with(&format!("{registry}/tekton-mutex:{version}@sha256:")),
            "hack/release.sh pinned {image}"
        );
        Ok(Release {
            version: version.into(),
            yaml: dist.join("release.yaml"),
            image,
        })
    }

    /// The release of this checkout (built once per test binary).
    async fn new_release() -> Result<&'static Release> {
        static NEW: tokio::sync::OnceCell<Release> = tokio::sync::OnceCell::const_new();
        // Its own output directory: tests/release.rs may build the same version at the same
        // time (hack/test.sh runs the lanes side by side), and each run starts by emptying it.
        let dist = repo_root().join("target/dist-install").join(NEW_VERSION);
        NEW.get_or_try_init(|| async { build_release(&repo_root(), NEW_VERSION, &dist) })
            .await
    }

    /// The release of an earlier commit, built from a `git clone --shared` of it (a clone
    /// borrowing this repository's objects; the repository itself is not changed) whose
    /// `target` is this checkout's: only the crate itself compiles again.
    fn old_release(commit: &str) -> Result<Release> {
        let repo = repo_root();
        let git = |dir: &Path, args: &[&str]| -> Result<String> {
            let out = Command::new("git").arg("-C").arg(dir).args(args).output()?;
            ensure!(
                out.status.success(),
                "git {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Ok(String::from_utf8(out.stdout)?.trim().to_string())
        };
        let full = git(
            &repo,
            &["rev-parse", "--verify", &format!("{commit}^{{commit}}")],
        )?;
        // Kept for the next run: a fresh checkout's new mtimes would compile the crate again.
        let tree = std::env::temp_dir().join(format!("tekton-mutex-upgrade-from-{}", &full[..12]));
        let reusable = git(&tree, &["rev-parse", "HEAD"]).is_ok_and(|h| h == full)
            && git(&tree, &["status", "--porcelain", "--untracked-files=no"])
                .is_ok_and(|s| s.is_empty());
        if !reusable {
            let _ = std::fs::remove_file(tree.join("target")); // the link, not our target
            let _ = std::fs::remove_dir_all(&tree);
            let tree_s = tree.to_str().context("temp dir path")?;
            let repo_s = repo.to_str().context("repo path")?;
            git(
                &repo,
                &[
                    "clone",
                    "--quiet",
                    "--shared",
                    "--no-checkout",
                    repo_s,
                    tree_s,
                ],
            )?;
            git(&tree, &["checkout", "--quiet", "--detach", &full])?;
        }
        let _ = std::fs::remove_file(tree.join("target"));
        std::os::unix::fs::symlink(repo.join("target"), tree.join("target"))?;
        let version = format!("0.0.0-from.{}", &full[..7]);
        let dist = tree.join("target/dist").join(&version);
        let mut r = build_release(&tree, &version, &dist)?;
        // release.yaml in our target (the link), where the test reads it.
        r.yaml = repo.join("target/dist").join(&version).join("release.yaml");
        ensure!(r.yaml.is_file(), "no {}", r.yaml.display());
        Ok(r)
    }

    // ------------------------------------------------------------------ install, replicas

    fn kubectl_json(args: &[&str]) -> Result<Value> {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        Ok(serde_json::from_str(&kubectl(&all)?)?)
    }

    /// README "Install" and "Upgrade": `kubectl apply` of release.yaml, unchanged, through a
    /// kustomize overlay that adds the test bed's patch (`kubectl apply -k`), the way a user
    /// keeps a customisation across upgrades. (A `kubectl patch` of the live Deployment does
    /// not survive: `kubectl apply` of the next release.yaml resets every field release.yaml
    /// sets, here the args, the port and the probes; docs/kubelets.md.)
    fn apply_release(r: &Release) -> Result<()> {
        let overlay = repo_root().join("target/install-overlay").join(&r.version);
        let _ = std::fs::remove_dir_all(&overlay);
        std::fs::create_dir_all(&overlay)?;
        std::fs::copy(&r.yaml, overlay.join("release.yaml"))?;
        let mut patch = testbed_patch(&cluster_file("apiserver.port")?);
        patch["apiVersion"] = json!("apps/v1");
        patch["kind"] = json!("Deployment");
        patch["metadata"] = json!({"name": DEPLOYMENT, "namespace": NS});
        std::fs::write(
            overlay.join("testbed-patch.json"),
            serde_json::to_string_pretty(&patch)?,
        )?;
        let kustomization = "# The release as users get it, plus what the test bed lacks (docs/kubelets.md).\n\
                             resources: [release.yaml]\n\
                             patches: [{path: testbed-patch.json}]\n";
        std::fs::write(overlay.join("kustomization.yaml"), kustomization)?;
        eprintln!(
            "applying {} ({}): kubectl apply -k {}\n{kustomization}testbed-patch.json: {}",
            r.version,
            r.image,
            overlay.display(),
            patch
        );
        kubectl(&["apply", "-k", overlay.to_str().context("overlay path")?])?;
        // Only the patch differs from release.yaml.
        let rendered = kubectl(&["kustomize", overlay.to_str().unwrap()])?;
        let deployment = rendered
            .split("\n---\n")
            .find(|d| d.contains("kind: Deployment"))
            .context("no Deployment in the overlay")?;
        ensure!(
            deployment.contains(&r.image) && deployment.contains("hostNetwork: true"),
            "the overlay's Deployment: {deployment}"
        );
        Ok(())
    }

    /// A replica as the test knows it: its pod, and the port it serves its probes on.
    #[derive(Clone, Debug)]
    struct Replica {
        pod: String,
        addr: String,
    }

    /// Releases before the log check wrote colour codes to every log (the upgrade's old one).
    fn strip_ansi(s: &str) -> String {
        let mut out = String::with_capacity(s.len());
        let mut chars = s.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                for d in chars.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    }

    /// The address a replica logged for /healthz, /readyz and /metrics.
    fn served_addr(pod: &str) -> Result<Option<String>> {
        let log = strip_ansi(&kubectl(&["-n", NS, "logs", pod, "-c", "controller"])?);
        Ok(log
            .lines()
            .find(|l| l.contains("serving /healthz, /readyz and /metrics"))
            .and_then(|l| l.split("addr=").nth(1))
            .and_then(|a| a.split_whitespace().next())
            .map(String::from))
    }

    /// `GET path` on a replica's probe port: the status code.
    fn http_status(addr: &str, path: &str) -> Result<u16> {
        let sock: std::net::SocketAddr = addr.parse()?;
        ensure!(sock.ip().is_loopback(), "{addr} is not loopback");
        let mut s = std::net::TcpStream::connect_timeout(&sock, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut head = String::new();
        s.take(64 * 1024).read_to_string(&mut head)?;
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("not an HTTP answer from {addr}: {head:?}"))?;
        Ok(code)
    }

    /// Waits until the Deployment has rolled out `image` and exactly `n` pods of it run (none
    /// of another image left), each has logged its probe port, and each answers /readyz 200.
    async fn wait_replicas(image: &str, n: usize) -> Result<Vec<Replica>> {
        let t0 = Instant::now();
        kubectl(&[
            "-n",
            NS,
            "rollout",
            "status",
            &format!("deployment/{DEPLOYMENT}"),
            "--timeout=240s",
        ])?;
        let pods = wait_until(
            &format!("{n} running pods of {image}, and no other"),
            secs(240),
            || async {
                let list = kubectl_json(&["-n", NS, "get", "pods", "-l", POD_SELECTOR])?;
                let mut ours = Vec::new();
                for p in list["items"].as_array().into_iter().flatten() {
                    if !p["metadata"]["deletionTimestamp"].is_null() {
                        return Ok(None); // an old one still terminating
                    }
                    let ready = p["status"]["containerStatuses"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["name"] == "controller" && c["ready"] == true);
                    if p["spec"]["containers"][0]["image"] != image
                        || p["status"]["phase"] != "Running"
                        || !ready
                    {
                        return Ok(None);
                    }
                    ensure!(
                        p["spec"]["hostNetwork"] == true,
                        "pod {} runs without the test bed's patch: {}",
                        p["metadata"]["name"],
                        p["spec"]
                    );
                    ours.push(
                        p["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    );
                }
                Ok((ours.len() == n).then_some(ours))
            },
        )
        .await?;
        let mut replicas = Vec::new();
        for pod in pods {
            let addr = wait_until(
                &format!("{pod} to log its probe port"),
                secs(60),
                || async { served_addr(&pod) },
            )
            .await?;
            wait_until(&format!("{pod}'s /readyz ({addr})"), secs(120), || async {
                Ok(matches!(http_status(&addr, "/readyz"), Ok(200)).then_some(()))
            })
            .await?;
            ensure!(
                http_status(&addr, "/healthz")? == 200,
                "{pod}'s /healthz is not 200"
            );
            replicas.push(Replica { pod, addr });
        }
        eprintln!(
            "replicas of {image} ready in {:.0} s: {replicas:?}",
            t0.elapsed().as_secs_f64()
        );
        Ok(replicas)
    }

    fn lease_holder() -> Result<String> {
        kubectl(&[
            "-n",
            NS,
            "get",
            "lease",
            LEASE,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ])
        .map(|s| s.trim().to_string())
    }

    /// Waits until one of `replicas` holds the Lease; returns it.
    async fn leader_among(replicas: &[Replica]) -> Result<String> {
        wait_until("a replica to hold the Lease", secs(60), || async {
            let holder = lease_holder().unwrap_or_default();
            Ok(replicas.iter().any(|r| r.pod == holder).then_some(holder))
        })
        .await
    }

    /// An install left by an earlier, failed run goes first (its CRDs stay: they may hold
    /// other tests' locks).
    async fn no_install_left() -> Result<()> {
        if kubectl(&["get", "namespace", NS]).is_ok() {
            eprintln!("an install of an earlier run is still there: deleting namespace {NS}");
            kubectl(&["delete", "namespace", NS, "--wait=true", "--timeout=180s"])?;
        }
        Ok(())
    }

    // ------------------------------------------------------------------ uninstall

    /// README "Uninstall", in its order, each step bounded; then nothing may be left stuck: no
    /// lock object (the CRDs are gone), no PipelineRun with a finalizer of ours, the install's
    /// namespace gone, and `namespaces` (the tests') deleted within a bound.
    async fn uninstall(r: &Release, namespaces: &[&str]) -> Result<()> {
        let t0 = Instant::now();
        // 1. The selectors' admission policy: not installed by this test.
        // 2. The lock CRDs, with the controller still running (the tests' runs have ended).
        kubectl(&[
            "delete",
            "crd",
            "clustermutexes.tekton-mutex.dev",
            "mutexes.tekton-mutex.dev",
            "--wait",
            "--timeout=120s",
        ])
        .context("README uninstall step 2: kubectl delete crd ... --wait")?;
        // 3. The controller and the rest.
        kubectl(&[
            "delete",
            "--ignore-not-found",
            "-f",
            r.yaml.to_str().unwrap(),
            "--wait",
            "--timeout=180s",
        ])
        .context("README uninstall step 3: kubectl delete --ignore-not-found -f release.yaml")?;
        // 4. The token ledgers.
        kubectl(&[
            "delete",
            "configmaps",
            "-A",
            "-l",
            "app.kubernetes.io/component=token-ledger",
        ])
        .context("README uninstall step 4")?;
        for crd in [
            "mutexes.tekton-mutex.dev",
            "clustermutexes.tekton-mutex.dev",
        ] {
            ensure!(
                kubectl(&["get", "crd", crd, "--ignore-not-found", "-o", "name"])?
                    .trim()
                    .is_empty(),
                "CRD {crd} is still there after the uninstall"
            );
        }
        ensure!(
            kubectl(&["get", "namespace", NS, "--ignore-not-found", "-o", "name"])?
                .trim()
                .is_empty(),
            "namespace {NS} is still there after kubectl delete -f release.yaml --wait"
        );
        let prs = kubectl_json(&["get", "pipelineruns", "-A"])?;
        for pr in prs["items"].as_array().into_iter().flatten() {
            let ours: Vec<&Value> = pr["metadata"]["finalizers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|f| f.as_str().is_some_and(|f| f.contains("tekton-mutex")))
                .collect();
            ensure!(
                ours.is_empty(),
                "PipelineRun {}/{} keeps finalizers {ours:?} after the uninstall",
                pr["metadata"]["namespace"],
                pr["metadata"]["name"]
            );
        }
        for ns in namespaces {
            kubectl(&["delete", "namespace", ns, "--wait=false"])?;
            wait_until(
                &format!("namespace {ns} to be gone after the uninstall"),
                secs(120),
                || async {
                    Ok(
                        kubectl(&["get", "namespace", ns, "--ignore-not-found", "-o", "name"])?
                            .trim()
                            .is_empty()
                            .then_some(()),
                    )
                },
            )
            .await?;
        }
        eprintln!(
            "MEASUREMENT uninstall in the README's order, namespaces included: {:.0} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    // ------------------------------------------------------------------ the install test

    /// A lock run's token, once it holds.
    async fn token_of(ns: &TestNamespace, pr: &str) -> Result<i64> {
        wait_reason(ns, &lock_run(pr), "Acquired", slow()).await?;
        result_of(ns, &lock_run(pr), "token")
            .await?
            .context("no token result")?
            .parse()
            .context("token")
    }

    /// Creates PipelineRun `pr` and waits until its lock run waits in the queue.
    async fn queue(ns: &TestNamespace, pr: &str, pipeline: &str) -> Result<()> {
        ns.apply(&pipeline_run(pr, pipeline, &[])).await?;
        wait_reason(ns, &lock_run(pr), "Waiting", slow()).await?;
        Ok(())
    }

    /// How the leader goes.
    #[derive(Clone, Copy, Debug)]
    enum Failure {
        /// `kubectl delete pod`: SIGTERM and the grace period, as a drain or a rollout.
        Deleted,
        /// `kubectl delete pod --grace-period=0 --force`, as for a pod on a lost node.
        ForceDeleted,
        /// SIGKILL to the controller's process in the pod: a crash. It releases nothing; the
        /// other replica waits for the Lease to expire (15 s), and the kubelet restarts it.
        Killed,
    }

    /// The host pid of the controller process of pod `pod` (uid `uid`): the process named
    /// tekton-mutex in the pod's cgroup (`.../pod<uid>/...`, cgroupfs).
    fn controller_pid(pod: &str) -> Result<u32> {
        let uid = kubectl(&[
            "-n",
            NS,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ])?;
        let needle = format!("pod{}/", uid.trim());
        let mut found = Vec::new();
        for e in std::fs::read_dir("/proc")? {
            let Ok(pid) = e?.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            if comm.trim() == "tekton-mutex" && cgroup.contains(&needle) {
                found.push(pid);
            }
        }
        ensure!(
            found.len() == 1,
            "pod {pod}: controller processes {found:?} in cgroup {needle}"
        );
        Ok(found[0])
    }

    /// Fails the leader (`how`) while `holder` holds and `next` waits, lets `holder` finish,
    /// and measures the time from the failure to `next`'s grant. The grant must come from the
    /// other replica: the Lease names it when `next` is granted, and its /readyz answers.
    async fn fail_over(
        ns: &TestNamespace,
        image: &str,
        how: Failure,
        holder: &str,
        next: &str,
    ) -> Result<Duration> {
        let replicas = wait_replicas(image, 2).await?;
        let leader = leader_among(&replicas).await?;
        eprintln!("failing the leader {leader} ({how:?}) while {holder} holds and {next} waits");
        let t0 = Instant::now();
        match how {
            Failure::Deleted | Failure::ForceDeleted => {
                let mut args = vec!["-n", NS, "delete", "pod", leader.as_str(), "--wait=false"];
                if matches!(how, Failure::ForceDeleted) {
                    args.extend(["--grace-period=0", "--force"]);
                }
                kubectl(&args)?;
            }
            Failure::Killed => {
                let pid = controller_pid(&leader)?;
                let status = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status()?;
                ensure!(status.success(), "kill -KILL {pid}: {status}");
            }
        }
        release(ns, holder).await?;
        let lease_moved: std::sync::Mutex<Option<Duration>> = std::sync::Mutex::new(None);
        wait_until(
            &format!("{next} to be granted after the failover"),
            secs(180),
            || {
                let lease_moved = &lease_moved;
                let leader = leader.clone();
                async move {
                    let h = lease_holder().unwrap_or_default();
                    {
                        let mut moved = lease_moved.lock().unwrap();
                        if moved.is_none() && !h.is_empty() && h != leader {
                            *moved = Some(t0.elapsed());
                        }
                    }
                    Ok(wait_reason(ns, &lock_run(next), "Acquired", Duration::ZERO)
                        .await
                        .is_ok()
                        .then_some(()))
                }
            },
        )
        .await?;
        let granted = t0.elapsed();
        let holder_now = lease_holder()?;
        // After a kill, the kubelet restarts the container in the same pod, under the same
        // identity: it may win the expired Lease back. After a deletion, any other replica
        // may lead, the Deployment's replacement for the failed pod included.
        ensure!(
            holder_now != leader || matches!(how, Failure::Killed),
            "{next} was granted while the Lease still names the deleted leader {leader}"
        );
        let taker = wait_replicas(image, 2)
            .await?
            .into_iter()
            .find(|r| r.pod == holder_now)
            .with_context(|| {
                format!("{next} was granted while the Lease names {holder_now:?}, not a replica")
            })?;
        ensure!(
            http_status(&taker.addr, "/readyz")? == 200,
            "{} leads, but its /readyz ({}) is not 200",
            taker.pod,
            taker.addr
        );
        let lease = match *lease_moved.lock().unwrap() {
            Some(t) => format!(
                "the Lease taken by {holder_now} {:.1} s after",
                t.as_secs_f64()
            ),
            None => format!(
                "the Lease kept by {holder_now}, its container restarted by the kubelet, under \
                 the same pod name"
            ),
        };
        eprintln!(
            "MEASUREMENT failover ({how:?}) of {leader}: {lease}; {next} granted {:.1} s after \
             the failure",
            granted.as_secs_f64()
        );
        Ok(granted)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs TEKTON_MUTEX_KUBELET=real hack/cluster.sh up; run by hack/test.sh's real-kubelet lane"]
    async fn the_release_installs_fails_over_and_uninstalls() -> Result<()> {
        let t_start = Instant::now();
        require_real_kubelet()?;
        no_install_left().await?;
        let new = new_release().await?;
        apply_release(new)?;
        let t_install = Instant::now();
        let replicas = wait_replicas(&new.image, 2).await?;
        let leader = leader_among(&replicas).await?;
        // `kubectl logs` is no terminal: the text has no colour codes in it.
        let log = kubectl(&["-n", NS, "logs", &leader, "-c", "controller"])?;
        ensure!(
            !log.contains('\u{1b}'),
            "the controller's log carries terminal colour codes: {:?}",
            log.lines().next()
        );
        eprintln!(
            "MEASUREMENT install: both replicas ready {:.0} s after kubectl apply; leader {leader}",
            t_install.elapsed().as_secs_f64()
        );

        // The founding scenario, against the installed controller: no controller on the host.
        let t_demo = Instant::now();
        let status = without_cargo_test_env(&mut Command::new(repo_root().join("hack/demo.sh")))
            .env("DEMO_CONTROLLER", "in-cluster")
            // demo.sh brings the cluster up in its lane, taking one of the other lane down.
            .env("TEKTON_MUTEX_KUBELET", "real")
            .env("KUBECONFIG", kubeconfig_path())
            .status()
            .context("running hack/demo.sh")?;
        ensure!(
            status.success(),
            "the founding scenario (hack/demo.sh, DEMO_CONTROLLER=in-cluster) failed against the \
             installed release: {status}"
        );
        eprintln!(
            "MEASUREMENT founding scenario (hack/demo.sh) against the installed release: {:.0} s",
            t_demo.elapsed().as_secs_f64()
        );

        // Failover: a key held and waited for, the leader failed three ways in turn.
        let ns = TestNamespace::create("install-failover").await?;
        let timeline = Timeline::start(ns.client(), ns.name());
        ns.apply(&pipeline(
            "p",
            &Opts {
                lock_params: &[("key", "failover"), ("supersede", "none")],
                ..Default::default()
            },
        ))
        .await?;
        ns.apply(&pipeline_run("a", "p", &[])).await?;
        let t_a = token_of(&ns, "a").await?;
        queue(&ns, "b", "p").await?;
        queue(&ns, "c", "p").await?;
        queue(&ns, "d", "p").await?;
        let graceful = fail_over(&ns, &new.image, Failure::Deleted, "a", "b").await?;
        let forced = fail_over(&ns, &new.image, Failure::ForceDeleted, "b", "c").await?;
        let killed = fail_over(&ns, &new.image, Failure::Killed, "c", "d").await?;
        release(&ns, "d").await?;
        for pr in ["a", "b", "c", "d"] {
            succeeded(&ns, pr).await?;
        }
        let (t_b, t_c) = (token_of(&ns, "b").await?, token_of(&ns, "c").await?);
        let t_d = token_of(&ns, "d").await?;
        let grants = check_grants(&timeline, 1, |_| Some("failover".into()))?;
        let order: Vec<(&str, i64)> = grants["failover"]
            .iter()
            .map(|g| (g.pipeline_run.as_str(), g.token))
            .collect();
        ensure!(
            order == [("a", t_a), ("b", t_b), ("c", t_c), ("d", t_d)],
            "grants seen by the watch: {order:?}"
        );
        eprintln!(
            "MEASUREMENT failover grants (watch): {order:?}; next grant after a deletion {:.1} s, \
             a forced deletion {:.1} s, a kill {:.1} s",
            graceful.as_secs_f64(),
            forced.as_secs_f64(),
            killed.as_secs_f64()
        );
        drop(timeline);

        uninstall(new, &[ns.name()]).await?;
        eprintln!(
            "MEASUREMENT install test: {:.0} s",
            t_start.elapsed().as_secs_f64()
        );
        Ok(())
    }

    // ------------------------------------------------------------------ the upgrade test

    /// A ClusterMutex that namespace `ns` may use.
    async fn cluster_mutex(ns: &TestNamespace, name: &str) -> Result<()> {
        let cm = json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "ClusterMutex",
                        "metadata": {"name": name}, "spec": {"namespaces": [ns.name()]}});
        apply_yaml(&ns.client(), None, &cm.to_string()).await?;
        Ok(())
    }

    /// A lock object's holders (PipelineRun, token) and queue, from `kubectl get`.
    /// Holders (PipelineRun, token), the queue's PipelineRuns, and lastToken.
    type LockState = (Vec<(String, i64)>, Vec<String>, i64);

    fn lock_state(what: &str, ns: Option<&str>) -> Result<LockState> {
        let mut args = vec!["get", what];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let obj = kubectl_json(&args)?;
        let st = &obj["status"];
        let holders = st["holders"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|h| {
                (
                    h["pipelineRun"].as_str().unwrap_or_default().to_string(),
                    h["token"].as_i64().unwrap_or(-1),
                )
            })
            .collect();
        let queue = st["queue"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|w| w["pipelineRun"].as_str().unwrap_or_default().to_string())
            .collect();
        Ok((holders, queue, st["lastToken"].as_i64().unwrap_or(0)))
    }

    /// While the upgrade rolls out, every status of the lock objects in `held` (kubectl name,
    /// namespace, holder) still lists the holder, with its token; polled until the rollout is
    /// done, and once more after.
    fn check_still_held(held: &[(String, Option<String>, String, i64)]) -> Result<()> {
        for (what, ns, holder, token) in held {
            let (holders, _, last) = lock_state(what, ns.as_deref())?;
            ensure!(
                holders
                    .iter()
                    .any(|(h, t)| h.ends_with(holder.as_str()) && t == token),
                "{what}: the hold of {holder} (token {token}) is gone during the upgrade: \
                 holders {holders:?}, lastToken {last}"
            );
        }
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs TEKTON_MUTEX_KUBELET=real hack/cluster.sh up; run by hack/test.sh's real-kubelet lane"]
    async fn an_upgrade_keeps_every_lock() -> Result<()> {
        let t_start = Instant::now();
        require_real_kubelet()?;
        no_install_left().await?;
        let from = std::env::var("TEKTON_MUTEX_UPGRADE_FROM")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_UPGRADE_FROM.into());
        let old = old_release(&from)?;
        let new = new_release().await?;
        apply_release(&old)?;
        let old_replicas = wait_replicas(&old.image, 2).await?;
        leader_among(&old_replicas).await?;

        let ns = TestNamespace::create("upgrade").await?;
        let timeline = Timeline::start(ns.client(), ns.name());
        let (cm_b, cm_c) = (format!("{}-b", ns.name()), format!("{}-c", ns.name()));
        cluster_mutex(&ns, &cm_b).await?;
        cluster_mutex(&ns, &cm_c).await?;
        let lock_params: &[(&str, &str)] = &[("supersede", "none")];
        ns.apply(&pipeline(
            "on-a",
            &Opts {
                lock_params: &[("key", "a"), ("supersede", "none")],
                ..Default::default()
            },
        ))
        .await?;
        ns.apply(&pipeline(
            "on-b",
            &Opts {
                lock_params,
                cluster_mutex: Some(&cm_b),
                ..Default::default()
            },
        ))
        .await?;
        ns.apply(&pipeline(
            "on-c",
            &Opts {
                lock_params,
                cluster_mutex: Some(&cm_c),
                ..Default::default()
            },
        ))
        .await?;

        // ClusterMutex C: used once and deleted under the old release, whose ledger for it is
        // in the install's namespace (issue 37 moved it to kube-system).
        ns.apply(&pipeline_run("c1", "on-c", &[])).await?;
        let t_c1 = token_of(&ns, "c1").await?;
        release(&ns, "c1").await?;
        succeeded(&ns, "c1").await?;
        wait_until("ClusterMutex C to be idle", secs(60), || async {
            let (holders, _, _) = lock_state(&format!("clustermutex/{cm_c}"), None)?;
            Ok(holders.is_empty().then_some(()))
        })
        .await?;
        kubectl(&["delete", "clustermutex", &cm_c, "--wait", "--timeout=60s"])?;
        // And c1 with its lock run: a run that shows a token floors its lock too, so without it
        // only the old ledger remembers token 1.
        kubectl(&[
            "-n",
            ns.name(),
            "delete",
            "pipelinerun,customrun",
            "-l",
            "tekton.dev/pipelineRun=c1",
            "--wait",
            "--timeout=60s",
        ])?;
        kubectl(&[
            "-n",
            ns.name(),
            "delete",
            "pipelinerun",
            "c1",
            "--wait",
            "--timeout=60s",
        ])?;
        let old_ledger = kubectl_json(&["-n", NS, "get", "configmap", "tekton-mutex-token-floors"])
            .ok()
            .and_then(|cm| {
                cm["data"][format!("clustermutex.{cm_c}")]
                    .as_str()
                    .map(String::from)
            });
        eprintln!(
            "ClusterMutex C granted token {t_c1} by the old release and deleted; its entry in \
             {NS}/tekton-mutex-token-floors: {old_ledger:?}"
        );

        // Key a: a holder and three waiters; ClusterMutex B: a holder and a waiter.
        ns.apply(&pipeline_run("h1", "on-a", &[])).await?;
        let t_h1 = token_of(&ns, "h1").await?;
        for w in ["w1", "w2", "w3"] {
            queue(&ns, w, "on-a").await?;
        }
        ns.apply(&pipeline_run("h2", "on-b", &[])).await?;
        let t_h2 = token_of(&ns, "h2").await?;
        queue(&ns, "x1", "on-b").await?;
        let (_, queue_a, _) = lock_state("mutex/a", Some(ns.name()))?;
        ensure!(
            queue_a == ["w1", "w2", "w3"],
            "queue of a before the upgrade: {queue_a:?}"
        );
        let held = [
            (
                "mutex/a".to_string(),
                Some(ns.name().to_string()),
                "h1".to_string(),
                t_h1,
            ),
            (format!("clustermutex/{cm_b}"), None, "h2".to_string(), t_h2),
        ];
        check_still_held(&held)?;

        // The upgrade: the new release.yaml over the old one (README "Upgrade"), through the
        // same overlay.
        let t_apply = Instant::now();
        apply_release(new)?;
        wait_until("the rollout of the new release", secs(300), || async {
            check_still_held(&held)?;
            let d = kubectl_json(&["-n", NS, "get", "deployment", DEPLOYMENT])?;
            let image_now =
                d["spec"]["template"]["spec"]["containers"][0]["image"] == new.image.as_str();
            let st = &d["status"];
            let done = image_now
                && st["observedGeneration"] == d["metadata"]["generation"]
                && st["updatedReplicas"] == 2
                && st["replicas"] == 2
                && st["availableReplicas"] == 2;
            Ok(done.then_some(()))
        })
        .await?;
        let new_replicas = wait_replicas(&new.image, 2).await?;
        let leader = leader_among(&new_replicas).await?;
        eprintln!(
            "MEASUREMENT upgrade: the new release's replicas ready and {leader} leading {:.0} s \
             after kubectl apply",
            t_apply.elapsed().as_secs_f64()
        );
        check_still_held(&held)?;
        for pr in ["h1", "h2"] {
            let c = wait_reason(&ns, &lock_run(pr), "Acquired", Duration::ZERO).await?;
            ensure!(
                c.status == "True",
                "{pr}'s lock run after the upgrade: {c:?}"
            );
        }
        let (_, queue_a, _) = lock_state("mutex/a", Some(ns.name()))?;
        ensure!(
            queue_a == ["w1", "w2", "w3"],
            "queue of a after the upgrade: {queue_a:?}"
        );

        // The new controller hands over: in order, tokens above the last.
        release(&ns, "h1").await?;
        let order = drive_grants(&ns, &["w1", "w2", "w3"], 3).await?;
        ensure!(
            order == ["w1", "w2", "w3"],
            "key a granted {order:?} after the upgrade"
        );
        release(&ns, "h2").await?;
        let t_x1 = token_of(&ns, "x1").await?;
        release(&ns, "x1").await?;
        // ClusterMutex C again: its tokens continue above the old release's.
        cluster_mutex(&ns, &cm_c).await?;
        ns.apply(&pipeline_run("c2", "on-c", &[])).await?;
        let t_c2 = token_of(&ns, "c2").await?;
        release(&ns, "c2").await?;
        for pr in ["h1", "w1", "w2", "w3", "h2", "x1", "c2"] {
            succeeded(&ns, pr).await?;
        }

        let key_of = |pr: &str| -> Option<String> {
            Some(match pr {
                "h1" | "w1" | "w2" | "w3" => "a".into(),
                "h2" | "x1" => "b".into(),
                "c1" | "c2" => "c".into(),
                _ => return None,
            })
        };
        let grants = check_grants(&timeline, 1, key_of)?;
        let seen = |k: &str| -> Vec<(String, i64)> {
            grants
                .get(k)
                .into_iter()
                .flatten()
                .map(|g| (g.pipeline_run.clone(), g.token))
                .collect()
        };
        eprintln!(
            "MEASUREMENT upgrade grants (watch): a {:?}, b {:?}, c {:?}",
            seen("a"),
            seen("b"),
            seen("c")
        );
        let a: Vec<String> = seen("a").into_iter().map(|(p, _)| p).collect();
        ensure!(a == ["h1", "w1", "w2", "w3"], "key a granted {a:?}");
        ensure!(
            seen("a").iter().skip(1).all(|(_, t)| *t > t_h1),
            "key a: a token after the upgrade is not above {t_h1}: {:?}",
            seen("a")
        );
        ensure!(
            t_x1 > t_h2,
            "ClusterMutex B: x1 got token {t_x1}, h2 had {t_h2}"
        );
        ensure!(
            t_c2 > t_c1,
            "ClusterMutex C, deleted under the old release with token {t_c1}, recreated under \
             the new one, handed out token {t_c2}: the old ledger was not carried over"
        );
        drop(timeline);

        uninstall(new, &[ns.name()]).await?;
        eprintln!(
            "MEASUREMENT upgrade test (from {from}): {:.0} s",
            t_start.elapsed().as_secs_f64()
        );
        Ok(())
    }
}
