#!/usr/bin/env bash
# The model checks of the lock protocol (issue 25): a stateright model whose step function is
# the real decision core (verify/), explored exhaustively at the bounds of each configuration.
# Prints one `<N> states` line per configuration and a summary; exits 0 when no property is
# violated.
#
#   hack/verify.sh             the suite of configurations in verify/src/config.rs (Config::suite)
#   hack/verify.sh --broken    the same model over a decision core built with the
#                              chaos-broken-capacity feature and TEKTON_MUTEX_BROKEN=capacity
#                              (one slot too many, as hack/chaos.sh --broken): must exit
#                              non-zero, printing the counterexample
#   hack/verify.sh --threads N checker threads (default 2)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }

broken="" threads=2
while (( $# )); do
  case $1 in
    --broken) broken=1; shift ;;
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
log "verify: building the model checker (release)"
(cd "$REPO_ROOT" && cargo build --quiet --release -p verify "${features[@]}")
log "verify: checking ${args[*]}${broken:+ (broken capacity)}"
status=0
"$REPO_ROOT/target/release/verify" "${args[@]}" --threads "$threads" || status=$?
if [[ -z $broken ]]; then
  # The model's own tests: 0 counterexamples with the real guards, one for each removed guard.
  log "verify: the model's tests (cargo test --release -p verify)"
  (cd "$REPO_ROOT" && cargo test --quiet --release -p verify) || status=$?
fi
elapsed=$(( $(date +%s) - t0 ))
if (( status == 0 )); then
  log "verify: no property violated (${elapsed}s)"
else
  log "verify: a property is violated: counterexample above (${elapsed}s)"
fi
exit "$status"
