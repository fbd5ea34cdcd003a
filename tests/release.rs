//! hack/release.sh end to end, without a container runtime: it builds the image, pushes it to
//! an OCI registry on loopback (`crane registry serve`), and renders release.yaml. The test pulls
//! the manifest back, checks the digest pinned in release.yaml, and runs the binary from the
//! image. Needs no cluster; builds crane from Go modules on first use (cached).

mod support;

use anyhow::{Context, Result, bail, ensure};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const VERSION: &str = "0.0.0-releasetest";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn crane(args: &[&str]) -> Result<String> {
    let out = Command::new(repo().join("hack/crane.sh"))
        .args(args)
        .output()
        .context("running hack/crane.sh")?;
    ensure!(
        out.status.success(),
        "crane {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// `crane registry serve` on a free loopback port; stopped when dropped.
struct Registry {
    child: Child,
    addr: String,
}

impl Registry {
    fn start() -> Result<Self> {
        let bin = crane(&["--path"])?;
        let mut child = Command::new(bin.trim())
            .args(["registry", "serve", "--address", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        // It logs its port once it listens; reading blocks until then (or until it exits).
        let stderr = child.stderr.take().context("registry stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let port = loop {
            let Some(line) = lines.next().transpose()? else {
                bail!("the registry exited before serving");
            };
            if let Some(p) = line.split("serving on port ").nth(1) {
                break p.trim().to_string();
            }
        };
        // Keep draining its log: a closed pipe would kill it at its next line.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(Self {
            child,
            addr: format!("127.0.0.1:{port}"),
        })
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn images_in(release_yaml: &str) -> Result<Vec<String>> {
    let mut images = Vec::new();
    let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(release_yaml)?;
    for obj in docs {
        if obj["kind"] == "Deployment" {
            for c in obj["spec"]["template"]["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
            {
                images.push(c["image"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    Ok(images)
}

fn run_from_image(
    root: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> Result<std::process::Output> {
    Ok(Command::new(root.join("tekton-mutex"))
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("KUBECONFIG")
        .env("HOME", root)
        .output()?)
}

#[test]
#[ignore = "builds a release (minutes): run by hack/test.sh"]
fn release_pushes_a_pinned_image_that_runs() -> Result<()> {
    let registry = Registry::start()?;
    let status = support::without_cargo_test_env(&mut Command::new(repo().join("hack/release.sh")))
        .args([VERSION, &registry.addr])
        .env(
            "TEKTON_MUTEX_SOURCE",
            "https://example.invalid/tekton-mutex",
        )
        .status()?;
    ensure!(status.success(), "hack/release.sh failed: {status}");
    let dist = repo().join("target/dist").join(VERSION);
    let release = std::fs::read_to_string(dist.join("release.yaml"))?;

    // The manifest the registry serves has the digest release.yaml pins.
    let image = format!("{}/tekton-mutex:{VERSION}", registry.addr);
    let digest = crane(&["digest", &image])?.trim().to_string();
    let images = images_in(&release)?;
    ensure!(
        images == [format!("{image}@{digest}")],
        "release.yaml pins {images:?}, registry has {digest}"
    );
    ensure!(release.contains(&format!("app.kubernetes.io/version: {VERSION}")));
    let namespaced = std::fs::read_to_string(dist.join("release-namespaced.yaml"))?;
    ensure!(
        images_in(&namespaced)? == images,
        "release-namespaced.yaml pins another image"
    );
    // As many policies as the source has (config/admission/queue-at-create.yaml).
    let source = std::fs::read_to_string(
        support::repo_root().join("config/admission/queue-at-create.yaml"),
    )?;
    let policies = source.matches("\nkind: MutatingAdmissionPolicy\n").count();
    ensure!(
        policies > 0,
        "no policy in config/admission/queue-at-create.yaml"
    );
    for (file, api) in [
        ("release-admission.yaml", "v1"),
        ("release-admission-v1beta1.yaml", "v1beta1"),
    ] {
        let text = std::fs::read_to_string(dist.join(file))?;
        let docs: Vec<serde_json::Value> = serde_saphyr::from_str_multiple(&text)?;
        let kinds: Vec<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
        ensure!(
            kinds
                .iter()
                .filter(|k| **k == "MutatingAdmissionPolicy")
                .count()
                == policies
                && docs
                    .iter()
                    .all(|d| d["apiVersion"]
                        == format!("admissionregistration.k8s.io/{api}").as_str()),
            "{file} is not the admission policy for {api}: {kinds:?}"
        );
    }

    let manifest: serde_json::Value = serde_json::from_str(&crane(&["manifest", &image])?)?;
    ensure!(
        manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json",
        "not an OCI image manifest: {manifest}"
    );
    let config: serde_json::Value = serde_json::from_str(&crane(&["config", &image])?)?;
    ensure!(
        config["architecture"] == "amd64" && config["os"] == "linux",
        "{config}"
    );
    ensure!(
        config["config"]["User"] == "65532:65532",
        "runs as root: {config}"
    );
    let labels = &config["config"]["Labels"];
    ensure!(
        labels["org.opencontainers.image.version"] == VERSION,
        "{labels}"
    );
    ensure!(
        labels["org.opencontainers.image.source"] == "https://example.invalid/tekton-mutex",
        "{labels}"
    );
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap_or_default();
    ensure!(revision.len() >= 40, "revision label {revision:?}");

    // The binary in the image runs, and reports the version and revision it was built as.
    let root = tempdir(&dist)?;
    let tar = root.join("fs.tar");
    crane(&["export", &image, tar.to_str().unwrap()])?;
    let status = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&root)
        .status()?;
    ensure!(status.success(), "tar -xf failed");
    let out = run_from_image(&root, &["version"], &[])?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success() && text.contains(VERSION) && text.contains(revision),
        "tekton-mutex version: {text}"
    );
    // The tkn plugin is its own artefact, of the same version.
    let plugin = Command::new(dist.join("tkn-mutex-linux-amd64"))
        .arg("--version")
        .output()?;
    let text = String::from_utf8_lossy(&plugin.stdout);
    ensure!(
        plugin.status.success() && text.contains(VERSION),
        "tkn-mutex --version: {text}"
    );
    // The release build has no fault injection: the variable is not even read.
    let out = run_from_image(
        &root,
        &["run"],
        &[("TEKTON_MUTEX_FAULT", "exit-after-lock-write")],
    )?;
    let err = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.code() == Some(1) && err.contains("no Kubernetes config"),
        "expected the release binary to ignore TEKTON_MUTEX_FAULT and fail on the missing config: {err}"
    );
    Ok(())
}

fn tempdir(parent: &Path) -> Result<PathBuf> {
    let dir = parent.join("image-root");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}
