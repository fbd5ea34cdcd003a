#!/usr/bin/env bash
# The one test command: runs the lint gates (hack/lint.sh), builds the local control plane if
# needed, starts it, runs the whole Rust suite against it, and always stops the cluster again.
# Exits non-zero on any failure. Plain `cargo test` runs only the hermetic tests; the cluster
# tests are marked `#[ignore = "needs hack/cluster.sh up"]` and run here through
# `--include-ignored`.
#
#   hack/test.sh                          everything
#   hack/test.sh --test mutex_core        args before `--` go to `cargo test`
#   hack/test.sh -- --nocapture waiters   args after `--` go to the test binaries
#   TEKTON_MUTEX_SKIP_LINT=1              skip the lint gates (say so when you report a run)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

require_tool go "Go 1.26 or newer (https://go.dev/dl/)"
require_tool cargo "Rust 1.89 or newer (https://rustup.rs)"
require_tool openssl "openssl (apt-get install openssl)"
require_tool python3 "python3 (apt-get install python3)"
require_tool curl "curl (apt-get install curl)"

lock_cluster # one test run per checkout at a time
# The real-kubelet lane's own control plane (it runs beside the chaos campaign's, below).
REAL_DIR=$REPO_ROOT/.cluster-real
t0=$(date +%s)
phase_start=$t0
phase() { # phase NAME: log the time the previous phase took
  local now; now=$(date +%s)
  log "test: $1 took $(( now - phase_start ))s"
  phase_start=$now
}

# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local rc=$?
  if [[ -n ${model_pid:-} ]]; then # the model checks, if still running: the script and its children
    pkill -TERM -P "$model_pid" 2>/dev/null || true
    kill "$model_pid" 2>/dev/null || true
  fi
  if [[ -n ${real_pid:-} ]]; then # the real-kubelet lane, if still running: it and its children
    pkill -TERM -P "$real_pid" 2>/dev/null || true
    kill "$real_pid" 2>/dev/null || true
  fi
  if (( rc != 0 )); then
    rm -rf "$REPO_ROOT/target/last-cluster"
    local dir
    for dir in "$CLUSTER_DIR" "$REAL_DIR"; do
      [[ -d $dir/logs ]] || continue
      mkdir -p "$REPO_ROOT/target/last-cluster/${dir##*/}"
      cp -r "$dir/logs" "$dir/pods" "$REPO_ROOT/target/last-cluster/${dir##*/}/" 2>/dev/null || true
      log "test: component logs and step output of $dir kept in target/last-cluster/${dir##*/}/"
    done
  fi
  "$here/cluster.sh" down || log "warning: hack/cluster.sh down failed"
  if [[ -f $REAL_DIR/kubeconfig || -d $REAL_DIR/logs ]]; then
    TEKTON_MUTEX_CLUSTER_DIR=$REAL_DIR "$here/cluster.sh" down || log "warning: hack/cluster.sh down failed for $REAL_DIR"
  fi
  log "test: total $(( $(date +%s) - t0 ))s, exit code $rc"
  exit "$rc"
}
trap cleanup EXIT

if [[ -n ${TEKTON_MUTEX_SKIP_LINT:-} ]]; then
  log "test: WARNING: lint gates skipped (TEKTON_MUTEX_SKIP_LINT is set)"
else
  "$here/lint.sh"
  phase "lint"
fi
"$here/build.sh"
phase "build"
"$here/picture.sh" test # the timeline picture's tests (tests/picture/): no cluster needed
phase "picture tests"
"$here/docs.sh" # every relative link in README.md and docs/ resolves (tests/docs/check_links.py)
"$REPO_ROOT/tests/build_cache/two_builds_at_once.sh" # the binary cache is written under a lock
phase "build cache test"
TEKTON_MUTEX_SKIP_BUILD=1 "$here/cluster.sh" up
phase "cluster up"

export KUBECONFIG=$CLUSTER_DIR/kubeconfig
TEKTON_MUTEX_KUBECTL=$(component_bin kubectl)
TEKTON_MUTEX_TKN=$(component_bin tkn)
export TEKTON_MUTEX_KUBECTL TEKTON_MUTEX_TKN

cd "$REPO_ROOT"
status=0 failed=()
# failed PHASE: record a failed phase; the summary at the end names every one (CI shows the tail).
failed() { failed+=("$1"); }
cargo_args=() test_args=() after_dashes=0
for arg in "$@"; do
  if (( after_dashes )); then
    test_args+=("$arg")
  elif [[ $arg == -- ]]; then
    after_dashes=1
  else
    cargo_args+=("$arg")
  fi
done
full_run=$(( ${#cargo_args[@]} == 0 && ${#test_args[@]} == 0 ))
# The real-kubelet lane (docs/kubelets.md): containerd, runc and a kubelet instead of the
# pod-runner, for what depends on pod lifecycle: the founding scenario (hack/demo.sh), the holders
# that drain, Tekton's own examples, and the release installed, failed over, upgraded and
# uninstalled as pods (tests/install.rs). Skip it with TEKTON_MUTEX_SKIP_REAL_KUBELET=1.
# It runs on a control plane of its own (REAL_DIR, its own ports and containerd), in the
# background, beside the pod-runner lane's cargo test and chaos campaign: the lanes mostly wait
# on pods, Tekton and timers, and their checks wait on conditions, not durations, so together
# they take about the longest of them instead of the sum (issue 47: the CI budget). Its output
# goes to target/real-kubelet.log; each step's time is repeated below when it ends, its failures
# are named in the summary.
real_log=$REPO_ROOT/target/real-kubelet.log real_failed=$REPO_ROOT/target/real-kubelet.failed
real_pid=""
real_kubelet_lane() {
  export TEKTON_MUTEX_CLUSTER_DIR=$REAL_DIR TEKTON_MUTEX_KUBELET=real KUBECONFIG=$REAL_DIR/kubeconfig
  local lane_start=$SECONDS
  step() { # step NAME COMMAND...: run one step of the lane, log its time, record a failure
    local name=$1 t=$SECONDS; shift
    "$@" || echo "real kubelet: $name" >>"$real_failed"
    log "test: real kubelet: $name took $(( SECONDS - t ))s"
  }
  step "cluster up" "$here/cluster.sh" up # builds what only this lane needs
  step "holder_drains" cargo test --test holder_drains --no-fail-fast -- --include-ignored
  step "demo (the founding scenario)" "$here/demo.sh"
  # Once more on the cluster the first run left up: its Mutexes are idle, so they carry no
  # finalizer and the reset deletes them with no controller running (issue 23 item 12: this hung).
  step "demo, second run on the same cluster" "$here/demo.sh"
  step "Tekton's examples" env EXAMPLES_MIN=38 "$here/tekton-examples.sh"
  # Issue 38: release.yaml as users apply it, its two replicas as pods (no controller on the host):
  # the founding scenario, leader failover, the README's uninstall; then an upgrade from the
  # release of TEKTON_MUTEX_UPGRADE_FROM (default 487de83) with locks held. One at a time: each
  # installs and uninstalls the cluster-wide release.
  step "install, failover, uninstall (tests/install.rs)" \
    cargo test --test install -- --include-ignored --exact real_kubelet::the_release_installs_fails_over_and_uninstalls
  step "upgrade with locks held (tests/install.rs)" \
    cargo test --test install -- --include-ignored --exact real_kubelet::an_upgrade_keeps_every_lock
  "$here/cluster.sh" down || log "warning: hack/cluster.sh down failed for $REAL_DIR"
  log "test: real kubelet lane took $(( SECONDS - lane_start ))s"
}
if (( full_run )) && [[ -z ${TEKTON_MUTEX_SKIP_REAL_KUBELET:-} && ${TEKTON_MUTEX_KUBELET:-} != real ]]; then
  rm -f "$real_failed"
  real_kubelet_lane >"$real_log" 2>&1 &
  real_pid=$!
  log "test: real-kubelet lane started beside the pod-runner lane (pid $real_pid, log $real_log)"
fi
# The model checker's own tests run in release, from hack/verify.sh (in debug they take minutes).
# tests/install.rs's real_kubelet:: tests run the release as pods: only on the real kubelet (below).
skip=()
[[ ${TEKTON_MUTEX_KUBELET:-} == real ]] || skip=(--skip real_kubelet::)
cargo test --workspace --exclude verify --no-fail-fast "${cargo_args[@]}" -- --include-ignored ${skip[@]+"${skip[@]}"} "${test_args[@]}" || { status=$?; failed "cargo test --workspace"; }
phase "cargo test --workspace"
# The model checks (issue 25) need no cluster and are CPU-bound; the chaos campaign and the
# real-kubelet lane after them mostly wait on pods and timers. So the model checks run beside
# those two lanes, on one checker thread (one core stays for the cluster), instead of after
# them: the same checks and the same verdict, about 7 minutes sooner (issue 47). Their output
# goes to target/model-checks.log, shown if they fail; their exit code counts as before.
model_log=$REPO_ROOT/target/model-checks.log model_pid=""
if (( full_run )); then
  "$here/verify.sh" --threads 1 >"$model_log" 2>&1 &
  model_pid=$!
  log "test: model checks started beside the next lanes (pid $model_pid, log $model_log)"
fi
# A short fault campaign (fixed seeds); docs/testing.md. Its output is kept, and its end repeated
# in the summary if it fails: the report says which round and invariant.
chaos_log=$REPO_ROOT/target/chaos-ci.log
mkdir -p "$(dirname "$chaos_log")"
set +e
"$here/chaos.sh" --ci 2>&1 | tee "$chaos_log"
chaos_status=${PIPESTATUS[0]}
set -e
(( chaos_status == 0 )) || { status=$chaos_status; failed "chaos campaign"; }
phase "chaos campaign"
if [[ -n $real_pid ]]; then
  real_status=0
  wait "$real_pid" || real_status=$?
  real_pid=""
  grep 'test: real kubelet' "$real_log" >&2 || true
  if [[ -s $real_failed ]] || (( real_status != 0 )); then
    status=1
    while read -r name; do failed "$name"; done <"$real_failed"
    (( real_status == 0 )) || failed "real kubelet lane (exit code $real_status)"
    log "test: the end of the real-kubelet lane's output ($real_log):"
    tail -n 60 "$real_log" >&2
  fi
  phase "real-kubelet lane (waited for; it ran beside cargo test and the chaos campaign)"
fi
if [[ -n $model_pid ]]; then
  model_status=0
  wait "$model_pid" || model_status=$?
  model_pid=""
  if (( model_status == 0 )); then
    grep -e ' states' -e 'verify: no property' "$model_log" || true
  else
    status=$model_status
    failed "model checks"
    log "test: the end of the model checks' output ($model_log):"
    tail -n 60 "$model_log" >&2
  fi
  phase "model checks (waited for; they ran beside the lanes above)"
fi
if (( status != 0 )); then
  if (( chaos_status != 0 )); then
    log "test: the end of the chaos campaign's output ($chaos_log):"
    tail -n 40 "$chaos_log" >&2
  fi
  log "test: FAILED (exit code $status) in: ${failed[*]}"
fi
exit "$status"
