#!/usr/bin/env bash
# make bench, guest pull part (issue 16): a pod whose measured policy names
# a digest-pinned image, and whose node offers no layer disks, pulls the
# image in the guest over the pod's CNI network, verifying every digest.
# Against the same image started from the node's layer disks, in the same
# run, one pod VM each, timed from the pod sandbox ready to the container
# started (as the kubelet retries a start while the pull reports progress):
#   - guest pull, and seconds per GiB of layer blobs
#   - the node's layer disks, cold cache (the node converts the layers)
#   - the node's layer disks, warm cache
# The image is busybox plus one layer of PULL_MIB (300) MiB of
# incompressible content, served by an in-test registry on the CNI
# bridge. It runs TestGuestPull (tests/e2e/guestpull_test.go,
# guestpullbench_test.go) with C8S_PULL_BENCH_MIB and prints its
# "pull bench:" lines.
set -euo pipefail
cd "$(dirname "$0")/.."
export C8S_PULL_BENCH_MIB=${PULL_MIB:-300}
export C8S_E2E_REQUIRED=1
echo "== guest pull: ${C8S_PULL_BENCH_MIB} MiB image pulled in the guest vs started from the node's layer disks"
out=$(PATH=$PWD/_output/tools/bin:$PATH go test ./tests/e2e -run '^TestGuestPull$' -v -count=1 -timeout 40m 2>&1) || { echo "$out" | tail -40; exit 1; }
grep -o 'pull bench: .*' <<<"$out"
