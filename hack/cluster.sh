#!/usr/bin/env bash
# The local control plane: etcd, kube-apiserver, kube-controller-manager, the Tekton Pipelines
# controller and the pod-runner (a kubelet stand-in that runs TaskRun steps on this host),
# all on 127.0.0.1. With TEKTON_MUTEX_KUBELET=real, a real kubelet instead of the pod-runner:
# containerd + runc, the kubelet and kube-scheduler, and a local registry (hack/kubelet.sh).
#
#   hack/cluster.sh up     build what is missing, start everything, prove it with a PipelineRun
#   hack/cluster.sh down   stop exactly what `up` started (by pid) and remove the state
#   hack/cluster.sh env    print `export KUBECONFIG=...` and a PATH with the built kubectl, tkn and tkn-mutex
#   hack/cluster.sh logs   say where each component logs
#
# State lives in .cluster/ (gitignored): kubeconfig, logs/, pids/, pki/, etcd/, pods/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"
# shellcheck source=hack/kubelet.sh
source "$here/kubelet.sh"

# The lane of a cluster that is up (or was left behind) is the one it was started with, whatever
# TEKTON_MUTEX_KUBELET says now, so that `down` stops what `up` started.
if [[ -f $CLUSTER_DIR/lane ]]; then LANE=$(<"$CLUSTER_DIR/lane")
elif real_kubelet; then LANE=real
else LANE=pod-runner
fi
REQUESTED_LANE=pod-runner
real_kubelet && REQUESTED_LANE=real
set_components() {
  if [[ $LANE == real ]]; then
    COMPONENTS=(etcd kube-apiserver kube-controller-manager registry image-proxy tekton-controller step-rbac containerd kubelet step-logs kube-scheduler) # start order
  else
    COMPONENTS=(etcd kube-apiserver kube-controller-manager tekton-controller pod-runner) # start order
  fi
}
set_components
LOGS=$CLUSTER_DIR/logs
PIDS=$CLUSTER_DIR/pids
KUBECONFIG_FILE=$CLUSTER_DIR/kubeconfig
TEKTON_NS=tekton-pipelines
SMOKE_NS=tekton-mutex-smoke
# The kube-controller-manager controllers that need neither a kubelet nor a cloud: garbage
# collection (owner references), namespace deletion, ServiceAccounts and their tokens, the
# workload controllers (they only create objects), endpoints and quotas. Off: node lifecycle,
# node IPAM, taint eviction, pod GC (it force-deletes terminating pods that no node owns),
# volumes, daemonsets (they need nodes), HPA (needs metrics), CSR signing and cloud controllers.
KCM_CONTROLLERS=garbage-collector-controller,namespace-controller,serviceaccount-controller
KCM_CONTROLLERS+=,serviceaccount-token-controller,legacy-serviceaccount-token-cleaner-controller
KCM_CONTROLLERS+=,root-ca-certificate-publisher-controller,clusterrole-aggregation-controller
KCM_CONTROLLERS+=,deployment-controller,replicaset-controller,replicationcontroller-controller
KCM_CONTROLLERS+=,statefulset-controller,job-controller,cronjob-controller,ttl-after-finished-controller
KCM_CONTROLLERS+=,disruption-controller,resourcequota-controller,endpoints-controller
KCM_CONTROLLERS+=,endpointslice-controller,endpointslice-mirroring-controller
# With a real kubelet: the node lifecycle controller takes the not-ready taint off the node the
# kubelet registers with once it reports Ready (without it, nothing schedules). PersistentVolumeClaims
# work too: the binder provisions hostPath volumes (the controller-manager's test provisioner, under
# /tmp/hostpath_pv) for the default StorageClass, and the protection controllers let claims and
# volumes be deleted cleanly.
KCM_REAL_CONTROLLERS=,node-lifecycle-controller
KCM_REAL_CONTROLLERS+=,persistentvolume-binder-controller,persistentvolume-protection-controller
KCM_REAL_CONTROLLERS+=,persistentvolumeclaim-protection-controller
POD_RUNNER=$REPO_ROOT/target/debug/pod-runner

usage() { sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------- process bookkeeping

# pid_of NAME: the recorded pid of a component, if the process is still ours and alive.
# A pid counts as ours only if its command line mentions this cluster's directory, so a
# recycled pid of an unrelated process is never touched.
pid_of() {
  local f=$PIDS/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [[ -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$CLUSTER_DIR" || return 1
  echo "$pid"
}

alive() { pid_of "$1" >/dev/null; }

# not_alive PID: gone, or a zombie waiting for whoever adopted it to reap it.
not_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  [[ ${stat##*) } == Z* ]]
}

# stop_component NAME: TERM, wait (bounded), then KILL.
stop_component() {
  local name=$1 pid
  pid=$(pid_of "$name") || { rm -f "$PIDS/$name.pid"; return 0; }
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local t0=$SECONDS
  if ! wait_for "$name to exit" 20 not_alive "$pid"; then
    log "$name did not exit on TERM; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for "$name to die" 10 not_alive "$pid" || true
  fi
  log "stopped $name in $(( SECONDS - t0 ))s"
  rm -f "$PIDS/$name.pid"
}

# leftover_pids: step processes still running in this cluster's pod directories (each step
# runs in <pods>/<ns>/<pod>/root), e.g. when the pod-runner had to be killed.
leftover_pids() {
  local d pid cwd
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    cwd=$(readlink "$d/cwd" 2>/dev/null) || continue
    [[ $cwd == "$CLUSTER_DIR/pods/"* ]] && echo "$pid"
  done
  return 0
}

no_leftovers() { [[ -z $(leftover_pids) ]]; }

# sweep_leftovers: TERM, wait (bounded), then KILL whatever leftover_pids finds.
sweep_leftovers() {
  local pids
  pids=$(leftover_pids)
  [[ -n $pids ]] || return 0
  log "stopping leftover processes of $CLUSTER_DIR: $(echo "$pids" | tr '\n' ' ')"
  # shellcheck disable=SC2086 # one pid per word
  kill -TERM $pids 2>/dev/null || true
  if ! wait_for "leftover processes to exit" 10 no_leftovers; then
    pids=$(leftover_pids)
    # shellcheck disable=SC2086
    [[ -z $pids ]] || kill -KILL $pids 2>/dev/null || true
  fi
}

# stop_all: in reverse start order (the pod-runner stops the steps it runs; the
# controllers need the apiserver, the apiserver needs etcd, to shut down cleanly), then
# whatever is left of this cluster.
stop_all() {
  local i
  # The hostPath volumes the controller-manager provisioned (real-kubelet lane), removed at the end.
  if [[ $LANE == real ]] && api_ready; then rk_note_volumes; fi
  for (( i=${#COMPONENTS[@]}-1; i>=0; i-- )); do
    # The kubelet leaves its containers running when it stops: kill them while containerd is up.
    [[ ${COMPONENTS[$i]} == containerd ]] && rk_stop_pods
    stop_component "${COMPONENTS[$i]}"
  done
  sweep_leftovers
  if [[ $LANE == real ]]; then rk_sweep; fi
}

# fail_component NAME WHY: stop everything started so far, show the component's log tail, exit.
fail_component() {
  local name=$1 why=$2
  {
    printf '\nerror: %s failed to start: %s\n' "$name" "$why"
    printf -- '--- last 40 lines of %s ---\n' "$LOGS/$name.log"
    tail -n 40 "$LOGS/$name.log" 2>/dev/null || echo "(no log)"
    printf -- '---\n'
  } >&2
  stop_all
  die "$name failed to start; the logs stay in $LOGS (the next 'up' starts afresh)"
}

# start NAME CMD...: start a component in its own session, logging to logs/NAME.log.
start() {
  local name=$1; shift
  log "starting $name"
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDS/$name.pid"
}

# healthy_or_fail NAME DESC TIMEOUT CMD...: wait for a condition while the component is alive.
healthy_or_fail() {
  local name=$1 desc=$2 timeout=$3; shift 3
  local deadline=$(( $(date +%s) + timeout ))
  # Check the pid itself, not pid_of: right after the fork, before exec, the
  # child's command line is still this script's and would not match.
  local pid
  pid=$(<"$PIDS/$name.pid")
  until "$@" >/dev/null 2>&1; do
    not_alive "$pid" && fail_component "$name" "the process exited"
    (( $(date +%s) < deadline )) || fail_component "$name" "timed out after ${timeout}s waiting for $desc"
    sleep 0.2 # poll interval of a bounded condition wait, not synchronization
  done
}

# ---------------------------------------------------------------- helpers

# free_ports N: N distinct free TCP ports on 127.0.0.1 (held open together while chosen).
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
}

kc() { "$(component_bin kubectl)" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

api_ready() {
  curl -sf --max-time 2 --cacert "$CLUSTER_DIR/pki/ca.crt" \
    -H "Authorization: Bearer $(<"$CLUSTER_DIR/pki/admin.token")" \
    "https://127.0.0.1:$(<"$CLUSTER_DIR/apiserver.port")/readyz" >/dev/null
}

tekton_config_dir() {
  local dir
  # The binaries may be cached while Go's module cache is not (cleaned, or a new GOMODCACHE):
  # fetch the module (a no-op when present) so its config/ is on disk.
  dir=$(cd "$here/tools/tekton" && GOFLAGS=-mod=mod GOTOOLCHAIN=local \
    go mod download github.com/tektoncd/pipeline >&2 &&
    GOFLAGS=-mod=mod GOTOOLCHAIN=local go list -m -f '{{.Dir}}' github.com/tektoncd/pipeline) || return 1
  echo "$dir/config"
}

# strip_conversion FILE: a CRD without its conversion webhook (v1 is the storage version and the
# only one we use, so no conversion is needed and no webhook has to run).
strip_conversion() {
  awk '
    /^---/ { skip = 0 }
    /^  conversion:/ { skip = 1; next }
    skip && /^  [^ ]/ { skip = 0 }
    skip && /^[^ ]/ { skip = 0 }
    !skip
  ' "$1"
}

# unrequire_step_names: a CRD whose Step schema no longer requires `name`. Tekton's admission webhook
# (not run here) defaults an unnamed step's name before the schema is checked; without it, a Task
# with an unnamed step (one of Tekton's examples) is refused, though the controller names such
# steps itself (step-unnamed-<i>). Real-kubelet lane only, so the pod-runner lane stays as it was.
unrequire_step_names() {
  awk '
    /description: Step runs a subcomponent of a Task/ { step = 1 }
    step && /^ *required:$/ {
      req = $0
      if ((getline nxt) > 0 && nxt ~ /^ *- name$/) { step = 0; next }
      print req; print nxt; step = 0; next
    }
    { print }
  '
}

is_up() {
  [[ -f $CLUSTER_DIR/ready ]] || return 1
  local c
  for c in "${COMPONENTS[@]}"; do alive "$c" || return 1; done
  api_ready
}

# ---------------------------------------------------------------- up

# sign_cert NAME SUBJECT EXTENSIONS: pki/NAME.{key,crt}, signed by the cluster CA.
sign_cert() {
  local pki=$CLUSTER_DIR/pki
  openssl req -new -nodes -newkey rsa:2048 -keyout "$pki/$1.key" -out "$pki/$1.csr" \
    -subj "$2" 2>/dev/null
  printf '%b\n' "$3" >"$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -out "$pki/$1.crt" -days 30 -extfile "$pki/$1.ext" 2>/dev/null
}

write_pki() {
  local pki=$CLUSTER_DIR/pki
  mkdir -p "$pki"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl req -x509 -new -nodes -newkey rsa:2048 -keyout "$pki/ca.key" -out "$pki/ca.crt" \
    -days 30 -subj "/CN=tekton-mutex-local-ca" 2>/dev/null
  openssl req -new -nodes -newkey rsa:2048 -keyout "$pki/serving.key" -out "$pki/serving.csr" \
    -subj "/CN=kube-apiserver" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$pki/ext.cnf"
  openssl x509 -req -in "$pki/serving.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -out "$pki/serving.crt" -days 30 -extfile "$pki/ext.cnf" 2>/dev/null
  # The pod-runner's kubelet endpoint, and the client certificate the apiserver shows it.
  sign_cert kubelet "/CN=pod-runner" \
    'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth'
  sign_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" \
    'extendedKeyUsage=clientAuth'
  od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$pki/admin.token"
  printf '%s,admin,admin,"system:masters"\n' "$(<"$pki/admin.token")" >"$pki/tokens.csv"
}

write_kubeconfig() {
  cat >"$KUBECONFIG_FILE" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tekton-mutex-local
  cluster:
    server: https://127.0.0.1:$1
    certificate-authority: $CLUSTER_DIR/pki/ca.crt
users:
- name: admin
  user:
    token: $(<"$CLUSTER_DIR/pki/admin.token")
contexts:
- name: tekton-mutex-local
  context: {cluster: tekton-mutex-local, user: admin}
current-context: tekton-mutex-local
EOF
  chmod 600 "$KUBECONFIG_FILE"
}

install_tekton() {
  local cfg crd
  cfg=$(tekton_config_dir)
  [[ -d $cfg/300-crds ]] || die "Tekton's config not found at $cfg (is the tekton module downloaded?)"
  log "installing Tekton namespace, CRDs and config from $cfg"
  kc apply -f "$cfg/100-namespace" >/dev/null
  for crd in "$cfg"/300-crds/*.yaml; do
    if [[ $LANE == real ]]; then
      strip_conversion "$crd" | unrequire_step_names | kc apply --server-side -f - >/dev/null
    else
      strip_conversion "$crd" | kc apply --server-side -f - >/dev/null
    fi
  done
  kc wait --for=condition=Established crd --all --timeout=60s >/dev/null
  local f
  # Tekton's aggregated roles too, as its release installs them: the built-in `edit` role then
  # covers PipelineRuns, as on a real cluster (tests of what a tenant with `edit` can do).
  for f in "$cfg"/config-*.yaml "$cfg"/clusterrole-aggregate-*.yaml; do
    kc apply -f "$f" >/dev/null
  done
  if [[ $LANE == real ]]; then
    kc apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: hostpath
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
    # Pods use the host's network (loopback only; there is no pod network here) and reach the
    # apiserver at 127.0.0.1 rather than through the `kubernetes` Service (no kube-proxy).
    kc -n "$TEKTON_NS" patch configmap config-defaults --type merge --patch-file /dev/stdin >/dev/null <<EOF
data:
  default-pod-template: |
    hostNetwork: true
    env:
    - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
    - {name: KUBERNETES_SERVICE_PORT, value: "$(<"$CLUSTER_DIR/apiserver.port")"}
EOF
  fi
  # No metrics exporters, no sidecar readiness handshake (no kubelet), no affinity assistant
  # (no scheduler), no credential init (nothing to pull).
  kc -n "$TEKTON_NS" patch configmap config-observability --type merge \
    -p '{"data":{"metrics-protocol":"none","tracing-protocol":"none","runtime-profiling":"disabled"}}' >/dev/null
  kc -n "$TEKTON_NS" patch configmap feature-flags --type merge -p '{"data":{
      "coschedule":"disabled",
      "disable-creds-init":"true",
      "await-sidecar-readiness":"false",
      "running-in-environment-with-injected-sidecars":"false",
      "enable-api-fields":"beta"}}' >/dev/null
}

# ensure_namespace NS: the namespace, once the controller-manager gave it its `default`
# ServiceAccount (Tekton runs pods as it).
ensure_namespace() {
  kc create namespace "$1" --dry-run=client -o yaml | kc apply -f - >/dev/null
  wait_for "the default ServiceAccount of namespace $1" 60 kc -n "$1" get serviceaccount default
}

pipelinerun_state() {
  kc -n "$SMOKE_NS" get pipelinerun "$1" \
    -o jsonpath='{.status.conditions[?(@.type=="Succeeded")].status}' 2>/dev/null
}

smoke_done() { [[ $(pipelinerun_state "$1") =~ ^(True|False)$ ]]; }

smoke_test() {
  local name
  ensure_namespace "$SMOKE_NS"
  name=$(kc -n "$SMOKE_NS" create -o name -f - <<'EOF'
apiVersion: tekton.dev/v1
kind: PipelineRun
metadata:
  generateName: smoke-
spec:
  pipelineSpec:
    tasks:
    - name: hello
      taskSpec:
        steps:
        - name: hello
          image: busybox
          script: |
            echo "hello from the local control plane"
            kubectl version >/dev/null
EOF
  )
  name=${name#*/}
  log "readiness check: PipelineRun $SMOKE_NS/$name"
  local deadline=$(( $(date +%s) + 120 ))
  until smoke_done "$name"; do
    local c
    for c in "${COMPONENTS[@]:2}"; do
      alive "$c" || fail_component "$c" "the process exited during the readiness PipelineRun"
    done
    (( $(date +%s) < deadline )) || break
    sleep 0.2 # poll interval of a bounded condition wait, not synchronization
  done
  if [[ $(pipelinerun_state "$name") != True ]]; then
    {
      echo "error: the readiness PipelineRun $SMOKE_NS/$name did not succeed:"
      kc -n "$SMOKE_NS" get pipelinerun "$name" -o jsonpath='{.status.conditions}' 2>&1; echo
      echo "--- last 20 lines of $LOGS/tekton-controller.log ---"; tail -n 20 "$LOGS/tekton-controller.log"
      if [[ $LANE == real ]]; then
        kc -n "$SMOKE_NS" get pods -o wide 2>&1
        kc -n "$SMOKE_NS" describe pods 2>&1 | tail -n 30
        echo "--- last 20 lines of $LOGS/kubelet.log ---"; tail -n 20 "$LOGS/kubelet.log"
      else
        echo "--- last 20 lines of $LOGS/pod-runner.log ---"; tail -n 20 "$LOGS/pod-runner.log"
      fi
    } >&2
    stop_all
    die "the control plane started but could not run a PipelineRun"
  fi
}

cmd_up() {
  require_tool go "Go 1.26 or newer (https://go.dev/dl/)"
  require_tool cargo "Rust 1.89 or newer (https://rustup.rs)"
  require_tool openssl "openssl (apt-get install openssl)"
  require_tool python3 "python3 (apt-get install python3)"
  require_tool curl "curl (apt-get install curl)"
  require_tool setsid "util-linux (apt-get install util-linux)"

  if [[ $LANE == "$REQUESTED_LANE" ]] && is_up; then
    log "cluster is already up ($KUBECONFIG_FILE); nothing to do"
    return 0
  fi
  if [[ -e $CLUSTER_DIR ]]; then
    if [[ $LANE != "$REQUESTED_LANE" ]]; then
      log "the cluster in $CLUSTER_DIR runs the $LANE lane, $REQUESTED_LANE was asked for: taking it down"
    else
      log "found stale state in $CLUSTER_DIR (a previous run was killed or failed): cleaning up"
    fi
    stop_all
    rm -rf "$CLUSTER_DIR"
  fi
  LANE=$REQUESTED_LANE
  set_components
  if [[ $LANE == real ]]; then
    rk_check_host
    rk_install_packages
  fi
  local t0
  t0=$(date +%s)
  if [[ -z ${TEKTON_MUTEX_SKIP_BUILD:-} ]]; then
    "$here/build.sh"
  fi
  # pod-runner stands in for the kubelet; tkn-mutex is the `tkn mutex` plugin (on PATH via `env`).
  # (The real-kubelet lane builds the pod-runner too: the same cargo command as demo.sh and the
  # default lane, so that no feature set differs and nothing is rebuilt.)
  log "building pod-runner and tkn-mutex (cargo build -p pod-runner -p tekton-mutex --bin pod-runner --bin tkn-mutex)"
  (cd "$REPO_ROOT" && cargo build --quiet -p pod-runner -p tekton-mutex --bin pod-runner --bin tkn-mutex) ||
    die "building testbed/pod-runner and tkn-mutex failed"

  mkdir -p "$LOGS" "$PIDS" "$CLUSTER_DIR/etcd" "$CLUSTER_DIR/pods"
  echo "$LANE" >"$CLUSTER_DIR/lane"
  local ports etcd_port peer_port api_port kcm_port probes_port profiling_port kubelet_port
  local registry_port kubelet_healthz_port scheduler_port proxy_port
  ports=$(free_ports 11)
  read -r etcd_port peer_port api_port kcm_port probes_port profiling_port kubelet_port \
    registry_port kubelet_healthz_port scheduler_port proxy_port <<<"$ports"
  echo "$api_port" >"$CLUSTER_DIR/apiserver.port"
  write_pki
  # The pod-runner lane runs pods without ServiceAccount tokens; a real kubelet mounts them.
  local admission=(--disable-admission-plugins ServiceAccount) kcm_controllers=$KCM_CONTROLLERS kcm_extra=()
  if [[ $LANE == real ]]; then
    admission=()
    kcm_controllers+=$KCM_REAL_CONTROLLERS
    kcm_extra=(--enable-hostpath-provisioner)
  fi

  start etcd "$(component_bin etcd)" \
    --name local --data-dir "$CLUSTER_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "local=http://127.0.0.1:$peer_port" \
    --unsafe-no-fsync=true --log-level warn
  healthy_or_fail etcd "its /health endpoint" 30 curl -sf --max-time 2 "http://127.0.0.1:$etcd_port/health"

  start kube-apiserver "$(component_bin kube-apiserver)" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --secure-port "$api_port" \
    --cert-dir "$CLUSTER_DIR/pki" \
    --tls-cert-file "$CLUSTER_DIR/pki/serving.crt" --tls-private-key-file "$CLUSTER_DIR/pki/serving.key" \
    --client-ca-file "$CLUSTER_DIR/pki/ca.crt" \
    --token-auth-file "$CLUSTER_DIR/pki/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-issuer "https://127.0.0.1:$api_port/" \
    --service-account-key-file "$CLUSTER_DIR/pki/sa.key" \
    --service-account-signing-key-file "$CLUSTER_DIR/pki/sa.key" \
    --service-cluster-ip-range 10.0.0.0/24 \
    --kubelet-client-certificate "$CLUSTER_DIR/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$CLUSTER_DIR/pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$CLUSTER_DIR/pki/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --allow-privileged=true \
    ${admission[@]+"${admission[@]}"} \
    --feature-gates MutatingAdmissionPolicy=true \
    --runtime-config admissionregistration.k8s.io/v1beta1=true \
    --profiling=false
  healthy_or_fail kube-apiserver "/readyz" 90 api_ready
  write_kubeconfig "$api_port"

  install_tekton

  # After Tekton's CRDs, so that the garbage collector knows them from its first discovery.
  # Signs ServiceAccount tokens with the apiserver's key; serves its health on loopback with
  # the apiserver's serving certificate (IP SAN 127.0.0.1).
  start kube-controller-manager "$(component_bin kube-controller-manager)" \
    --kubeconfig "$KUBECONFIG_FILE" \
    --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --authentication-skip-lookup \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" \
    --tls-cert-file "$CLUSTER_DIR/pki/serving.crt" --tls-private-key-file "$CLUSTER_DIR/pki/serving.key" \
    --service-account-private-key-file "$CLUSTER_DIR/pki/sa.key" \
    --root-ca-file "$CLUSTER_DIR/pki/ca.crt" \
    --controllers "$kcm_controllers" ${kcm_extra[@]+"${kcm_extra[@]}"} \
    --leader-elect=false --profiling=false
  healthy_or_fail kube-controller-manager "/healthz" 60 \
    curl -sf --max-time 2 --cacert "$CLUSTER_DIR/pki/ca.crt" "https://127.0.0.1:$kcm_port/healthz"

  local images=(-entrypoint-image local/entrypoint -nop-image local/nop
    -sidecarlogresults-image local/sidecarlogresults -workingdirinit-image local/workingdirinit
    -shell-image local/shell -shell-image-win local/shell-win)
  local controller_env=()
  if [[ $LANE == real ]]; then
    # Tekton's helper images and the step base image, built here, by digest in the local registry.
    rk_start_registry_and_images "$registry_port"
    rk_start_image_proxy "$proxy_port"
    read -r -a controller_env <<<"$(rk_controller_env)"
    # shellcheck disable=SC1091 # written by rk_build_images
    source "$CLUSTER_DIR/images.env"
    images=(-entrypoint-image "$TEKTON_ENTRYPOINT_IMAGE" -nop-image "$TEKTON_NOP_IMAGE"
      -sidecarlogresults-image "$TEKTON_SIDECARLOGRESULTS_IMAGE" -workingdirinit-image "$TEKTON_WORKINGDIRINIT_IMAGE"
      -shell-image "$BASE_IMAGE" -shell-image-win local/shell-win)
  fi
  start tekton-controller env \
    SYSTEM_NAMESPACE="$TEKTON_NS" METRICS_DOMAIN=tekton.dev/pipeline \
    PROBES_PORT="$probes_port" PROFILING_PORT="$profiling_port" \
    CONFIG_LOGGING_NAME=config-logging CONFIG_OBSERVABILITY_NAME=config-observability \
    CONFIG_LEADERELECTION_NAME=config-leader-election-controller \
    CONFIG_DEFAULTS_NAME=config-defaults CONFIG_FEATURE_FLAGS_NAME=feature-flags CONFIG_SPIRE=config-spire \
    KUBERNETES_MIN_VERSION=v1.28.0 ${controller_env[@]+"${controller_env[@]}"} \
    "$(component_bin tekton-controller)" \
    -kubeconfig "$KUBECONFIG_FILE" -disable-ha "${images[@]}"
  healthy_or_fail tekton-controller "its /health probe" 60 \
    curl -sf --max-time 2 "http://127.0.0.1:$probes_port/health"

  if [[ $LANE == real ]]; then
    rk_start_step_rbac
    rk_start_containerd
    rk_start_kubelet "$kubelet_port" "$kubelet_healthz_port"
    rk_start_step_logs
    rk_start_scheduler "$scheduler_port"
  else

  # Node pod-runner, whose kubelet endpoint serves the step logs (kubectl logs, tkn logs).
  start pod-runner "$POD_RUNNER" \
    --kubeconfig "$KUBECONFIG_FILE" --work-dir "$CLUSTER_DIR/pods" \
    --node-name pod-runner --kubelet-port "$kubelet_port" \
    --tls-cert "$CLUSTER_DIR/pki/kubelet.crt" --tls-key "$CLUSTER_DIR/pki/kubelet.key" \
    --client-ca "$CLUSTER_DIR/pki/ca.crt" \
    --path-prefix "$(dirname "$(component_bin kubectl)")" --path-prefix "$(dirname "$(component_bin tkn)")"
  healthy_or_fail pod-runner "its watch to start" 30 grep -q "watching TaskRun pods" "$LOGS/pod-runner.log"
  healthy_or_fail pod-runner "its kubelet endpoint" 30 \
    curl -sf --max-time 2 --cacert "$CLUSTER_DIR/pki/ca.crt" \
    --cert "$CLUSTER_DIR/pki/apiserver-kubelet-client.crt" --key "$CLUSTER_DIR/pki/apiserver-kubelet-client.key" \
    "https://127.0.0.1:$kubelet_port/healthz"
  fi

  smoke_test
  date +%s >"$CLUSTER_DIR/ready"
  log "cluster is up in $(( $(date +%s) - t0 ))s; use it with: eval \"\$(hack/cluster.sh env)\""
}

cmd_down() {
  if [[ ! -e $CLUSTER_DIR ]]; then
    log "no cluster state in $CLUSTER_DIR; nothing to stop"
    return 0
  fi
  stop_all
  rm -rf "$CLUSTER_DIR"
  log "cluster is down; $CLUSTER_DIR removed"
}

cmd_env() {
  [[ -f $KUBECONFIG_FILE ]] || log "warning: no cluster is up (run hack/cluster.sh up)"
  printf 'export KUBECONFIG=%q\n' "$KUBECONFIG_FILE"
  # shellcheck disable=SC2016 # $PATH is for the shell that evals this line
  # The built tkn-mutex too: tkn finds `tkn mutex` plugins on PATH.
  printf 'export PATH=%q:%q:%q:"$PATH"\n' "$(dirname "$(component_bin kubectl)")" "$(dirname "$(component_bin tkn)")" \
    "${CARGO_TARGET_DIR:-$REPO_ROOT/target}/debug"
}

cmd_logs() {
  local c state
  for c in "${COMPONENTS[@]}"; do
    if alive "$c"; then state="running, pid $(pid_of "$c")"; else state="not running"; fi
    printf '%-18s %s (%s)\n' "$c" "$LOGS/$c.log" "$state"
  done
  if [[ $LANE == real ]]; then
    printf '%-18s %s\n' "step output" "kubectl logs; $CLUSTER_DIR/pod-logs/<namespace>_<pod>_<uid>/<container>/ (the kubelet's)"
    printf '%-18s %s\n' "" "$CLUSTER_DIR/pods/<namespace>/<pod>/<container>.log (copied by step-logs)"
  else
    printf '%-18s %s\n' "step output" "$CLUSTER_DIR/pods/<namespace>/<pod>/<step>.log"
  fi
}

case "${1:-}" in
  up) lock_cluster; cmd_up ;;
  down) lock_cluster; cmd_down ;;
  env) cmd_env ;;
  logs) cmd_logs ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
