#!/usr/bin/env bash
# make test: every test, end to end included, after `make deps tools image`.
# End-to-end tests skip elsewhere when QEMU or containerd are missing; here
# C8S_E2E_REQUIRED=1 makes them fail instead, and any skipped test fails
# the run, so a green run means everything really ran.
set -euo pipefail
cd "$(dirname "$0")/.."
export C8S_E2E_REQUIRED=1
export PATH=$PWD/_output/tools/bin:$PATH

echo "== the repository stands alone"
hack/check-standalone.sh

echo "== generated API is current"
hack/protos.sh check

echo "== guest image builds are reproducible"
images/verify-reproducible.sh >/tmp/c8s-image-verify.log 2>&1 || { cat /tmp/c8s-image-verify.log; exit 1; }
tail -1 /tmp/c8s-image-verify.log

echo "== go vet"
go vet ./...

echo "== staticcheck"
hack/lint.sh

qemu_before=$(pgrep -f "qemu-system.*$PWD/" | sort || true)
log=$(mktemp /tmp/c8s-test.XXXXXX.log)
echo "== go test (full log: $log)"
status=0
go test -count=1 -timeout 40m -v ./... >"$log" 2>&1 || status=$?
grep -E '^(ok|FAIL|---|panic:|\s+---|=== RUN|PASS|SKIP)' "$log" | grep -vE '^=== RUN|^\s+--- PASS' | grep -E '^(ok|FAIL)|--- (FAIL|SKIP)|panic:' || true

skipped=$(grep -cE -- '--- SKIP' "$log" || true)
passed=$(grep -cE -- '--- PASS' "$log" || true)
failed=$(grep -cE -- '--- FAIL' "$log" || true)
if [[ $status != 0 ]]; then
	echo "== failures:"
	grep -B2 -A30 -E -- '--- FAIL|^panic:|^FAIL\s' "$log" | head -300
fi
if [[ $skipped != 0 ]]; then
	echo "== $skipped test(s) skipped; on this machine nothing may skip:"
	grep -A3 -E -- '--- SKIP' "$log"
	status=1
fi
# QEMU processes started during the run from this checkout's artefacts.
leftover=$(comm -13 <(echo "$qemu_before") <(pgrep -f "qemu-system.*$PWD/" | sort || true) | grep . || true)
if [[ -n $leftover ]]; then
	echo "== QEMU processes left behind by the tests:"
	for p in $leftover; do ps -o pid=,args= -p "$p" || true; done
	status=1
fi
echo "$passed passed, $failed failed, $skipped skipped"
exit $status
