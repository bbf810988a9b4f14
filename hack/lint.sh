#!/usr/bin/env bash
# make lint, and a step of make test: staticcheck over the whole tree.
#
# staticcheck is built from its module at the version tests/tools/staticcheck
# pins, into _output/tools/bin, once (hack/build-tools.sh caches it). It runs
# with its default checks. A finding that is wrong is silenced where it
# occurs, with the reason: //lint:ignore CHECK reason.
#
#   hack/lint.sh                 # the whole tree
#   hack/lint.sh ./launcher/...  # only these packages
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS_BIN=$PWD/_output/tools/bin
hack/build-tools.sh "$TOOLS_BIN" staticcheck >&2
"$TOOLS_BIN/staticcheck" -version
"$TOOLS_BIN/staticcheck" "${@:-./...}"
echo "staticcheck: no findings"
