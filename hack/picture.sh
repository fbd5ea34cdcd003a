#!/usr/bin/env bash
# The founding scenario's timeline picture (hack/demo-picture.py, drawn with matplotlib).
#
#   hack/picture.sh                 re-render docs/timeline.svg from docs/timeline.json
#   hack/picture.sh --from-demo     run hack/demo.sh, keep its timeline as docs/timeline.json,
#                                   and re-render docs/timeline.svg from it
#   hack/picture.sh render IN OUT   draw timeline data IN (what hack/demo-report.py stores) to OUT.svg
#   hack/picture.sh test            the picture's tests (tests/picture/), as hack/test.sh runs them
#   hack/picture.sh python          print the path of the Python that has matplotlib
#
# matplotlib comes from PyPI, pinned with its dependencies in hack/picture-requirements.txt, into
# a virtualenv under ~/.cache/tekton-mutex/python/ keyed by that file and the Python version; it
# is installed on first use (about 60 MB of wheels) and reused afterwards. Needs python3 (3.11 or
# newer) with its venv module.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

REQUIREMENTS=$here/picture-requirements.txt
DOCS_DATA=$REPO_ROOT/docs/timeline.json
DOCS_SVG=$REPO_ROOT/docs/timeline.svg

# picture_python: the venv's python, created and filled on first use (one installer at a time).
picture_python() {
  require_tool python3 "python3 3.11 or newer (apt-get install python3 python3-venv)"
  python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "the picture needs Python 3.11 or newer (numpy and matplotlib wheels), found $(python3 --version 2>&1)"
  local key venv
  key=$({ cat "$REQUIREMENTS"; python3 -c 'import sys; print(sys.version)'; } | sha256sum | cut -c1-12)
  venv=$CACHE_DIR/python/picture-$key
  if [[ ! -f $venv/.installed ]]; then
    mkdir -p "$CACHE_DIR/python"
    exec 8>"$CACHE_DIR/python/.lock"
    flock -w 600 8 || die "gave up waiting for another install into $CACHE_DIR/python"
    if [[ ! -f $venv/.installed ]]; then
      log "picture: installing matplotlib (hack/picture-requirements.txt) into $venv (first time only)"
      rm -rf "$venv"
      python3 -m venv "$venv" ||
        die "could not create a Python virtualenv: install the venv module (apt-get install python3-venv)"
      "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        -r "$REQUIREMENTS" >&2 || die "could not install hack/picture-requirements.txt from PyPI into $venv"
      touch "$venv/.installed"
    fi
    exec 8>&-
  fi
  echo "$venv/bin/python"
}

render() { # render IN OUT
  [[ -f $1 ]] || die "no timeline data at $1"
  mkdir -p "$(dirname "$2")"
  local py
  py=$(picture_python)
  "$py" "$here/demo-picture.py" "$1" "$2"
}

case "${1:-}" in
  "")
    render "$DOCS_DATA" "$DOCS_SVG"
    log "picture: wrote ${DOCS_SVG#"$REPO_ROOT"/} from ${DOCS_DATA#"$REPO_ROOT"/}"
    ;;
  --from-demo)
    picture_python >/dev/null # fail before the demo, not after it
    "$here/demo.sh"
    mkdir -p "$(dirname "$DOCS_DATA")"
    cp "$REPO_ROOT/target/demo/timeline.json" "$DOCS_DATA"
    render "$DOCS_DATA" "$DOCS_SVG"
    log "picture: wrote ${DOCS_SVG#"$REPO_ROOT"/} and ${DOCS_DATA#"$REPO_ROOT"/} from this demo run"
    ;;
  render)
    (( $# == 3 )) || die "usage: hack/picture.sh render TIMELINE.json OUT.svg"
    render "$2" "$3"
    ;;
  test)
    py=$(picture_python)
    "$py" -m unittest discover --start-directory "$REPO_ROOT/tests/picture" \
      --top-level-directory "$REPO_ROOT/tests/picture" "${@:2}"
    ;;
  python)
    picture_python
    ;;
  *)
    die "unknown argument '$1' (see the top of hack/picture.sh)"
    ;;
esac
