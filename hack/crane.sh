#!/usr/bin/env bash
# crane (go-containerregistry), built from the Go module pinned in hack/tools/crane and cached
# outside the repo like the control plane binaries. Runs crane with the given arguments.
#
#   hack/crane.sh ARGS...     run crane
#   hack/crane.sh --path      build it if needed and print its path
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

bin=$(component_dir crane)/crane
if [[ ! -x $bin ]]; then
  require_tool go "Go 1.26 or newer (https://go.dev/dl/, or apt-get install golang)"
  mkdir -p "$(dirname "$bin")"
  exec 8>"$bin.lock" # one build at a time
  flock -w 900 8 || die "gave up waiting for another build of crane"
  if [[ ! -x $bin ]]; then
    log "crane: compiling from $(module_version "$here/tools/crane" github.com/google/go-containerregistry)"
    (
      cd "$here/tools/crane"
      CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-mod=mod \
        go build -trimpath -ldflags "-s -w" -o "$bin.tmp" github.com/google/go-containerregistry/cmd/crane
    ) || die "build of crane failed (see the go output above)"
    mv "$bin.tmp" "$bin"
  fi
fi
if [[ ${1:-} == --path ]]; then
  echo "$bin"
else
  exec "$bin" "$@"
fi
