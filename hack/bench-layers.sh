#!/usr/bin/env bash
# make bench, image layers part (issue 16): what a pod's image costs now
# that its layers are shared disks of the node's layer cache, attached
# read-only, instead of a copy per container:
#   - start to exit, `ctr run --rm IMG true`, of busybox and of busybox
#     with one more 400 MiB layer, warm cache, interleaved   (goal <= 1.05)
#   - the first conversion of that layer (cold cache): time, and per GiB
#   - host disk of PODS (10) running pods of the 400 MiB image against
#     that of one pod, both measured (du of the layer cache and the pods'
#     state dirs)                                            (goal <= 1.1)
#     and the copy mode's (runtime.rootfs = "copy"): one pod's root disk
#     measured, which each pod has
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
PODS=${PODS:-10}
MIB=${LAYER_MIB:-400}

source hack/lib/containerd.sh
CD_LOG_LEVEL=info cd_start
cd_import_busybox
small=docker.io/c8s/busybox:test
big=docker.io/c8s/big:test
(cd "$ROOT" && go run ./tests/cmd/mklayerimage "$CD_DIR/big.tar" --name "$big" --random-mib "$MIB") >/dev/null
ctr images import "$CD_DIR/big.tar" >/dev/null
cfg=$CD_DIR/c8s.toml
cache=$CD_DIR/c8s-state/cache/layers

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
once() { # IMAGE ID: start to exit in ms
	local t0 t1
	t0=$(now)
	ctr run --runtime io.containerd.c8s.v2 --runtime-config-path "$cfg" --rm "$1" "$2" true
	t1=$(now)
	echo $(((t1 - t0) / 1000000))
}

echo "== image layers: start to exit, busybox vs busybox + ${MIB} MiB layer"
# The node's accelerator probe and busybox's layer: paid once, before.
once "$small" warmup >/dev/null
cold=$(once "$big" cold)
conv=$(grep 'layer disk built' "$CD_DIR/containerd.log" | grep -o 'took_ms=[0-9]*' | cut -d= -f2 | sort -n | tail -1)
size=$(grep 'layer disk built' "$CD_DIR/containerd.log" | grep -o 'size=[0-9]*' | cut -d= -f2 | sort -n | tail -1)
echo "first start of the ${MIB} MiB image (cold cache, converts the layer): ${cold} ms"
awk -v ms="$conv" -v mib="$MIB" -v sz="$size" 'BEGIN{printf "first conversion of the %d MiB layer (blob to layer disk of %.0f MiB, verity tree included): %d ms, %.1f s per GiB of layer\n", mib, sz/1048576, ms, ms/1000*1024/mib}'
s=() b=()
for i in $(seq "$RUNS"); do
	s+=("$(once "$small" "s$i")")
	b+=("$(once "$big" "b$i")")
done
sm=$(printf '%s\n' "${s[@]}" | median)
bm=$(printf '%s\n' "${b[@]}" | median)
echo "busybox: median ${sm} ms (runs: ${s[*]})"
echo "busybox + ${MIB} MiB layer, warm cache: median ${bm} ms (runs: ${b[*]})"
awk -v a="$bm" -v b="$sm" -v mib="$MIB" 'BEGIN{printf "ratio %d MiB image/busybox start = %.3f (goal <= 1.05; 1.23 with the copy per container)\n", mib, a/b}'

echo "== host disk of ${PODS} running pods of the ${MIB} MiB image"
kib() { du -sk "$@" 2>/dev/null | awk '{s+=$1} END{print s+0}'; }
# What c8s keeps on the host for pods: the layer cache and the pods'
# state dirs (no root disks in layer mode); the image's blobs and
# snapshots in containerd are the same for any runtime.
c8s_kib() { kib "$CD_DIR/c8s-state"; }
base_kib=$(c8s_kib)
run_pod() { ctr run -d --runtime io.containerd.c8s.v2 --runtime-config-path "$1" "$big" "$2" sleep 600 >/dev/null; }
run_pod "$cfg" disk1
one_kib=$(($(c8s_kib) - base_kib + $(kib "$cache"/*.disk)))
for i in $(seq 2 "$PODS"); do run_pod "$cfg" "disk$i"; done
all_kib=$(($(c8s_kib) - base_kib + $(kib "$cache"/*.disk)))
running=$(ctr task ls | grep -c '^disk[0-9]* .*RUNNING' || true)
qemus=$(pgrep -fc "qemu-system.*$CD_DIR/c8s-state" || true)
refs=$(bin/c8s-launcher layers list --config "$cfg" --json | python3 -c 'import json,sys; print(max(len(l["pods"]) for l in json.load(sys.stdin)))')
echo "${running} pods running (${qemus} QEMUs); the ${MIB} MiB layer's disk referenced by ${refs} pods; cache: $(ls "$cache"/*.disk | wc -l) layer disks"
echo "c8s's host disk (layer cache and pod state dirs): 1 pod ${one_kib} KiB, ${PODS} pods ${all_kib} KiB (measured)"
awk -v a="$all_kib" -v b="$one_kib" -v n="$PODS" 'BEGIN{printf "ratio host disk of %d pods/one pod = %.3f (goal <= 1.1)\n", n, a/b}'
for i in $(seq "$PODS"); do ctr tasks kill -s KILL "disk$i" >/dev/null 2>&1 || true; done
sleep 2
for i in $(seq "$PODS"); do
	ctr tasks delete "disk$i" >/dev/null 2>&1 || true
	ctr containers delete "disk$i" >/dev/null 2>&1 || true
done

# The copy mode for comparison: one pod, its root disk measured while it
# runs; PODS pods would each have one.
copy_cfg=$CD_DIR/c8s-copy.toml
sed -e 's|^\[runtime\]|[runtime]\nrootfs = "copy"|' "$cfg" >"$copy_cfg"
ctr run -d --runtime io.containerd.c8s.v2 --runtime-config-path "$copy_cfg" "$big" copy1 sleep 600 >/dev/null
copy_kib=$(find "$CD_DIR/c8s-state" -name 'copy1.img' -exec du -sk {} + | awk '{s+=$1} END{print s+0}')
echo "copy mode (runtime.rootfs = \"copy\"): one pod's root disk ${copy_kib} KiB (measured); ${PODS} pods have one each: $((copy_kib * PODS)) KiB (computed), ratio ${PODS}.0 by construction"
ctr tasks kill -s KILL copy1 >/dev/null 2>&1 || true
sleep 1
ctr tasks delete copy1 >/dev/null 2>&1 || true
ctr containers delete copy1 >/dev/null 2>&1 || true
