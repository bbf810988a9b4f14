#!/usr/bin/env bash
# make bench, attested mesh part (issue 19): the throughput and latency of
# pod-to-pod traffic through the transparent mesh against plain TCP between
# the same two pods, both under TCG. The client pod's workload fetches from
# the server pod's IP: port 8080 is meshed (the client agent's redirect, its
# proxy, mutual TLS 1.3 over the CNI bridge, the server agent's redirect and
# proxy), port 8081 is not (the same busybox httpd, plain TCP). It runs
# TestMesh (tests/e2e/mesh_test.go, meshbench_test.go) with bigger figures
# and prints its "mesh bench:" lines:
#   - throughput of one MIB MiB transfer (busybox wget | wc -c), MiB/s,
#     and the ratio meshed/plain
#   - latency per request over REQS requests, each on a new connection
#     (so each meshed one pays a TLS handshake), and the ratio
# Timed from the host around CRI ExecSync, less an empty exec's median.
set -euo pipefail
cd "$(dirname "$0")/.."
export C8S_MESH_BENCH_MIB=${MESH_MIB:-32}
export C8S_MESH_BENCH_REQS=${MESH_REQS:-30}
export C8S_E2E_REQUIRED=1
echo "== attested mesh: meshed vs plain pod-to-pod traffic (${C8S_MESH_BENCH_MIB} MiB, ${C8S_MESH_BENCH_REQS} requests)"
out=$(go test ./tests/e2e -run '^TestMesh$' -v -count=1 -timeout 30m 2>&1) || {
	# The test's own messages first (its logs follow them, long).
	grep -E '^\s+[a-z_]+_test\.go:[0-9]+:' <<<"$out" | cut -c1-2000
	echo "$out" | tail -40
	exit 1
}
grep -o 'mesh bench: .*' <<<"$out"
