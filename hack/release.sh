#!/usr/bin/env bash
# Builds a release without a container runtime:
#   1. the controller as a static binary (musl when its Rust target is installed, else glibc
#      with crt-static), with the version and git revision embedded;
#   2. an OCI image (amd64, non-root, OCI labels) packed by crane, which is built from Go
#      modules (hack/tools/crane) and cached outside the repo like the control plane;
#   3. release.yaml (every file of config/, in name order) and release-namespaced.yaml (of
#      config/namespaced/), rendered by the binary itself with the image pinned by digest, and
#      release-admission.yaml (config/admission/, MutatingAdmissionPolicy v1, Kubernetes 1.36+)
#      with release-admission-v1beta1.yaml (the same for 1.34 and 1.35).
#
#   hack/release.sh VERSION [REGISTRY]
#
# With REGISTRY (e.g. ghcr.io/me, or 127.0.0.1:5000 for a local one), the image is pushed to
# REGISTRY/tekton-mutex:VERSION. Without it, the image is kept as an OCI layout in the output
# directory (push it later with `hack/crane.sh push DIR REF`: the digest stays the same).
# Output: target/dist/VERSION/, or TEKTON_MUTEX_DIST_DIR (two builds of one version at once,
# as hack/test.sh's lanes make, each write their own). TEKTON_MUTEX_SOURCE overrides the source
# URL label.
#
# arm64: build the binary for aarch64-unknown-linux-musl too, pack it the same way with
# --set-platform linux/arm64, and join both with `crane index append` into one index.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

(( $# >= 1 && $# <= 2 )) || die "usage: hack/release.sh VERSION [REGISTRY]"
version=$1
registry=${2:-}
[[ $version =~ ^v?[0-9]+\.[0-9]+\.[0-9]+([-+][0-9A-Za-z.-]+)?$ ]] ||
  die "VERSION $version is not a semantic version like 0.2.0 or v0.2.0-rc.1"
require_tool cargo "Rust 1.89 or newer (https://rustup.rs)"
require_tool tar "GNU tar (apt-get install tar)"

out=${TEKTON_MUTEX_DIST_DIR:-$REPO_ROOT/target/dist/$version}
rm -rf "$out"
mkdir -p "$out"
crane=$("$here/crane.sh" --path)

revision=$(git -C "$REPO_ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
if [[ $revision != unknown ]] && ! git -C "$REPO_ROOT" diff --quiet HEAD 2>/dev/null; then
  revision="$revision-dirty"
fi
source_url=${TEKTON_MUTEX_SOURCE:-$(git -C "$REPO_ROOT" config --get remote.origin.url 2>/dev/null || echo unknown)}

# 1. A static binary: musl if installed, else glibc linked statically (the controller
# resolves no host names in a cluster: it reaches the API server by IP).
if rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
  target=x86_64-unknown-linux-musl
  rustflags=""
else
  target=x86_64-unknown-linux-gnu
  rustflags="-C target-feature=+crt-static"
  log "release: the musl target is not installed; building a static glibc binary instead"
fi
log "release: building tekton-mutex $version ($revision) for $target"
(
  cd "$REPO_ROOT"
  TEKTON_MUTEX_VERSION=$version TEKTON_MUTEX_REVISION=$revision RUSTFLAGS=$rustflags \
    cargo build --release --locked -p tekton-mutex --target "$target"
)
bin=$REPO_ROOT/target/$target/release/tekton-mutex
if LC_ALL=C readelf -l "$bin" 2>/dev/null | grep -q 'Requesting program interpreter'; then
  die "$bin is dynamically linked"
fi
"$bin" version | grep -q "$version" || die "$bin does not report version $version"

# 2. The image: one layer with the binary, assembled in a throwaway registry on loopback.
stage=$out/layer
mkdir -p "$stage"
install -m 0755 "$bin" "$stage/tekton-mutex"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$stage" \
  -cf "$out/layer.tar" tekton-mutex
rm -rf "$stage"

port_file=$out/registry.log
"$crane" registry serve --address 127.0.0.1:0 >"$port_file" 2>&1 &
registry_pid=$!
trap 'kill "$registry_pid" 2>/dev/null || true' EXIT
wait_for "the build registry" 30 grep -q 'serving on port' "$port_file"
build_repo=127.0.0.1:$(sed -n 's/.*serving on port \([0-9]*\).*/\1/p' "$port_file" | head -n1)/tekton-mutex

"$crane" append --oci-empty-base --new_layer "$out/layer.tar" --new_tag "$build_repo:base" >/dev/null
"$crane" mutate "$build_repo:base" --tag "$build_repo:$version" \
  --set-platform linux/amd64 --entrypoint /tekton-mutex --user 65532:65532 --workdir / \
  --label "org.opencontainers.image.title=tekton-mutex" \
  --label "org.opencontainers.image.description=A Tekton custom task that lets a pipeline say: one at a time here." \
  --label "org.opencontainers.image.licenses=Apache-2.0" \
  --label "org.opencontainers.image.source=$source_url" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" >/dev/null
digest=$("$crane" digest "$build_repo:$version")

# 3. Publish (or keep) it, and pin the manifests to its digest.
if [[ -n $registry ]]; then
  image=${registry%/}/tekton-mutex:$version
  "$crane" copy "$build_repo:$version" "$image"
  pushed=$("$crane" digest "$image")
  [[ $pushed == "$digest" ]] || die "the registry reports digest $pushed for $image, built $digest"
else
  image=tekton-mutex:$version
  "$crane" pull --format oci "$build_repo:$version" "$out/image"
  log "release: no REGISTRY given; the image is an OCI layout in $out/image"
fi
echo "$image@$digest" >"$out/image.txt"
"$bin" manifests --image "$image@$digest" --version "$version" >"$out/release.yaml"
"$bin" manifests --image "$image@$digest" --version "$version" --namespaced >"$out/release-namespaced.yaml"
"$bin" manifests --admission v1 --version "$version" >"$out/release-admission.yaml"
"$bin" manifests --admission v1beta1 --version "$version" >"$out/release-admission-v1beta1.yaml"
cp "$bin" "$out/tekton-mutex-linux-amd64"
# The tkn plugin, its own artefact: users put it on PATH as tkn-mutex (README, Queue control).
plugin=$REPO_ROOT/target/$target/release/tkn-mutex
"$plugin" --version | grep -q "$version" || die "$plugin does not report version $version"
cp "$plugin" "$out/tkn-mutex-linux-amd64"
rm -f "$out/layer.tar" "$port_file"
log "release: $image@$digest"
log "release: wrote $out/release.yaml, $out/release-namespaced.yaml, $out/release-admission.yaml (and -v1beta1) and $out/tkn-mutex-linux-amd64"
