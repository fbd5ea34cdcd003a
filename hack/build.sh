#!/usr/bin/env bash
# Builds the local control plane from Go modules: etcd, kube-apiserver,
# kube-controller-manager, kubectl, the Tekton Pipelines controller and tkn (and, with
# TEKTON_MUTEX_KUBELET=real, the kubelet, kube-scheduler, Tekton's helper binaries and pause). Each binary
# lands in a cache outside the repo, keyed by its wrapper module's go.mod+go.sum, and is
# skipped when present.
#
#   hack/build.sh            build whatever is missing
#   TEKTON_MUTEX_CACHE=DIR   where binaries go (default ~/.cache/tekton-mutex)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

require_tool go "Go 1.26 or newer (https://go.dev/dl/, or apt-get install golang)"
require_tool flock "util-linux (apt-get install util-linux)"

# component  wrapper-dir  import-path  extra-ldflags
kube_ver=$(module_version "$here/tools/kubernetes" k8s.io/kubernetes)
kube_minor=$(echo "$kube_ver" | cut -d. -f2)
kube_ldflags="-X k8s.io/component-base/version.gitVersion=$kube_ver \
 -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor \
 -X k8s.io/component-base/version.gitCommit=0000000000000000000000000000000000000000 \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z"
tkn_ver=$(module_version "$here/tools/tkn" github.com/tektoncd/cli)

components=(
  "etcd|etcd|go.etcd.io/etcd/server/v3|"
  "etcdutl|etcd|go.etcd.io/etcd/etcdutl/v3|"
  "kube-apiserver|kubernetes|k8s.io/kubernetes/cmd/kube-apiserver|$kube_ldflags"
  "kube-controller-manager|kubernetes|k8s.io/kubernetes/cmd/kube-controller-manager|$kube_ldflags"
  "kubectl|kubernetes|k8s.io/kubernetes/cmd/kubectl|$kube_ldflags"
  "tekton-controller|tekton|github.com/tektoncd/pipeline/cmd/controller|"
  "tkn|tkn|github.com/tektoncd/cli/cmd/tkn|-X github.com/tektoncd/cli/pkg/cmd/version.clientVersion=$tkn_ver"
)
# The real-kubelet lane (TEKTON_MUTEX_KUBELET=real) also needs the kubelet and kube-scheduler at the
# apiserver's version, the binaries of Tekton's helper images, and the pod sandbox's pause.
if real_kubelet; then
  components+=(
    "kubelet|kubernetes|k8s.io/kubernetes/cmd/kubelet|$kube_ldflags"
    "kube-scheduler|kubernetes|k8s.io/kubernetes/cmd/kube-scheduler|$kube_ldflags"
    "tekton-entrypoint|tekton|github.com/tektoncd/pipeline/cmd/entrypoint|"
    "tekton-nop|tekton|github.com/tektoncd/pipeline/cmd/nop|"
    "tekton-workingdirinit|tekton|github.com/tektoncd/pipeline/cmd/workingdirinit|"
    "tekton-sidecarlogresults|tekton|github.com/tektoncd/pipeline/cmd/sidecarlogresults|"
    "pause|pause|.|"
  )
fi

# One build into the shared cache at a time, from any checkout: a second waits, then finds the
# binaries cached. Each binary is written beside its place under a name of this process's own and
# moved in whole, so a reader never sees half a file.
mkdir -p "$CACHE_DIR/locks"
exec 7>"$CACHE_DIR/locks/build.lock"
if ! flock -n 7; then
  log "build: another build is writing $CACHE_DIR/bin; waiting for it (up to 60 min)"
  flock -w 3600 7 || die "gave up waiting for the build lock $CACHE_DIR/locks/build.lock"
fi
total_start=$(date +%s)
for entry in "${components[@]}"; do
  IFS='|' read -r name dir import ldflags <<<"$entry"
  out=$(component_bin "$name")
  mkdir -p "$(dirname "$out")"
  if [[ -x "$out" ]]; then
    log "build: $name is cached ($out)"
    continue
  fi
  log "build: compiling $name from $import (cold builds take minutes; output follows when done)"
  start=$(date +%s)
  (
    cd "$here/tools/$dir"
    CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
      go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp.$$" "$import"
  ) || { rm -f "$out.tmp.$$"; die "build of $name failed (see the go output above)"; }
  mv -f "$out.tmp.$$" "$out"
  log "build: $name done in $(( $(date +%s) - start ))s"
done
log "build: all components ready in $(( $(date +%s) - total_start ))s under $CACHE_DIR/bin"
