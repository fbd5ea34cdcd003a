#!/usr/bin/env bash
# The founding scenario (jenkins-x/jx#6167), end to end on the local control plane:
# five promotions of one environment started within a second, first without the Mutex (the
# environment is wiped out), then with it (one at a time; the newest version wins), then the
# unguarded pipeline again, queued by annotations alone (PipelineRuns created Pending with
# tekton-mutex.dev/key: the pipeline is not edited), and last as a Trigger starts it (no Pending,
# no annotation): a Mutex's spec.selector takes the runs, and the admission policy of
# config/admission/ makes them Pending as they are created.
#
#   hack/demo.sh                  build what is missing, start the cluster and the controller,
#                                 run the four scenarios, print the story, and draw the first round of
#                                 each as a picture: target/demo/timeline.svg (from the timeline data
#                                 target/demo/timeline.json; hack/picture.sh draws it)
#
# Environment:
#   DEMO_ROUNDS=N     run each scenario N times (default 1); the first round is shown in full
#   DEMO_WINDOW=S     the deploy's race window in seconds, between apply and prune (default 6)
#   DEMO_DOWN=1       take the local cluster down at the end (default: leave it up to look around)
#   DEMO_CONTROLLER=in-cluster   start no controller: use the release installed in the cluster
#                     (Deployment tekton-mutex/tekton-mutex, as tests/install.rs installs it);
#                     its CRDs are the release's, so config/300-crd.yaml is not applied either
#   TEKTON_MUTEX_CLUSTER_DIR   where the cluster lives (default .cluster, as hack/cluster.sh)
#
# Exits 0 only when every guarded and queued round left the environment intact at the newest version.
# Whether the unguarded rounds wiped the environment is reported, not judged.
# The controller it starts is always stopped on exit; the cluster stays up unless DEMO_DOWN=1.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

ROUNDS=${DEMO_ROUNDS:-1}
WINDOW=${DEMO_WINDOW:-6}
PIPELINES_NS=jx           # where the environment pipelines run (the Mutex objects live here)
ENV_NS=jx-staging         # the environment they promote to (and the Mutex key)
VERSIONS=(77 78 79 80 81) # the five builds of the report
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "DEMO_ROUNDS must be a positive integer, got '$ROUNDS'"
[[ $WINDOW =~ ^[0-9]+$ ]] || die "DEMO_WINDOW must be a whole number of seconds, got '$WINDOW'"
IN_CLUSTER=0
case ${DEMO_CONTROLLER:-} in
  "") ;;
  in-cluster) IN_CLUSTER=1 ;;
  *) die "DEMO_CONTROLLER must be empty or in-cluster, got '$DEMO_CONTROLLER'" ;;
esac

require_tool cargo "Rust 1.89 or newer (https://rustup.rs)"
require_tool python3 "python3 (apt-get install python3)"

t_start=$(date +%s)
bold() { if [[ -t 1 ]]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }
banner() { echo; bold "== $* =="; }

CONTROLLER_PID=
ADMISSION_POLICY= # set once the selected round installed the admission policy, which cleanup removes
WORK=$(mktemp -d)
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local rc=$?
  if [[ -n $CONTROLLER_PID ]] && kill -0 "$CONTROLLER_PID" 2>/dev/null; then
    log "demo: stopping the controller (pid $CONTROLLER_PID)"
    kill -TERM "$CONTROLLER_PID" 2>/dev/null || true
    wait_for "the controller to exit" 10 not_running "$CONTROLLER_PID" || kill -KILL "$CONTROLLER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  # It is cluster-wide, and must not outlive the CRDs its params are (a later uninstall).
  if [[ -n $ADMISSION_POLICY ]]; then
    "$KUBECTL" delete --ignore-not-found -f "$ADMISSION_POLICY" >/dev/null 2>&1 || true
  fi
  if [[ ${DEMO_DOWN:-} == 1 ]]; then
    "$here/cluster.sh" down || true
  elif [[ -f $CLUSTER_DIR/kubeconfig ]]; then
    log "demo: the local cluster is still up; look around with: eval \"\$(hack/cluster.sh env)\""
    log "demo:   tkn pipelinerun list -n $PIPELINES_NS; tkn pipelinerun logs -n $PIPELINES_NS guarded-${VERSIONS[-1]} (a deploy's output)"
    log "demo: stop it with hack/cluster.sh down"
  fi
  log "demo: finished in $(( $(date +%s) - t_start ))s"
  exit "$rc"
}
# shellcheck disable=SC2317 # run through wait_for
not_running() { ! kill -0 "$1" 2>/dev/null; }
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ build and start everything

banner "1. Build and start the local control plane and the controller"
PICTURE_DIR=$REPO_ROOT/target/demo
rm -f "$PICTURE_DIR/timeline.json" "$PICTURE_DIR/timeline.svg"
mkdir -p "$PICTURE_DIR"
"$here/picture.sh" python >/dev/null # matplotlib for the picture (installed the first time)
"$here/build.sh" # etcd, kube-apiserver, kubectl, the Tekton controller and tkn (cached after the first time)
log "demo: building the controller and the pod-runner (cargo build; the first build takes a few minutes)"
(cd "$REPO_ROOT" && cargo build -p tekton-mutex -p pod-runner)
TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
CONTROLLER_BIN=$TARGET_DIR/debug/tekton-mutex
[[ -x $CONTROLLER_BIN ]] || die "cargo build did not produce $CONTROLLER_BIN"
TEKTON_MUTEX_SKIP_BUILD=1 "$here/cluster.sh" up

export KUBECONFIG=$CLUSTER_DIR/kubeconfig
KUBECTL=$(component_bin kubectl)
TKN=$(component_bin tkn)
k() { "$KUBECTL" "$@"; }

if (( IN_CLUSTER )); then
  log "demo: installing the example pipelines into namespace $PIPELINES_NS (the CRDs are the installed release's)"
else
  log "demo: installing the Mutex CRD (config/300-crd.yaml) and the example pipelines into namespace $PIPELINES_NS"
  k apply -f "$REPO_ROOT/config/300-crd.yaml" >/dev/null
fi
k wait --for=condition=Established crd/mutexes.tekton-mutex.dev --timeout=60s >/dev/null
for ns in "$PIPELINES_NS" "$ENV_NS"; do
  k get namespace "$ns" >/dev/null 2>&1 || k create namespace "$ns" >/dev/null
  # no controller-manager here to create it
  k -n "$ns" get serviceaccount default >/dev/null 2>&1 || k -n "$ns" create serviceaccount default >/dev/null
done
# What the deploy steps may do (their ServiceAccount `promote`): on a real kubelet, nothing more.
k apply -f "$REPO_ROOT/examples/rbac.yaml" >/dev/null
for f in promote-task promote-fenced-task promote-unguarded promote-guarded promote-fenced; do
  k -n "$PIPELINES_NS" apply -f "$REPO_ROOT/examples/$f.yaml" >/dev/null
done

# reset: what an earlier demo left in the two namespaces (runs, pods, their step logs, the Mutex).
reset_namespaces() {
  k -n "$PIPELINES_NS" delete pipelinerun,taskrun,customrun --all --wait=true >/dev/null
  k -n "$PIPELINES_NS" delete pod --all --grace-period=0 --force --wait=true >/dev/null 2>&1 || true
  # An idle Mutex carries no finalizer, so it goes even before the controller starts. One still in
  # use (a demo interrupted mid-round) waits for a controller: the next reset, with ours running.
  k -n "$PIPELINES_NS" delete mutexes --all --wait=true --timeout=60s >/dev/null ||
    log "demo: a Mutex is still in use (an interrupted demo?); the controller lets it go once it runs"
  rm -rf "${CLUSTER_DIR:?}/pods/$PIPELINES_NS"
  k -n "$ENV_NS" delete configmap,service,serviceaccount -l chart-release=jx --wait=true >/dev/null
  k annotate namespace "$ENV_NS" tekton-mutex.dev/deploy-token- >/dev/null 2>&1 || true
}
reset_namespaces

if (( IN_CLUSTER )); then
  # The release's Deployment: no controller of ours. It serves every namespace, jx included.
  CONTROLLER_LOG="kubectl -n tekton-mutex logs deployment/tekton-mutex (the in-cluster controller)"
  k -n tekton-mutex get deployment tekton-mutex >/dev/null 2>&1 ||
    die "DEMO_CONTROLLER=in-cluster, but there is no Deployment tekton-mutex/tekton-mutex: install a release first"
  [[ $(k -n tekton-mutex get deployment tekton-mutex -o jsonpath='{.status.readyReplicas}') -ge 1 ]] ||
    die "DEMO_CONTROLLER=in-cluster, but no replica of Deployment tekton-mutex/tekton-mutex is ready"
  log "demo: using the controller installed in the cluster (Deployment tekton-mutex/tekton-mutex, lease holder $(k -n tekton-mutex get lease tekton-mutex -o jsonpath='{.spec.holderIdentity}' 2>/dev/null))"
else
  CONTROLLER_LOG=$CLUSTER_DIR/logs/tekton-mutex-demo.log
  log "demo: starting the controller: $CONTROLLER_BIN run --namespace $PIPELINES_NS (log: $CONTROLLER_LOG)"
  RUST_LOG=${RUST_LOG:-info,kube=warn} NO_COLOR=1 setsid "$CONTROLLER_BIN" run --namespace "$PIPELINES_NS" \
    >"$CONTROLLER_LOG" 2>&1 </dev/null &
  CONTROLLER_PID=$!
  wait_for "the controller to start" 30 grep -q "starting tekton-mutex" "$CONTROLLER_LOG" ||
    { tail -n 20 "$CONTROLLER_LOG" >&2; die "the controller did not start"; }
  kill -0 "$CONTROLLER_PID" 2>/dev/null || { tail -n 20 "$CONTROLLER_LOG" >&2; die "the controller exited"; }
fi

# ------------------------------------------------------------------ one round of a scenario

now_ms() { local us=${EPOCHREALTIME/[.,]/}; echo $(( us / 1000 )); }

# shellcheck disable=SC2317 # run through wait_for
all_done() {
  local states
  states=$(k -n "$PIPELINES_NS" get pipelinerun -l "demo-scenario=$1" \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Succeeded")].status}{"\n"}{end}')
  [[ $(grep -cE '^(True|False)$' <<<"$states") -eq ${#VERSIONS[@]} ]]
}

# run_round SCENARIO PIPELINE ROUND [pending]: start the five PipelineRuns at once, wait, report.
# With `pending`, each is created Pending with the key annotation (examples/promote-pending.yaml):
# the lock queues the whole PipelineRun, and the pipeline is not edited.
# Sets RESULT_LINE to the report's machine-readable last line.
run_round() {
  local scenario=$1 pipeline=$2 round=$3 queued=${4:-} verbose=0 v t0 t1 pids=() annotations status
  (( round == 1 )) && verbose=1
  reset_namespaces
  [[ $queued == selected ]] && select_promotions
  t0=$(now_ms)
  for v in "${VERSIONS[@]}"; do # like five `jx start pipeline` at once
    annotations="{}" status=""
    if [[ $queued == pending ]]; then
      annotations="{tekton-mutex.dev/key: $ENV_NS, tekton-mutex.dev/sequence: \"$v\"}"
      status="status: PipelineRunPending"
    fi
    k -n "$PIPELINES_NS" create -f - >/dev/null <<EOF &
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata:
  name: $scenario-$v
  labels: {demo-scenario: $scenario}
  annotations: $annotations
spec:
  $status
  pipelineRef: {name: $pipeline}
  taskRunTemplate: {serviceAccountName: promote} # examples/rbac.yaml, not the test bed's admin
  params:
    - {name: environment, value: $ENV_NS}
    - {name: version, value: "$v"}
    - {name: race-window, value: "$WINDOW"}
EOF
    pids+=($!)
  done
  wait "${pids[@]}" # (not a bare `wait`: the controller is a child too)
  t1=$(now_ms)
  log "demo: $scenario round $round: created PipelineRuns $scenario-${VERSIONS[0]}..${VERSIONS[-1]} within $(( t1 - t0 ))ms (pipeline $pipeline, race window ${WINDOW}s); waiting for them to finish"
  if ! wait_for "the $scenario PipelineRuns to finish" $(( 4 * WINDOW + 120 )) all_done "$scenario"; then
    k -n "$PIPELINES_NS" get pipelinerun -l "demo-scenario=$scenario" >&2 || true
    die "the $scenario PipelineRuns did not finish; controller log: $CONTROLLER_LOG"
  fi
  {
    printf '{"created_ms": %s, "environment_namespace": "%s", "versions": [%s],\n' "$t0" "$ENV_NS" "$(IFS=,; echo "${VERSIONS[*]}")"
    printf '"pipelineruns": '; k -n "$PIPELINES_NS" get pipelinerun -l "demo-scenario=$scenario" -o json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["items"]))'
    printf ', "taskruns": '; k -n "$PIPELINES_NS" get taskrun -o json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["items"]))'
    printf ', "customruns": '; k -n "$PIPELINES_NS" get customrun -o json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["items"]))'
    printf ', "environment": '; k -n "$ENV_NS" get configmap,service,serviceaccount -l chart-release=jx -o json | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["items"]))'
    printf '}\n'
  } >"$WORK/state.json"
  local out timeline=()
  (( round == 1 )) && timeline=("$PICTURE_DIR/timeline.json") # the picture shows the first round
  out=$(python3 "$here/demo-report.py" "$scenario" "$round" "$verbose" "$WORK/state.json" "$CLUSTER_DIR/pods/$PIPELINES_NS" "${timeline[@]}")
  grep -v '^RESULT ' <<<"$out" || true
  RESULT_LINE=$(grep '^RESULT ' <<<"$out")
}

# select_promotions: the platform team's only change for the selected round: a Mutex whose selector
# takes the promotions of $ENV_NS as they are created (it reads each one's sequence from its version
# param), and the admission policy that makes them Pending at create. Waits until the API server
# applies both (a dry-run create comes back Pending).
select_promotions() {
  ADMISSION_POLICY=$REPO_ROOT/config/admission/queue-at-create.yaml
  k apply -f "$ADMISSION_POLICY" >/dev/null
  k -n "$PIPELINES_NS" apply -f - >/dev/null <<EOF
apiVersion: tekton-mutex.dev/v1alpha1
kind: Mutex
metadata: {name: $ENV_NS}
spec:
  selector:
    matchLabels: {demo-scenario: selected}
    pipelines: [promote-unguarded]
  sequenceFrom: {param: version}
EOF
  wait_for "the admission policy to take the selected promotions" 60 selected_run_made_pending ||
    die "the API server did not make a selected PipelineRun Pending: does it serve MutatingAdmissionPolicy?"
}

# shellcheck disable=SC2317 # run through wait_for
selected_run_made_pending() {
  [[ $(k -n "$PIPELINES_NS" create --dry-run=server -o jsonpath='{.spec.status}' -f - <<EOF
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata: {name: probe, labels: {demo-scenario: selected}}
spec: {pipelineRef: {name: promote-unguarded}}
EOF
  ) == PipelineRunPending ]]
}

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<" $2"; }
summary_of() {
  local left
  left="$(field present "$1")/$(field expected "$1") resources left"
  [[ $(field present "$1") == 0 ]] || left+=" (version $(field versions "$1"))"
  echo "$left, max $(field max_overlap "$1") deploying at once"
}

# guarded_rounds SCENARIO PIPELINE [MODE]: ROUNDS rounds of a scenario that must leave the
# environment intact at the newest version with at most one deploy at once. Sets INTACT (how many
# rounds did) and SUMMARY (one line per round).
guarded_rounds() {
  local r present expected
  INTACT=0 SUMMARY=()
  for (( r = 1; r <= ROUNDS; r++ )); do
    run_round "$1" "$2" "$r" "${3:-}"
    present=$(field present "$RESULT_LINE") expected=$(field expected "$RESULT_LINE")
    if (( present == expected )) && [[ $(field versions "$RESULT_LINE") == "$(field newest "$RESULT_LINE")" ]] &&
      (( $(field max_overlap "$RESULT_LINE") <= 1 )); then
      INTACT=$(( INTACT + 1 ))
    fi
    SUMMARY+=("$(summary_of "$RESULT_LINE")")
  done
}

# ------------------------------------------------------------------ the scenarios

banner "2. Unguarded: five promotions of $ENV_NS at once, nothing in the way (pipeline promote-unguarded)"
echo "   Each deploy applies the chart with version=N, waits ${WINDOW}s, then deletes -l chart-release=jx,version!=N."
wiped=0 damaged=0
unguarded_summary=()
for (( r = 1; r <= ROUNDS; r++ )); do
  run_round unguarded promote-unguarded "$r"
  present=$(field present "$RESULT_LINE") expected=$(field expected "$RESULT_LINE")
  (( present == 0 )) && wiped=$(( wiped + 1 ))
  (( present < expected )) && damaged=$(( damaged + 1 ))
  unguarded_summary+=("$(summary_of "$RESULT_LINE")")
done

banner "3. Guarded: the same five, with the Mutex as the first task (pipeline promote-guarded, key $ENV_NS)"
echo "   The Mutex lets one deploy in at a time; newer arrivals supersede older waiting ones."
guarded_rounds guarded promote-guarded
intact=$INTACT guarded_summary=("${SUMMARY[@]}")


echo
bold "tkn customrun list -n $PIPELINES_NS   (the guarded round's locks)"
"$TKN" customrun list -n "$PIPELINES_NS"
echo
bold "kubectl get mutexes -n $PIPELINES_NS"
k get mutexes -n "$PIPELINES_NS"
# tkn finds the tkn-mutex plugin (built above with the controller) on PATH.
tkn_mutex() { PATH="$TARGET_DIR/debug:$PATH" "$TKN" mutex "$@"; }
echo
bold "tkn mutex list -n $PIPELINES_NS   (queue control: see the README's \"Queue control\")"
tkn_mutex list -n "$PIPELINES_NS"
demo_key=$(k get mutexes -n "$PIPELINES_NS" -o jsonpath='{.items[0].metadata.name}')
if [[ -n $demo_key ]]; then
  echo
  bold "tkn mutex describe $demo_key -n $PIPELINES_NS"
  tkn_mutex describe "$demo_key" -n "$PIPELINES_NS"
fi

banner "4. Guarded without editing the pipeline: the same five of promote-unguarded, created Pending with tekton-mutex.dev/key: $ENV_NS"
echo "   The lock queues each whole PipelineRun before it starts, and starts one at a time; newer ones supersede older waiting ones."
guarded_rounds pending promote-unguarded pending
pending_intact=$INTACT pending_summary=("${SUMMARY[@]}")
echo
bold "tkn pipelinerun list -n $PIPELINES_NS   (the queued round: superseded ones Cancelled, never started)"
"$TKN" pipelinerun list -n "$PIPELINES_NS" --label demo-scenario=pending

banner "5. Guarded as a Trigger starts it: the same five of promote-unguarded, no Pending, no annotation"
echo "   A Mutex's selector takes them (label demo-scenario=selected, Pipeline promote-unguarded), and the"
echo "   admission policy (config/admission/queue-at-create.yaml) makes each Pending as the API server creates it."
guarded_rounds selected promote-unguarded selected
selected_intact=$INTACT selected_summary=("${SUMMARY[@]}")
echo
bold "tkn pipelinerun list -n $PIPELINES_NS   (the selected round: created by a producer that knows nothing of the lock)"
"$TKN" pipelinerun list -n "$PIPELINES_NS" --label demo-scenario=selected

"$here/picture.sh" render "$PICTURE_DIR/timeline.json" "$PICTURE_DIR/timeline.svg"

# ------------------------------------------------------------------ side by side

banner "Summary: five promotions of $ENV_NS within one second, race window ${WINDOW}s"
for (( r = 0; r < ROUNDS; r++ )); do
  printf '  round %d   unguarded: %-52s | guarded: %-48s | pending: %-48s | selected: %s\n' "$(( r + 1 ))" \
    "${unguarded_summary[$r]}" "${guarded_summary[$r]}" "${pending_summary[$r]}" "${selected_summary[$r]}"
done
echo
echo "  unguarded: the environment was wiped out in $wiped of $ROUNDS round(s) (damaged in $damaged of $ROUNDS)"
echo "  guarded:   the environment was left intact at the newest version in $intact of $ROUNDS round(s)"
echo "  pending:   (the unguarded pipeline, queued by annotations) intact at the newest version in $pending_intact of $ROUNDS round(s)"
echo "  selected:  (the unguarded pipeline as a Trigger starts it, taken by a selector) intact at the newest version in $selected_intact of $ROUNDS round(s)"
echo "  picture:   $PICTURE_DIR/timeline.svg (round 1 of each, on one time axis)"
if (( intact == ROUNDS && pending_intact == ROUNDS && selected_intact == ROUNDS )); then
  bold "  OK: with the Mutex, the promotions ran one at a time and the newest version won."
  exit 0
fi
bold "  FAILED: a guarded, pending or selected round did not leave $ENV_NS intact at the newest version (controller log: $CONTROLLER_LOG)"
exit 1
