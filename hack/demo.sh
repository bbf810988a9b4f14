#!/usr/bin/env bash
# make demo: runs a container inside a confidential pod VM (sim TEE) through
# a private containerd, shows that it runs in the guest, and shows the
# pod's verified attestation.
set -euo pipefail
source "$(dirname "$0")/lib/containerd.sh"

cd_start
cd_import_busybox
img=docker.io/c8s/busybox:test
run=(--runtime io.containerd.c8s.v2 --runtime-config-path "$CD_DIR/c8s.toml")

echo "== host kernel: $(uname -r)"
echo "== ctr run --rm ${run[*]:0:2} $img demo uname -r"
start=$(date +%s%N)
ctr run "${run[@]}" --rm "$img" c8s-demo sh -c 'echo "container kernel:   $(uname -r)"; echo "container cpus:     $(grep -c ^processor /proc/cpuinfo)"; echo "container memory:   $(grep MemTotal /proc/meminfo)"; echo "guest root:         dm-verity, $(tr " " "\\n" </proc/cmdline | grep c8s.verity.roothash=) (on the measured command line)"' 2>/dev/null
end=$(date +%s%N)
awk -v ns=$((end - start)) 'BEGIN{printf "(the pod VM booted, attested, ran the container and was torn down in %.1f s)\n", ns/1e9}'

echo
echo "== a running pod, re-attested on demand with a fresh nonce"
ctr run "${run[@]}" -d "$img" c8s-pod sleep 600 >/dev/null 2>&1
"$ROOT/bin/c8s-launcher" attest --address "$CD_SOCK" --namespace default c8s-pod
echo "expected (image manifest, 1 vCPU): $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["digests"]["sim"]["by_vcpus"]["1"])' "$IMAGE_DIR/manifest.json" 2>/dev/null || echo "see $IMAGE_DIR/manifest.json")"
ctr task kill -s KILL c8s-pod >/dev/null 2>&1 || true
sleep 1
ctr task delete c8s-pod >/dev/null 2>&1 || true
ctr container delete c8s-pod >/dev/null 2>&1 || true

echo
echo "== the same pod with an initrd altered after the manifest was made"
altered=$CD_DIR/altered
mkdir -p "$altered"
cp "$IMAGE_DIR/initrd.img" "$altered/initrd.img"
head -c 4096 /dev/zero >>"$altered/initrd.img"
sed -e "s|^initrd = .*|initrd = \"$altered/initrd.img\"|" "$CD_DIR/c8s.toml" >"$altered/c8s.toml"
printf '[attestation]\nmanifest = "%s"\n' "$IMAGE_DIR/manifest.json" >>"$altered/c8s.toml"
if ctr run --runtime io.containerd.c8s.v2 --runtime-config-path "$altered/c8s.toml" --rm "$img" c8s-altered true 2>"$altered/err"; then
	echo "unexpected: the altered pod started" >&2
	exit 1
fi
grep -o 'attestation of pod VM.*' "$altered/err" | cut -c1-400
ctr container delete c8s-altered >/dev/null 2>&1 || true

if [[ -n ${C8S_MAKE_START:-} ]]; then
	echo
	echo "== make demo took $(($(date +%s) - C8S_MAKE_START)) s in all (installs, builds and the demo)"
fi
