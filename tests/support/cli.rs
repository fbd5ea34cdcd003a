//! The `tkn-mutex` plugin as a user runs it: standalone, or as `tkn mutex` with
//! the built binary's directory on PATH (tkn's plugin convention).

use super::{kubeconfig_path, tool_path};
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a command printed and how it exited.
#[derive(Debug)]
pub struct Ran {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    pub fn ok(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout when it exited 0, else an error with everything it said.
    pub fn stdout(self) -> Result<String> {
        anyhow::ensure!(self.ok(), "command failed: {self:?}");
        Ok(self.stdout)
    }
}

/// The built plugin binary.
pub fn plugin_path() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tkn-mutex"))
}

/// `tkn-mutex ARGS` against the local cluster (or the kubeconfig in ARGS).
pub fn tkn_mutex(args: &[&str]) -> Result<Ran> {
    run(Command::new(plugin_path()).args(args))
}

/// `tkn mutex ARGS`, the real tkn finding the plugin on PATH.
pub fn tkn_plugin(args: &[&str]) -> Result<Ran> {
    let tkn = tool_path("tkn")?;
    let dir = plugin_path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    run(Command::new(tkn).arg("mutex").args(args).env("PATH", path))
}

fn run(cmd: &mut Command) -> Result<Ran> {
    let out = cmd
        .env("KUBECONFIG", kubeconfig_path())
        .env("NO_COLOR", "1")
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    Ok(Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
