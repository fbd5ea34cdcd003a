#!/usr/bin/env bash
# The model checks of the lock protocol and the Sieve-style fault suite (issue 25): a stateright
# model whose step function is the real decision core (verify/), explored exhaustively at the
# bounds of each configuration; then the real reconcilers under Sieve's three rules (crashes after
# every write, stale caches, unobserved watch events) in process, against a fake API server
# (src/controller/tests/sieve/, `cargo test --lib sieve`, a debug build). Prints a summary: one
# `<N> states` line per configuration, `<crashed>/<total> write points crashed` and the plans run;
# exits 0 when no property is violated.
#
#   hack/verify.sh             the suite of configurations in verify/src/config.rs (Config::suite),
#                              then the Sieve-style suite
#   hack/verify.sh --sieve     the Sieve-style suite only (SIEVE_SEED=N for another seed)
#   hack/verify.sh --broken    both over a decision core built with the chaos-broken-capacity
#                              feature and TEKTON_MUTEX_BROKEN=capacity (one slot too many, as
#                              hack/chaos.sh --broken): must exit non-zero, printing the
#                              counterexample and the violations
#   hack/verify.sh --threads N checker threads (default 2)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

broken="" threads=2 sieve_only=""
while (( $# )); do
  case $1 in
    --broken) broken=1; shift ;;
    --sieve) sieve_only=1; shift ;;
    --threads) threads=${2:?--threads needs a number}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done

features=()
args=(suite)
if [[ -n $broken ]]; then
  features=(--features chaos-broken-capacity)
  export TEKTON_MUTEX_BROKEN=capacity
  # The first counterexample is enough, and the shortest is the clearest.
  args=(A --first)
fi

t0=$(date +%s)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
status=0
if [[ -z $sieve_only ]]; then
  log "verify: building the model checker (release)"
  (cd "$REPO_ROOT" && cargo build --quiet --release -p verify "${features[@]}")
  log "verify: checking ${args[*]}${broken:+ (broken capacity)}"
  "$REPO_ROOT/target/release/verify" "${args[@]}" --threads "$threads" | tee "$out/model" || status=$?
  if [[ -z $broken ]]; then
    # The model's own tests that the suite does not cover: one counterexample for each removed
    # guard, and the known limits (the suite above is their "holds" half, at larger bounds).
    log "verify: a counterexample for each removed guard (cargo test --release -p verify)"
    (cd "$REPO_ROOT" && cargo test --quiet --release -p verify -- without_ known_bug known_limit) || status=$?
  fi
fi
# The Sieve-style suite: its report is every line starting `sieve:` (the test's --nocapture output).
log "verify: the Sieve-style suite (cargo test --lib sieve)${broken:+ (broken capacity)}"
(cd "$REPO_ROOT" && cargo test --quiet --lib sieve -- --nocapture 2>&1) | tee "$out/sieve" | grep '^sieve: ' || true
if ! grep -q '^test result: ok' "$out/sieve"; then
  tail -n 40 "$out/sieve" | grep -v '^sieve: ' || true
  status=1
fi
elapsed=$(( $(date +%s) - t0 ))
log "verify: summary"
grep -h ' states' "$out/model" 2>/dev/null || true
grep -h -e '^sieve: [0-9]*/[0-9]* write points crashed' -e '^sieve: [0-9]* crash plans' \
  -e '^sieve:   stale ' -e '^sieve:   unobserved ' -e '^sieve: [0-9]* violations' "$out/sieve" || true
if (( status == 0 )); then
  log "verify: no property violated (${elapsed}s)"
else
  log "verify: a property is violated: counterexample above (${elapsed}s)"
fi
exit "$status"
