//! Embeds what `tekton-mutex version` prints: the version (TEKTON_MUTEX_VERSION
//! when set by hack/release.sh, else the crate's) and the git revision
//! (TEKTON_MUTEX_REVISION when set, else `git rev-parse HEAD`, else "unknown").

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=TEKTON_MUTEX_VERSION");
    let version = std::env::var("TEKTON_MUTEX_VERSION")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| std::env::var("CARGO_PKG_VERSION").unwrap_or_default());
    println!("cargo:rustc-env=TEKTON_MUTEX_VERSION={version}");
    println!("cargo:rerun-if-env-changed=TEKTON_MUTEX_REVISION");
    let revision = std::env::var("TEKTON_MUTEX_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| {
            // Rebuild when HEAD moves (the branch ref, or HEAD itself when detached);
            // only files that exist, or cargo would rebuild every time.
            for path in [
                git(&["rev-parse", "--git-path", "HEAD"]),
                git(&["rev-parse", "--symbolic-full-name", "HEAD"])
                    .and_then(|r| git(&["rev-parse", "--git-path", &r])),
            ]
            .into_iter()
            .flatten()
            .filter(|p| std::path::Path::new(p).exists())
            {
                println!("cargo:rerun-if-changed={path}");
            }
            git(&["rev-parse", "HEAD"])
        })
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TEKTON_MUTEX_REVISION={revision}");
}
