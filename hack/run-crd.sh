#!/usr/bin/env bash
# Prints the path of the Run (tekton.dev/v1alpha1) CRD from an older Tekton
# module (Run was removed in v0.47), downloading the module if needed.
set -euo pipefail
# shellcheck source=hack/lib.sh
source "$(cd "$(dirname "$0")" && pwd)/lib.sh"
require_tool go "Go 1.26 or newer"
version=v0.46.0
dir=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "github.com/tektoncd/pipeline@$version" | awk -F'"' '/"Dir"/ {print $4}')
[[ -f "$dir/config/300-run.yaml" ]] || die "no config/300-run.yaml in github.com/tektoncd/pipeline@$version ($dir)"
echo "$dir/config/300-run.yaml"
