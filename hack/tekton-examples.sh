#!/usr/bin/env bash
# Tekton's own example PipelineRuns (examples/v1/pipelineruns/*.yaml of the tektoncd/pipeline
# module hack/tools/tekton pins) on the local cluster, each file in a namespace of its own (several
# files define objects of the same name). Prints each file's outcome, the reason for each failure,
# and `N of M succeeded`. Exits 0 when at least EXAMPLES_MIN files succeeded.
#
#   hack/tekton-examples.sh              start the cluster if needed (hack/cluster.sh up), run all
#   hack/tekton-examples.sh FILE...      only these files (names under examples/v1/pipelineruns)
#
# Environment:
#   TEKTON_MUTEX_KUBELET=real   the real-kubelet lane (see docs/kubelets.md); a cluster already up
#                               keeps the lane it was started with
#   EXAMPLES_PARALLEL=N         files running at once (default 4)
#   EXAMPLES_TIMEOUT=S          seconds one file may take (default 300)
#   EXAMPLES_MIN=N              succeed when at least N files succeed (default: all of them)
#   EXAMPLES_KEEP=1             keep the namespaces (default: delete them at the end)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

PARALLEL=${EXAMPLES_PARALLEL:-4}
TIMEOUT=${EXAMPLES_TIMEOUT:-300}
[[ $PARALLEL =~ ^[1-9][0-9]*$ ]] || die "EXAMPLES_PARALLEL must be a positive integer"
[[ $TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "EXAMPLES_TIMEOUT must be a positive integer"

t_start=$(date +%s)
# A cluster that is up keeps its lane (hack/cluster.sh up would restart it in the lane asked for).
if [[ -z ${TEKTON_MUTEX_KUBELET:-} && -f $CLUSTER_DIR/lane && $(<"$CLUSTER_DIR/lane") == real ]]; then
  export TEKTON_MUTEX_KUBELET=real
fi
"$here/cluster.sh" up
export KUBECONFIG=$CLUSTER_DIR/kubeconfig
KUBECTL=$(component_bin kubectl)
k() { "$KUBECTL" "$@"; }

dir=$(cd "$here/tools/tekton" && GOFLAGS=-mod=mod GOTOOLCHAIN=local go list -m -f '{{.Dir}}' github.com/tektoncd/pipeline)
dir=$dir/examples/v1/pipelineruns
[[ -d $dir ]] || die "Tekton's examples not found at $dir"
files=()
if (( $# > 0 )); then
  for f in "$@"; do files+=("$dir/$(basename "$f")"); done
else
  files=("$dir"/*.yaml)
fi
MIN=${EXAMPLES_MIN:-${#files[@]}}
lane=$(cat "$CLUSTER_DIR/lane" 2>/dev/null || echo pod-runner)
log "examples: ${#files[@]} files from $dir on the $lane lane, $PARALLEL at a time"

WORK=$(mktemp -d)
namespaces=()
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local rc=$?
  if [[ ${EXAMPLES_KEEP:-} != 1 && ${#namespaces[@]} -gt 0 ]]; then
    log "examples: deleting the ${#namespaces[@]} namespaces (EXAMPLES_KEEP=1 keeps them)"
    k delete namespace "${namespaces[@]}" --wait=false >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

ns_of() { # a namespace name for an example file
  local b
  b=$(basename "$1" .yaml | tr '[:upper:]_.' '[:lower:]--')
  echo "ex-${b:0:55}"
}

# reason NS: why the PipelineRun(s) in NS did not succeed, with their failed TaskRuns' messages.
reason() {
  local ns=$1
  k -n "$ns" get pipelinerun -o jsonpath='{range .items[*]}{.metadata.name}: {.status.conditions[0].reason}: {.status.conditions[0].message}{"\n"}{end}' 2>&1 | cut -c1-400
  k -n "$ns" get taskrun -o jsonpath='{range .items[*]}{.metadata.name} {.status.conditions[0].status} {.status.conditions[0].reason}: {.status.conditions[0].message}{"\n"}{end}' 2>/dev/null |
    awk '$2 != "True"' | sed 's/^/    taskrun /' | cut -c1-400
}

# run_one FILE: create the file's objects in a fresh namespace and wait for its PipelineRuns.
# Writes WORK/<ns>.result: "ok SECONDS" or "failed SECONDS", and WORK/<ns>.reason.
run_one() {
  local f=$1 ns t0 states deadline
  ns=$(ns_of "$f")
  t0=$(date +%s)
  k delete namespace "$ns" --wait=true >/dev/null 2>&1 || true
  k create namespace "$ns" >/dev/null
  if ! wait_for "the default ServiceAccount of $ns" 60 k -n "$ns" get serviceaccount default; then
    echo "failed $(( $(date +%s) - t0 ))" >"$WORK/$ns.result"; echo "no default ServiceAccount" >"$WORK/$ns.reason"; return
  fi
  if ! k -n "$ns" create -f "$f" >"$WORK/$ns.create" 2>&1; then
    echo "failed $(( $(date +%s) - t0 ))" >"$WORK/$ns.result"
    { echo "kubectl create failed:"; cut -c1-400 "$WORK/$ns.create"; } >"$WORK/$ns.reason"; return
  fi
  deadline=$(( t0 + TIMEOUT ))
  while :; do
    states=$(k -n "$ns" get pipelinerun -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Succeeded")].status}{"\n"}{end}' 2>/dev/null || true)
    if [[ -n $states ]] && ! grep -qvE '^(True|False)$' <<<"$states"; then break; fi
    if (( $(date +%s) >= deadline )); then
      echo "failed $(( $(date +%s) - t0 ))" >"$WORK/$ns.result"
      { echo "timed out after ${TIMEOUT}s:"; reason "$ns"; } >"$WORK/$ns.reason"; return
    fi
    sleep 1 # poll interval of a bounded condition wait, not synchronization
  done
  if grep -qv '^True$' <<<"$states"; then
    echo "failed $(( $(date +%s) - t0 ))" >"$WORK/$ns.result"
    reason "$ns" >"$WORK/$ns.reason"
  else
    echo "ok $(( $(date +%s) - t0 ))" >"$WORK/$ns.result"
  fi
}

for f in "${files[@]}"; do
  namespaces+=("$(ns_of "$f")")
  while (( $(jobs -rp | wc -l) >= PARALLEL )); do wait -n || true; done
  run_one "$f" &
done
wait

ok=0
for f in "${files[@]}"; do
  ns=$(ns_of "$f")
  read -r state secs <"$WORK/$ns.result" 2>/dev/null || { state=failed; secs='?'; }
  if [[ $state == ok ]]; then
    ok=$(( ok + 1 ))
    printf 'ok      %-62s %4ss\n' "$(basename "$f")" "$secs"
  else
    printf 'FAILED  %-62s %4ss\n' "$(basename "$f")" "$secs"
    sed 's/^/        /' "$WORK/$ns.reason" 2>/dev/null || true
  fi
done
echo
echo "$ok of ${#files[@]} succeeded ($lane lane, $(( $(date +%s) - t_start ))s)"
(( ok >= MIN ))
