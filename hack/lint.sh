#!/usr/bin/env bash
# Lint gates: formatting, clippy and rustdoc with warnings as errors, shellcheck on hack/*.sh, and
# crates/ free of I/O. Runs them all and fails if any one finds something. hack/test.sh runs it first.
#
#   hack/lint.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

require_tool cargo "Rust 1.89 or newer (https://rustup.rs)"

# ensure_cargo_component NAME: rustfmt or clippy, added through rustup when missing.
ensure_cargo_component() {
  local sub=${1#rust}
  cargo "$sub" --version >/dev/null 2>&1 && return 0
  require_tool rustup "the $1 component of Rust (rustup component add $1)"
  log "lint: installing $1 (rustup component add $1)"
  rustup component add "$1" || die "could not install $1"
}

# ensure_shellcheck: installed with apt-get when missing (apt-get update first if needed).
ensure_shellcheck() {
  command -v shellcheck >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 ||
    die "shellcheck is not installed: install it (https://github.com/koalaman/shellcheck#installing)"
  local sudo=()
  (( EUID == 0 )) || sudo=(sudo)
  log "lint: installing shellcheck (apt-get install shellcheck)"
  "${sudo[@]}" apt-get install -y -qq shellcheck >/dev/null 2>&1 ||
    { "${sudo[@]}" apt-get update -qq && "${sudo[@]}" apt-get install -y -qq shellcheck; } ||
    die "could not install shellcheck with apt-get"
}

ensure_cargo_component rustfmt
ensure_cargo_component clippy
ensure_shellcheck

cd "$REPO_ROOT"
failed=()
gate() { # gate NAME CMD...: run one gate, remember its failure, go on with the next
  local name=$1; shift
  log "lint: $name"
  "$@" || failed+=("$name")
}
gate "cargo fmt --all --check" cargo fmt --all --check
gate "cargo clippy --workspace --all-targets -- -D warnings" \
  cargo clippy --workspace --all-targets --quiet -- -D warnings
gate "cargo doc --workspace --no-deps (warnings denied)" \
  env RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
gate "shellcheck hack/*.sh tests/build_cache/*.sh" shellcheck -x hack/*.sh tests/build_cache/*.sh
# pure_crates [CRATE...]: the crates of crates/ hold no I/O, so no async runtime, HTTP stack or
# kube client may be among their dependencies (their clippy.toml forbids reading the clock).
pure_crates() {
  local c bad crates=("$@")
  (( $# )) || crates=(tekton-mutex-api tekton-mutex-core tekton-mutex-promise)
  for c in "${crates[@]}"; do
    bad=$(cargo tree -p "$c" -e normal --prefix none --quiet | awk '{print $1}' | sort -u |
      grep -xE 'tokio|hyper|hyper-util|kube-client|kube-runtime|tower|reqwest|mio' | tr '\n' ' ' || true)
    [[ -z $bad ]] || { echo "error: $c depends on $bad(crates/ must stay free of I/O)" >&2; return 1; }
  done
}
gate "crates/: no runtime, no client" pure_crates

if (( ${#failed[@]} > 0 )); then
  printf 'error: lint failed: %s\n' "${failed[@]}" >&2
  exit 1
fi
log "lint: clean"
