//! The mappings of docs/coming-from-other-tools.md (issue 48): every file of
//! examples/from-other-tools/ is named by the page, and the local control plane's API server
//! takes it as it stands (a server-side dry run: the CRDs' schemas and rules, Tekton's
//! validation). A broken mapping is refused, so the check can fail.

mod support;

use anyhow::{Context, Result, ensure};
use std::path::PathBuf;
use support::*;

fn examples() -> Result<Vec<PathBuf>> {
    let dir = repo_root().join("examples/from-other-tools");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| p.extension().is_some_and(|x| x == "yaml"));
    files.sort();
    Ok(files)
}

#[test]
fn the_page_shows_every_mapping() -> Result<()> {
    let page = std::fs::read_to_string(repo_root().join("docs/coming-from-other-tools.md"))?;
    let files = examples()?;
    ensure!(files.len() >= 7, "{files:?}");
    for f in files {
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        ensure!(
            page.contains(&format!("(../examples/from-other-tools/{name})")),
            "docs/coming-from-other-tools.md does not show {name}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs hack/cluster.sh up"]
async fn the_api_server_takes_every_mapping_as_it_stands() -> Result<()> {
    // The lock kinds must be known, whichever test ran first on this cluster.
    support::controller::install_crd(&repo_root().join("config/300-crd.yaml")).await?;
    let ns = TestNamespace::create("from-other-tools").await?;
    for f in examples()? {
        let path = f.to_string_lossy();
        ns.kubectl(&["apply", "--dry-run=server", "-f", &path])
            .with_context(|| format!("applying {path}"))?;
    }
    // The same, broken: a deny window whose schedule has four fields.
    let freeze = repo_root().join("examples/from-other-tools/gitlab-deploy-freeze.yaml");
    let broken = std::fs::read_to_string(&freeze)?.replace("\"0 23 * * fri\"", "\"0 23 * fri\"");
    let file = repo_root().join(format!("target/{}-broken-freeze.yaml", ns.name()));
    std::fs::write(&file, broken)?;
    let refused = ns.kubectl(&["apply", "--dry-run=server", "-f", &file.to_string_lossy()]);
    let said = format!("{:?}", refused.err());
    ensure!(
        said.contains("schedule"),
        "a broken schedule was taken: {said}"
    );
    Ok(())
}
