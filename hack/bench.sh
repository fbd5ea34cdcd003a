#!/usr/bin/env bash
# The benchmark (docs/performance.md): handover latency, the Mutex side by side with a polling
# Lease, API writes per grant against queue length, throughput over many keys, a burst of arrivals
# (single- and multi-key: time until each is told, CPU), memory/CPU with a
# large history, and memory after many free-form keys are each used once. Runs the release-built
# controller against the local control plane (it starts one unless one is already up, and stops
# what it started). Prints a table and writes JSON to target/bench/. Every figure is measured
# from outside the controller.
#
#   hack/bench.sh                      full size (about 30-60 min on 2 cores)
#   hack/bench.sh --quick              everything scaled down (a few minutes)
#   hack/bench.sh --only writes,memory parts: handover,lease,writes,throughput,burst,
#                                      memory,free-keys,failover
#   hack/bench.sh --handovers 100 --queue 10 --waiters 10,100,1000 --grants 5 --arrivals 10 \
#                 --keys 1000 --runs-per-key 10 --multi-key-waiters 1000 --history 10000 --free-keys 10000 --kills 20 --settle-ms 1500
#                 --free-keys-linger-s 400 (free-keys: measure once more that long after, past the
#                 controller's 6-minute Event cache and 5-minute resync; default 0, not measured)
#                                      the full-size defaults, each can be changed
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

case "${1:-}" in
  -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
require_tool cargo "Rust 1.89 or newer (https://rustup.rs)"
require_tool curl "curl (apt-get install curl)"

lock_cluster
started=""
cleanup() {
  local rc=$?
  if [[ -n $started ]]; then
    "$here/cluster.sh" down || log "warning: hack/cluster.sh down failed"
  fi
  exit "$rc"
}
trap cleanup EXIT

if [[ -f $CLUSTER_DIR/ready ]]; then
  log "bench: using the cluster that is already up in $CLUSTER_DIR"
fi
# `up` is a no-op when the cluster is healthy; remember whether this script started it.
[[ -f $CLUSTER_DIR/ready ]] || started=1
"$here/cluster.sh" up

export KUBECONFIG=$CLUSTER_DIR/kubeconfig
TEKTON_MUTEX_KUBECTL=$(component_bin kubectl)
TEKTON_MUTEX_TKN=$(component_bin tkn)
export TEKTON_MUTEX_KUBECTL TEKTON_MUTEX_TKN

cd "$REPO_ROOT"
log "bench: building and running the release benchmark (cargo bench --bench mutex)"
cargo bench --bench mutex -- "$@"
