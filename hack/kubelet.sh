# The real-kubelet lane of the local control plane (TEKTON_MUTEX_KUBELET=real). Sourced by
# hack/cluster.sh after hack/lib.sh, never run. Instead of testbed/pod-runner it runs, all on
# 127.0.0.1 and under this cluster's directory:
#   registry        `crane registry serve`: the images built here (Tekton's helper images, the step
#                   base image, pause); nothing is pulled from the internet
#   containerd      Debian's containerd 1.6 + runc 1.1, cgroupfs driver (this VM mounts cgroup v1),
#                   with registry mirrors that send docker.io, mirror.gcr.io, ghcr.io, gcr.io, quay.io,
#                   registry.k8s.io and registry.invalid to the local registry
#   kubelet         built from k8s.io/kubernetes at the apiserver's version (node "127.0.0.1")
#   kube-scheduler  the same module and version: binds pods to the node through the real path
#   image-proxy     an HTTPS proxy for the Tekton controller only: its image-entrypoint lookups of
#                   docker.io & co. are answered by the local registry (hack/image-proxy.py)
#   step-rbac       makes each namespace's `default` ServiceAccount (Tekton's pods') cluster-admin,
#                   as steps are on the pod-runner (hack/step-rbac.py)
#   step-logs       copies each container's output from the kubelet's log files to where the
#                   pod-runner keeps it, <cluster>/pods/<ns>/<pod>/<container>.log (hack/step-logs.py)
# docs/kubelets.md explains what this lane proves, and what cgroup v1 needed.
# shellcheck shell=bash

RK_CONTAINERD=$CLUSTER_DIR/containerd
RK_KUBELET=$CLUSTER_DIR/kubelet
RK_IMAGES=$CACHE_DIR/images # layer tarballs and .deb files, kept between clusters
# The registries whose names our tests, examples and Tekton's examples use; containerd sends them
# all to the local registry (a name we did not push fails to pull: nothing leaves the machine).
RK_MIRRORED=(docker.io mirror.gcr.io ghcr.io gcr.io quay.io registry.k8s.io registry.invalid)
# Names the step base image is pushed under (repository paths in the local registry: docker.io's
# short names live under library/). One image serves them all: bash, busybox as sh and the rest of
# the applets, GNU coreutils, and the built kubectl.
RK_BASE_NAMES=(
  library/busybox:latest library/alpine:latest library/ubuntu:latest library/bash:latest
  alpine/k8s:1.31.0
  busybox:latest alpine:latest ubuntu:latest bash:latest
  sh:latest kubectl:latest
)
# Debian packages the step base image is made of (dpkg-deb -x, no maintainer scripts).
RK_BASE_DEBS=(base-files bash coreutils busybox-static libc6 libgcc-s1 gcc-12-base libtinfo6
  libacl1 libattr1 libselinux1 libpcre2-8-0 libgmp10)
RK_BASE_RECIPE=2 # bump when rk_base_layer changes what it puts in the image
# Node.js for the one Tekton example that runs `node` (mirror.gcr.io/node:lts-alpine3.20), on top of
# the base image: Debian 12's nodejs 18 and its libraries.
RK_NODE_DEBS=(nodejs libnode108 libuv1 libicu72 libssl3 libstdc++6 zlib1g libbrotli1 libc-ares2
  libnghttp2-14 node-acorn node-xtend node-cjs-module-lexer node-undici node-busboy)
RK_NODE_NAMES=(node:lts-alpine3.20)

rk_registry() { echo "127.0.0.1:$(<"$CLUSTER_DIR/registry.port")"; }
# shellcheck disable=SC2154 # here: the sourcing script's directory (hack/cluster.sh sets it)
crane_bin() { "$here/crane.sh" --path; }
# crane, its progress lines (stderr) in logs/images.log.
rk_crane() { "$(crane_bin)" "$@" 2>>"$CLUSTER_DIR/logs/images.log"; }

# rk_install_packages: containerd, runc, the CNI loopback plugin and busybox from Debian's
# packages, installed once (like the other tools this script needs).
rk_install_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  command -v ctr >/dev/null || missing+=(containerd)
  [[ -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
  (( ${#missing[@]} == 0 )) && return 0
  require_tool apt-get "a Debian-based system (containerd and runc come from Debian 12's packages)"
  (( EUID == 0 )) || die "the real-kubelet lane runs containerd and the kubelet as root; run as root"
  log "real kubelet: installing ${missing[*]} (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null ||
    { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null; } ||
    die "apt-get install ${missing[*]} failed"
  # Debian's postinst may start a system containerd; ours runs from this cluster's directory
  # with its own socket and state and does not need it.
}

# rk_check_host: what the kubelet needs from the kernel here.
rk_check_host() {
  (( EUID == 0 )) || die "the real-kubelet lane needs root (containerd, runc, the kubelet)"
  grep -qw overlay /proc/filesystems || modprobe overlay 2>/dev/null ||
    die "overlayfs is not available (containerd's snapshotter needs it)"
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] ||
    die "no cgroup hierarchy with a memory controller under /sys/fs/cgroup"
}

# ---------------------------------------------------------------- images

# rk_debs DIR PACKAGE...: the packages' .deb files in DIR (apt-get download, cached).
rk_debs() {
  local dir=$1; shift
  mkdir -p "$dir"
  local p missing=()
  for p in "$@"; do
    compgen -G "$dir/${p}_*.deb" >/dev/null || missing+=("$p")
  done
  (( ${#missing[@]} == 0 )) && return 0
  log "real kubelet: downloading Debian packages for the step images: ${missing[*]}"
  # The newest version a configured archive has (an installed package may come from elsewhere).
  local pinned=() v
  for p in "${missing[@]}"; do
    v=$(apt-cache madison "$p" | awk -F'|' 'NR == 1 {gsub(/ /, "", $2); print $2}')
    [[ -n $v ]] || { apt-get update -qq; v=$(apt-cache madison "$p" | awk -F'|' 'NR == 1 {gsub(/ /, "", $2); print $2}'); }
    [[ -n $v ]] || die "no Debian archive offers the package $p"
    pinned+=("$p=$v")
  done
  (cd "$dir" && apt-get download "${pinned[@]}" 2>&1 >/dev/null | { grep -v 'unsandboxed as root' >&2 || true; }) || die "apt-get download ${pinned[*]} failed"
}

# rk_unpack_debs ROOTFS DEB...: extract packages (no maintainer scripts) into a merged-/usr rootfs.
rk_unpack_debs() {
  local root=$1 deb d; shift
  mkdir -p "$root"
  for deb in "$@"; do dpkg-deb -x "$deb" "$root"; done
  for d in bin sbin lib; do
    if [[ -d $root/$d && ! -L $root/$d ]]; then
      mkdir -p "$root/usr/$d"
      cp -a "$root/$d/." "$root/usr/$d/"
      rm -rf "${root:?}/$d"
      ln -s "usr/$d" "$root/$d"
    fi
  done
}

# rk_layer ROOTFS OUT: a reproducible layer tarball (sorted, epoch mtimes, root-owned).
rk_layer() {
  tar -C "$1" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf "$2.tmp.$$" . &&
    mv -f "$2.tmp.$$" "$2"
}

# rk_base_layer: the step base image's layer, built once per package set and kubectl.
rk_base_layer() {
  local key dir rootfs out
  key=$(printf '%s\n' "$RK_BASE_RECIPE" "${RK_BASE_DEBS[@]}" "$(sha256sum "$(component_bin kubectl)")" | sha256sum | cut -c1-12)
  out=$RK_IMAGES/base-$key.tar
  [[ -f $out ]] && { echo "$out"; return 0; }
  dir=$RK_IMAGES/debs
  rk_debs "$dir" "${RK_BASE_DEBS[@]}"
  rootfs=$(mktemp -d "$RK_IMAGES/rootfs.XXXXXX")
  local debs=() p
  for p in "${RK_BASE_DEBS[@]}"; do debs+=("$(compgen -G "$dir/${p}_*.deb" | head -n1)"); done
  rk_unpack_debs "$rootfs" "${debs[@]}"
  # busybox for every applet GNU coreutils and bash do not provide. /bin/sh is bash (`[ a == b ]`
  # works, unlike in dash): busybox's sh would run its own applets before those on PATH, and its
  # `date` here has no %N, which the tests' and the chaos campaign's marks need.
  local applet target
  while read -r applet; do
    target=$applet
    case $target in bin/*|sbin/*) target=usr/$target ;; esac
    [[ -e $rootfs/$target || -L $rootfs/$target ]] && continue
    mkdir -p "$(dirname "$rootfs/$target")"
    ln -s /bin/busybox "$rootfs/$target"
  done < <("$rootfs/usr/bin/busybox" --list-full)
  ln -sf bash "$rootfs/usr/bin/sh"
  install -D -m 0755 "$(component_bin kubectl)" "$rootfs/usr/local/bin/kubectl"
  mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/root" "$rootfs/home/nonroot" "$rootfs/workspace"
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/bin/sh\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
  printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
  rk_layer "$rootfs" "$out"
  rm -rf "$rootfs"
  echo "$out"
}

# rk_node_layer: Node.js on top of the base image (one more layer).
rk_node_layer() {
  local key dir rootfs out
  key=$(printf '%s\n' "${RK_NODE_DEBS[@]}" | sha256sum | cut -c1-12)
  out=$RK_IMAGES/node-$key.tar
  [[ -f $out ]] && { echo "$out"; return 0; }
  dir=$RK_IMAGES/debs
  rk_debs "$dir" "${RK_NODE_DEBS[@]}"
  rootfs=$(mktemp -d "$RK_IMAGES/rootfs.XXXXXX")
  local debs=() p
  for p in "${RK_NODE_DEBS[@]}"; do debs+=("$(compgen -G "$dir/${p}_*.deb" | head -n1)"); done
  rk_unpack_debs "$rootfs" "${debs[@]}"
  rm -rf "$rootfs/usr/share/doc" "$rootfs/usr/share/man"
  rk_layer "$rootfs" "$out"
  rm -rf "$rootfs"
  echo "$out"
}

# rk_binary_layer BIN PATH OUT: a layer holding one static binary at PATH.
rk_binary_layer() {
  local rootfs
  rootfs=$(mktemp -d "$RK_IMAGES/rootfs.XXXXXX")
  install -D -m 0755 "$1" "$rootfs$2"
  rk_layer "$rootfs" "$3"
  rm -rf "$rootfs"
}

# rk_push_image REPO:TAG LAYER [ENTRYPOINT]: an image of LAYER on an empty base, pushed; prints
# its digest. Deterministic (same layer, same digest), so a re-push is a no-op.
rk_push_image() {
  local ref layer=$2 entry=${3:-} args=()
  ref=$(rk_registry)/$1
  rk_crane append -f "$layer" -t "$ref.build" >/dev/null ||
    die "crane append of $layer failed (see $CLUSTER_DIR/logs/images.log)"
  args=(--set-platform linux/amd64 -e PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  [[ -n $entry ]] && args+=(--entrypoint "$entry")
  rk_crane mutate "$ref.build" "${args[@]}" -t "$ref" >/dev/null || die "crane mutate of $ref failed"
  rk_crane digest "$ref"
}

# rk_build_images: build (cached) and push every image; writes images.env with the digests.
rk_build_images() {
  local reg t0 name bin layer digest base_digest node_digest
  t0=$(date +%s)
  reg=$(rk_registry)
  mkdir -p "$RK_IMAGES"
  : >"$CLUSTER_DIR/images.env"
  for name in entrypoint nop workingdirinit sidecarlogresults; do
    bin=$(component_bin "tekton-$name")
    layer=$RK_IMAGES/tekton-$name-$(sha256sum "$bin" | cut -c1-12).tar
    [[ -f $layer ]] || rk_binary_layer "$bin" "/ko-app/$name" "$layer"
    digest=$(rk_push_image "tekton/$name:local" "$layer" "/ko-app/$name")
    echo "TEKTON_${name^^}_IMAGE=$reg/tekton/$name@$digest" >>"$CLUSTER_DIR/images.env"
  done
  bin=$(component_bin pause)
  layer=$RK_IMAGES/pause-$(sha256sum "$bin" | cut -c1-12).tar
  [[ -f $layer ]] || rk_binary_layer "$bin" /pause "$layer"
  digest=$(rk_push_image tekton-mutex/pause:local "$layer" /pause)
  echo "PAUSE_IMAGE=$reg/tekton-mutex/pause@$digest" >>"$CLUSTER_DIR/images.env"

  base_digest=$(rk_push_image tekton-mutex/base:local "$(rk_base_layer)")
  echo "BASE_IMAGE=$reg/tekton-mutex/base@$base_digest" >>"$CLUSTER_DIR/images.env"
  for name in "${RK_BASE_NAMES[@]}"; do
    rk_crane copy "$reg/tekton-mutex/base@$base_digest" "$reg/$name" >/dev/null ||
      die "crane copy to $reg/$name failed"
  done
  layer=$(rk_node_layer)
  rk_crane append -b "$reg/tekton-mutex/base@$base_digest" -f "$layer" \
    -t "$reg/tekton-mutex/node:local" >/dev/null || die "crane append of the node layer failed"
  node_digest=$(rk_crane digest "$reg/tekton-mutex/node:local")
  for name in "${RK_NODE_NAMES[@]}"; do
    rk_crane copy "$reg/tekton-mutex/node@$node_digest" "$reg/$name" >/dev/null ||
      die "crane copy to $reg/$name failed"
  done
  log "real kubelet: images built and pushed to $reg in $(( $(date +%s) - t0 ))s"
}

# ---------------------------------------------------------------- containerd

rk_write_containerd_config() {
  local d=$RK_CONTAINERD reg pause
  reg=$(rk_registry)
  pause=$(sed -n 's/^PAUSE_IMAGE=//p' "$CLUSTER_DIR/images.env")
  mkdir -p "$d/root" "$d/state" "$d/cni" "$d/certs.d"
  # The CRI plugin reports the network ready once a CNI config exists. Pods here use the host's
  # network (Tekton's default pod template sets hostNetwork: true), so the only config is the
  # loopback plugin: a pod without hostNetwork gets no address and does not start.
  cat >"$d/cni/10-loopback.conflist" <<'EOF'
{"cniVersion": "1.0.0", "name": "loopback-only", "plugins": [{"type": "loopback"}]}
EOF
  local r
  for r in "${RK_MIRRORED[@]}" "$reg"; do
    mkdir -p "$d/certs.d/$r"
    cat >"$d/certs.d/$r/hosts.toml" <<EOF
# Every pull of $r goes to the local registry; nothing is fetched from the internet.
server = "http://$reg"

[host."http://$reg"]
  capabilities = ["pull", "resolve"]
EOF
  done
  cat >"$d/config.toml" <<EOF
version = 2
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$d/containerd.sock"
[ttrpc]
  address = "$d/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  enable_selinux = false
  # This VM's root lacks CAP_SYS_RESOURCE (not even in the bounding set), so no process may lower
  # its oom_score_adj: the sandbox's -998 (and a Guaranteed pod's -997) made runc's init fail with
  # "can't get final child's PID from pipe: EOF". Clamp scores to containerd's own (0) instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$d/certs.d"
EOF
}

rk_ctr() { ctr --address "$RK_CONTAINERD/containerd.sock" "$@"; }

# rk_stop_pods: kill and delete every container of this cluster's containerd (the kubelet is
# stopped first and leaves its containers running), then the shims that still run for it.
rk_stop_pods() {
  [[ -S $RK_CONTAINERD/containerd.sock ]] || return 0
  local ns id
  for ns in $(rk_ctr namespaces list -q 2>/dev/null); do
    for id in $(rk_ctr -n "$ns" tasks list -q 2>/dev/null); do
      rk_ctr -n "$ns" tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
  done
  local deadline=$(( $(date +%s) + 20 ))
  for ns in $(rk_ctr namespaces list -q 2>/dev/null); do
    for id in $(rk_ctr -n "$ns" tasks list -q 2>/dev/null); do
      until rk_ctr -n "$ns" tasks delete "$id" >/dev/null 2>&1; do
        (( $(date +%s) < deadline )) || break
        sleep 0.2 # poll interval of a bounded condition wait, not synchronization
      done
    done
  done
}

# rk_shim_pids: containerd-shim processes serving this cluster's containerd (their command line
# names its socket).
rk_shim_pids() {
  local d pid
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    { tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null | grep -q "^containerd-shim.* -address $RK_CONTAINERD/containerd.sock" &&
      echo "$pid"
  done
  return 0
}

# rk_note_volumes: remember the hostPath volumes provisioned for this cluster (the controller-
# manager's test provisioner puts them under /tmp/hostpath_pv), for rk_sweep to remove.
rk_note_volumes() {
  kc get pv -o jsonpath='{range .items[*]}{.spec.hostPath.path}{"\n"}{end}' 2>/dev/null |
    grep '^/tmp/hostpath_pv/[0-9a-f-]*$' >>"$CLUSTER_DIR/volumes" || true
}

# rk_unfirewall: the iptables chains the kubelet creates on the host (KUBE-FIREWALL in filter
# INPUT/OUTPUT, its canary and hint chains), unless another kubelet still runs on this machine.
rk_unfirewall() {
  pgrep -x kubelet >/dev/null && return 0
  local ipt table chain
  for ipt in iptables ip6tables; do
    command -v "$ipt" >/dev/null || continue
    while "$ipt" -t filter -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while "$ipt" -t filter -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    for table in filter mangle nat; do
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        "$ipt" -t "$table" -F "$chain" 2>/dev/null && "$ipt" -t "$table" -X "$chain" 2>/dev/null
      done
    done
  done
  return 0
}

# rk_sweep: what the lane leaves behind once its processes are gone: shims, log links, mounts
# (overlay rootfs, the kubelet's tmpfs volumes) under the cluster directory, hostPath volumes,
# the kubelet's iptables chains.
rk_sweep() {
  local pids
  pids=$(rk_shim_pids)
  if [[ -n $pids ]]; then
    log "stopping leftover containerd shims of $CLUSTER_DIR: $(echo "$pids" | tr '\n' ' ')"
    # shellcheck disable=SC2086 # one pid per word
    kill -KILL $pids 2>/dev/null || true
  fi
  # The kubelet links each container's log into /var/log/containers (a fixed path).
  local l
  for l in /var/log/containers/*.log; do
    [[ -L $l && $(readlink "$l") == "$CLUSTER_DIR/"* ]] && rm -f "$l"
  done
  rk_unfirewall
  local v
  if [[ -f $CLUSTER_DIR/volumes ]]; then
    while read -r v; do rm -rf "${v:?}"; done <"$CLUSTER_DIR/volumes"
  fi
  local m
  awk -v dir="$CLUSTER_DIR/" 'index($2, dir) == 1 {print $2}' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
}

# ---------------------------------------------------------------- kubelet

rk_write_kubelet_config() {
  local port=$1 healthz=$2 pki=$CLUSTER_DIR/pki
  mkdir -p "$RK_KUBELET/root" "$CLUSTER_DIR/pod-logs"
  cat >"$RK_KUBELET/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This VM mounts cgroup v1, which kubelet 1.35 refuses unless told otherwise.
failCgroupV1: false
# No systemd here: cgroupfs, as containerd's runc runtime (SystemdCgroup = false).
cgroupDriver: cgroupfs
failSwapOn: false
containerRuntimeEndpoint: unix://$RK_CONTAINERD/containerd.sock
# Loopback only: the kubelet API (logs, exec) for the apiserver, and the health endpoint.
address: 127.0.0.1
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
tlsCertFile: $pki/kubelet.crt
tlsPrivateKeyFile: $pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $pki/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $CLUSTER_DIR/pod-logs
# A test machine shared with builds: never evict for disk or memory pressure, never GC images.
evictionHard: {memory.available: "1Mi", nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 250
# Faster than the defaults, so that a pod's end is seen promptly.
nodeStatusUpdateFrequency: 10s
syncFrequency: 10s
shutdownGracePeriod: 0s
EOF
}

kubelet_untainted() {
  [[ -z $(kc get node 127.0.0.1 -o jsonpath='{.spec.taints}' 2>/dev/null) ]]
}

kubelet_ready() {
  [[ $(kc get node 127.0.0.1 -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}

# rk_start_registry_and_images PORT: the registry and the images in it. Before the Tekton
# controller, which is given the helper images' digests.
rk_start_registry_and_images() {
  local reg_port=$1
  echo "$reg_port" >"$CLUSTER_DIR/registry.port"
  # Blobs on disk in the cache, shared by later clusters (a re-push of the same layer is a no-op);
  # manifests and tags live in the registry process and go with it.
  # (Through a link in the cluster directory: a component's command line names that directory.)
  mkdir -p "$CACHE_DIR/registry-blobs"
  ln -sfn "$CACHE_DIR/registry-blobs" "$CLUSTER_DIR/registry-blobs"
  start registry "$(crane_bin)" registry serve --address "127.0.0.1:$reg_port" --disk "$CLUSTER_DIR/registry-blobs"
  healthy_or_fail registry "/v2/" 30 curl -sf --max-time 2 "http://127.0.0.1:$reg_port/v2/"
  rk_build_images
}

rk_start_containerd() {
  rk_write_containerd_config
  start containerd containerd --config "$RK_CONTAINERD/config.toml"
  healthy_or_fail containerd "its socket" 30 rk_ctr version
}

rk_start_kubelet() {
  local port=$1 healthz=$2
  rk_write_kubelet_config "$port" "$healthz"
  # The kubelet talks to the apiserver with the admin kubeconfig (RBAC only, no Node authorizer).
  # hostname-override 127.0.0.1 makes the node's name and InternalIP 127.0.0.1, so the apiserver
  # reaches its API (logs) on loopback.
  start kubelet "$(component_bin kubelet)" \
    --config "$RK_KUBELET/config.yaml" --kubeconfig "$KUBECONFIG_FILE" \
    --root-dir "$RK_KUBELET/root" --cert-dir "$RK_KUBELET/pki" \
    --hostname-override 127.0.0.1 --v 1
  healthy_or_fail kubelet "/healthz" 60 curl -sf --max-time 2 "http://127.0.0.1:$healthz/healthz"
  healthy_or_fail kubelet "node 127.0.0.1 to be Ready" 90 kubelet_ready
  healthy_or_fail kubelet "the node lifecycle controller to take the not-ready taint off" 60 kubelet_untainted
}

# rk_start_step_rbac: steps act with their pod's ServiceAccount (in-cluster config) instead of the
# admin kubeconfig the pod-runner hands them; hack/step-rbac.py makes each namespace's `default`
# ServiceAccount cluster-admin, so that steps may do what they do on the pod-runner (the demo's
# deploy, the tests' marks). Other ServiceAccounts keep their RBAC (tests use some as restricted users).
rk_start_step_rbac() {
  start step-rbac python3 "$here/step-rbac.py" --kubectl "$(component_bin kubectl)" --kubeconfig "$KUBECONFIG_FILE"
  healthy_or_fail step-rbac "it to watch namespaces" 30 grep -q "watching namespaces" "$LOGS/step-rbac.log"
}

# rk_start_step_logs: each step's output also where the pod-runner lane keeps it (hack/step-logs.py).
rk_start_step_logs() {
  start step-logs python3 "$here/step-logs.py" --from "$CLUSTER_DIR/pod-logs" --to "$CLUSTER_DIR/pods"
  healthy_or_fail step-logs "it to start" 30 grep -q "following" "$LOGS/step-logs.log"
}

rk_start_scheduler() {
  local port=$1
  start kube-scheduler "$(component_bin kube-scheduler)" \
    --kubeconfig "$KUBECONFIG_FILE" \
    --authentication-kubeconfig "$KUBECONFIG_FILE" --authorization-kubeconfig "$KUBECONFIG_FILE" \
    --bind-address 127.0.0.1 --secure-port "$port" \
    --tls-cert-file "$CLUSTER_DIR/pki/serving.crt" --tls-private-key-file "$CLUSTER_DIR/pki/serving.key" \
    --leader-elect=false --profiling=false
  healthy_or_fail kube-scheduler "/healthz" 60 \
    curl -sf --max-time 2 --cacert "$CLUSTER_DIR/pki/ca.crt" "https://127.0.0.1:$port/healthz"
}

# The registry names the image proxy answers for the Tekton controller (docker.io's API lives at
# index.docker.io and registry-1.docker.io).
RK_PROXIED=(docker.io index.docker.io registry-1.docker.io mirror.gcr.io ghcr.io gcr.io quay.io
  registry.k8s.io registry.invalid)

# rk_start_image_proxy PORT: hack/image-proxy.py, with a serving certificate for RK_PROXIED.
rk_start_image_proxy() {
  local port=$1 sans h
  sans=subjectAltName=
  for h in "${RK_PROXIED[@]}"; do sans+="DNS:$h,"; done
  sign_cert image-proxy "/CN=tekton-mutex-image-proxy" "${sans%,}\nextendedKeyUsage=serverAuth"
  echo "$port" >"$CLUSTER_DIR/image-proxy.port"
  start image-proxy python3 "$here/image-proxy.py" --listen "127.0.0.1:$port" --registry "$(rk_registry)" \
    --cert "$CLUSTER_DIR/pki/image-proxy.crt" --key "$CLUSTER_DIR/pki/image-proxy.key" \
    --hosts "$(IFS=,; echo "${RK_PROXIED[*]}")"
  healthy_or_fail image-proxy "it to listen" 30 grep -q "listening" "$LOGS/image-proxy.log"
}

# rk_controller_env: the Tekton controller's environment in this lane: registry lookups go through
# the image proxy and trust the cluster CA; no cloud credential probing (k8schain's Google keychain
# would otherwise ask the GCE metadata server about mirror.gcr.io images).
rk_controller_env() {
  local proxy
  proxy=http://127.0.0.1:$(<"$CLUSTER_DIR/image-proxy.port")
  echo HTTPS_PROXY="$proxy" HTTP_PROXY="$proxy" NO_PROXY=127.0.0.1,localhost \
    SSL_CERT_FILE="$CLUSTER_DIR/pki/ca.crt" \
    GOOGLE_APPLICATION_CREDENTIALS="$CLUSTER_DIR/pki/no-google-credentials.json"
}
