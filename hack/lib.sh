# Shared helpers for hack/ scripts. Sourced, never run.
# shellcheck shell=bash

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_DIR=${TEKTON_MUTEX_CACHE:-$HOME/.cache/tekton-mutex}
CLUSTER_DIR=${TEKTON_MUTEX_CLUSTER_DIR:-$REPO_ROOT/.cluster}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# require_tool NAME HINT: fail with an install hint when NAME is not on PATH.
require_tool() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed: install $2"
}

# module_version DIR MODULE: the version a wrapper module pins for MODULE.
module_version() {
  awk -v m="$2" '$1 == "require" && $2 == m {print $3} $1 == m && $2 ~ /^v/ {print $2}' "$1/go.mod" | head -n1
}

# component_dir WRAPPER: cache directory for binaries built from hack/tools/WRAPPER,
# keyed by the wrapper's go.mod and go.sum so a version bump builds afresh.
component_dir() {
  local key
  key=$(cat "$REPO_ROOT/hack/tools/$1/go.mod" "$REPO_ROOT/hack/tools/$1/go.sum" | sha256sum | cut -c1-12)
  echo "$CACHE_DIR/bin/$1-$key"
}

# component_bin NAME: path of a built binary.
component_bin() {
  case "$1" in
    etcd|etcdutl) echo "$(component_dir etcd)/$1" ;;
    kube-apiserver|kube-controller-manager|kubectl|kubelet|kube-scheduler) echo "$(component_dir kubernetes)/$1" ;;
    tekton-controller) echo "$(component_dir tekton)/controller" ;;
    # Tekton's helper images' binaries and the pod sandbox's pause (the real-kubelet lane only).
    tekton-entrypoint|tekton-nop|tekton-workingdirinit|tekton-sidecarlogresults)
      echo "$(component_dir tekton)/${1#tekton-}" ;;
    pause) echo "$(component_dir pause)/pause" ;;
    tkn) echo "$(component_dir tkn)/tkn" ;;
    *) die "unknown component $1" ;;
  esac
}

# real_kubelet: true when this run uses the real-kubelet lane (TEKTON_MUTEX_KUBELET=real: containerd,
# runc and a kubelet built from k8s.io/kubernetes) instead of testbed/pod-runner. See docs/kubelets.md.
real_kubelet() {
  case ${TEKTON_MUTEX_KUBELET:-} in
    ''|pod-runner) return 1 ;;
    real) return 0 ;;
    *) die "TEKTON_MUTEX_KUBELET must be 'real' or unset (the pod-runner), got '$TEKTON_MUTEX_KUBELET'" ;;
  esac
}

# wait_for DESCRIPTION TIMEOUT_SECONDS COMMAND...: poll COMMAND until it succeeds.
wait_for() {
  local what=$1 timeout=$2; shift 2
  local deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    if (( $(date +%s) >= deadline )); then
      log "timed out after ${timeout}s waiting for $what"
      return 1
    fi
    sleep 0.2 # poll interval of a bounded condition wait, not synchronization
  done
}

# lock_cluster: hold an exclusive lock on this cluster directory until the calling script exits,
# so that concurrent `up`/`down`/test runs on one checkout take turns. A no-op when a parent
# script already holds it (TEKTON_MUTEX_CLUSTER_LOCKED=1).
lock_cluster() {
  [[ -n ${TEKTON_MUTEX_CLUSTER_LOCKED:-} ]] && return 0
  require_tool flock "util-linux (apt-get install util-linux)"
  local dir
  dir="$CACHE_DIR/locks"
  mkdir -p "$dir"
  exec 9>"$dir/cluster-$(printf '%s' "$CLUSTER_DIR" | sha256sum | cut -c1-12).lock"
  if ! flock -n 9; then
    log "another hack/cluster.sh or hack/test.sh is using $CLUSTER_DIR; waiting for it (up to 30 min)"
    flock -w 1800 9 || die "gave up waiting for the lock on $CLUSTER_DIR"
  fi
  export TEKTON_MUTEX_CLUSTER_LOCKED=1
}
