#!/usr/bin/env bash
# Two checkouts that build the local control plane at once never break each other (issue 47):
# two hack/build.sh runs start together on an empty binary cache, with a stand-in `go` whose
# first build in each run waits until the other run has started one too (at most 3 s), so that
# without the cache's lock both would write the same binary at once. Both must succeed, every
# binary must be whole, and each must have been built once.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/bin" "$work/cache" "$work/marks"
cat >"$work/bin/go" <<'FAKE'
#!/usr/bin/env bash
# A stand-in for `go build ... -o OUT IMPORT`: writes a small executable to OUT.
out=""
while (($#)); do [[ $1 == -o ]] && { out=$2; shift; }; shift; done
echo "$out" >>"$MARKS/calls"
if [[ ! -e $MARKS/started.$BUILD_ID ]]; then
  touch "$MARKS/started.$BUILD_ID"
  for _ in $(seq 30); do # a bounded wait for the other run's first build
    (( $(find "$MARKS" -name 'started.*' | wc -l) >= 2 )) && break
    sleep 0.1
  done
fi
printf '#!/bin/sh\necho built\n' >"$out"
chmod +x "$out"
FAKE
chmod +x "$work/bin/go"
build() {
  PATH="$work/bin:$PATH" MARKS="$work/marks" BUILD_ID=$1 TEKTON_MUTEX_CACHE="$work/cache" \
    "$repo/hack/build.sh" >"$work/build-$1.log" 2>&1
}
build a & a=$!
build b & b=$!
failed=0
wait "$a" || { echo "first build failed:"; cat "$work/build-a.log"; failed=1; }
wait "$b" || { echo "second build failed:"; cat "$work/build-b.log"; failed=1; }
binaries=$(find "$work/cache/bin" -type f | wc -l)
leftovers=$(find "$work/cache/bin" -name '*.tmp*' | wc -l)
calls=$(wc -l <"$work/marks/calls")
dupes=$(sort "$work/marks/calls" | uniq -d | wc -l)
while IFS= read -r f; do
  [[ $("$f") == built ]] || { echo "not whole: $f"; failed=1; }
done < <(find "$work/cache/bin" -type f ! -name '*.tmp*')
(( binaries > 0 && leftovers == 0 )) || { echo "binaries $binaries, temporaries left $leftovers"; failed=1; }
(( dupes == 0 )) || { echo "$dupes binaries were built twice ($calls builds)"; failed=1; }
if (( failed )); then
  echo "0 passed, 1 failed"
  exit 1
fi
echo "two builds at once: $binaries binaries, each built once"
echo "1 passed, 0 failed"
