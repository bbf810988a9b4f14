#!/usr/bin/env bash
# make demo: runs a container inside a pod VM through a private containerd
# and shows that it ran in the guest, not on the host.
set -euo pipefail
source "$(dirname "$0")/lib/containerd.sh"

cd_start
cd_import_busybox
echo "host kernel:        $(uname -r)"
echo "running: ctr run --runtime io.containerd.c8s.v2 --rm docker.io/c8s/busybox:test demo ..."
start=$(date +%s%N)
ctr run --runtime io.containerd.c8s.v2 --runtime-config-path "$CD_DIR/c8s.toml" --rm \
	docker.io/c8s/busybox:test c8s-demo \
	sh -c 'echo "container kernel:   $(uname -r)"; echo "container cpus:     $(grep -c ^processor /proc/cpuinfo)"; echo "container memory:   $(grep MemTotal /proc/meminfo)"'
end=$(date +%s%N)
awk -v ns=$((end - start)) 'BEGIN{printf "pod VM booted, ran the container and was torn down in %.1f s\n", ns/1e9}'
