#!/usr/bin/env bash
# Runs every fuzz target listed below for a bounded time each
# (FUZZTIME, default 10s; any `go test -fuzztime` value works).
#
#   hack/fuzz.sh            # all targets
#   FUZZTIME=2m hack/fuzz.sh
#
# To add a target, append one line "PACKAGE FUZZ_FUNCTION" to TARGETS.
# Seed corpora live in each package's test code (f.Add) and, for failures
# the fuzzer finds, in its testdata/fuzz directory.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10s}
# Minimizing a new interesting input re-runs the target many times (60s by
# default); with seeds of several KiB that eats the whole FUZZTIME, so bound it.
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-2s}

TARGETS=(
	"./measurements/tdx FuzzParse"
	"./measurements/uki/pecoff FuzzParse"
	"./measurements/uki FuzzMeasure"
	"./measurements/igvm FuzzParse"
	"./measurements/ovmf FuzzParse"
	"./measurements/ovmf FuzzSevMetadata"
)

status=0
for t in "${TARGETS[@]}"; do
	read -r pkg fn <<<"$t"
	echo "== $pkg $fn ($FUZZTIME)"
	if ! go test -run '^$' -fuzz "^${fn}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$FUZZMINIMIZETIME" "$pkg"; then
		echo "FAIL: $pkg $fn" >&2
		status=1
	fi
done
exit $status
