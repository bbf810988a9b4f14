#!/usr/bin/env bash
# Runs every fuzz target in the repository for a bounded time each
# (FUZZTIME, default 10s; any `go test -fuzztime` value works).
#
#   hack/fuzz.sh                      # every target
#   FUZZTIME=2m hack/fuzz.sh
#   hack/fuzz.sh ./launcher/attest    # only the targets in these packages
#
# The targets are discovered, not listed: `go test -list '^Fuzz'` names
# each package's FuzzXxx functions, so a new target runs as soon as it is
# written. Seed corpora live in each package's test code (f.Add) and, for
# failures the fuzzer finds, in its testdata/fuzz directory.
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME=${FUZZTIME:-10s}
# Minimizing a new interesting input re-runs the target many times (60s by
# default); with seeds of several KiB that eats the whole FUZZTIME, so bound it.
FUZZMINIMIZETIME=${FUZZMINIMIZETIME:-2s}
PKGS=("${@:-./...}")

# `go test -list` prints each package's matching functions, then the
# package's "ok" line: "PACKAGE FUZZ_FUNCTION" for each target.
list=$(go test -list '^Fuzz' "${PKGS[@]}") || {
	echo "$list" >&2
	echo "fuzz: listing the fuzz targets failed" >&2
	exit 1
}
TARGETS=()
names=()
while IFS= read -r line; do
	if [[ $line =~ ^Fuzz[[:alnum:]_]*$ ]]; then
		names+=("$line")
	elif [[ $line =~ ^ok[[:space:]]+([^[:space:]]+) ]]; then
		for fn in "${names[@]}"; do
			TARGETS+=("${BASH_REMATCH[1]} $fn")
		done
		names=()
	fi
done <<<"$list"
if [[ ${#TARGETS[@]} == 0 ]]; then
	echo "fuzz: no fuzz targets found in ${PKGS[*]}" >&2
	exit 1
fi
echo "fuzz: ${#TARGETS[@]} targets, $FUZZTIME each"

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
