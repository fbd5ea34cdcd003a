#!/usr/bin/env bash
# The documentation's checks: every relative link in README.md and docs/**/*.md resolves (a file
# that exists in the repository, and for `#anchor` a heading of the target), and the checker
# itself still catches each kind of broken link. No cluster, no packages: python3 only.
# hack/test.sh runs it after the picture's tests.
#
#   hack/docs.sh                 check README.md and docs/**/*.md
#   hack/docs.sh FILE.md ...     check those files
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hack/lib.sh
source "$here/lib.sh"

require_tool python3 "python3 (apt-get install python3)"
python3 "$REPO_ROOT/tests/docs/check_links.py" --self-test
python3 "$REPO_ROOT/tests/docs/check_links.py" "$@"
