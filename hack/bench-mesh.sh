#!/usr/bin/env bash
# make bench, attested mesh part (issue 19): the throughput and latency of
# pod-to-pod traffic through the mesh (the client pod's proxy, mutual TLS
# 1.3 over the CNI bridge, the server pod's proxy) against plain TCP
# between the same two pods, both under TCG. It runs TestMesh
# (tests/e2e/mesh_test.go, meshbench_test.go) with bigger figures and
# prints its "mesh bench:" lines:
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
out=$(go test ./tests/e2e -run '^TestMesh$' -v -count=1 -timeout 30m 2>&1) || { echo "$out" | tail -40; exit 1; }
grep -o 'mesh bench: .*' <<<"$out"
