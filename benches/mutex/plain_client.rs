//! What the API server gives a plain client, to set the controller's throughput beside: status
//! writes to Mutexes that no controller serves, as fast as a client with 32 writes in flight can
//! make them (the throughput part's controller writes with the same API server, moments before).

use super::support::TestNamespace;
use super::{create_all, patch_status_all};
use anyhow::Result;
use serde_json::json;

/// Writes per object: enough that the rate is not the first round's warm-up.
const ROUNDS: usize = 3;

/// Status writes per second over `n` Mutexes, `ROUNDS` merge patches each.
pub async fn status_writes_per_s(n: usize) -> Result<f64> {
    let ns = TestNamespace::create("bench-plain-client").await?;
    let api = ns.dynamic("tekton-mutex.dev/v1alpha1", "Mutex").await?;
    let names: Vec<String> = (0..n).map(|i| format!("plain-{i:05}")).collect();
    let objs = names
        .iter()
        .map(|name| {
            json!({"apiVersion": "tekton-mutex.dev/v1alpha1", "kind": "Mutex",
                   "metadata": {"name": name}, "spec": {}})
        })
        .collect();
    create_all(&api, objs, 32).await?;
    let patches: Vec<(String, serde_json::Value)> = (1..=ROUNDS)
        .flat_map(|round| {
            let status = json!({"status": {"waiting": round}});
            names.iter().map(move |n| (n.clone(), status.clone()))
        })
        .collect();
    let writes = patches.len() as f64;
    let t0 = std::time::Instant::now();
    patch_status_all(&api, patches, 32).await?;
    Ok(writes / t0.elapsed().as_secs_f64().max(1e-3))
}
