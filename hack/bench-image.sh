#!/usr/bin/env bash
# make bench, sealed image part: the image build time, the size of each
# part of the sealed image, and the guest boot time from the sealed image
# (first stage, dm-verity, switch into the verified root, the agent as init)
# as a ratio to the plain-initramfs boot of the skeleton (goal <= 1.10).
# Both boots use the launcher's own QEMU command line (c8s-launcher args)
# with c8s_poweroff=1, so the agent powers the VM off as soon as it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
IMAGE=${IMAGE:-_output/image}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/c8s-bench-image.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

echo "== sealed guest image"
t0=$(now)
images/build.sh "$tmp/image" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; exit 1; }
t1=$(now)
echo "image build (kernel cached, rootfs + verity + initramfs + UKI + IGVM + manifest): $(( (t1 - t0) / 1000000 )) ms"

field() { python3 -c "import json,sys; m=json.load(open('$IMAGE/manifest.json')); print(eval(sys.argv[1]))" "$1"; }
blocks=$(field "m['verity']['data_blocks']")
rootfs_size=$(stat -c %s "$IMAGE/rootfs.img")
kib() { echo $(( ($1 + 1023) / 1024 )); }
echo "sizes (KiB): kernel $(kib "$(stat -c %s "$IMAGE/vmlinuz")"), initrd.img (first stage + agent + runtime tree) $(kib "$(stat -c %s "$IMAGE/initrd.img")")," \
	"rootfs $(kib $((blocks * 4096))), hash tree $(kib $((rootfs_size - blocks * 4096))), UKI $(kib "$(stat -c %s "$IMAGE/c8s.efi")");" \
	"unsealed initramfs for comparison $(kib "$(stat -c %s "$IMAGE/initrd-plain.img")")"

abs=$(cd "$IMAGE" && pwd)
cat >"$tmp/sealed.toml" <<EOC
[hypervisor]
kernel = "$abs/vmlinuz"
initrd = "$abs/initrd.img"
kernel_params = "c8s_poweroff=1"
accel = "tcg"
[attestation]
mode = "off"
[runtime]
state_dir = "$tmp/state"
EOC
sed -e "s|initrd.img\"|initrd-plain.img\"|" -e "s|^mode = \"off\"|mode = \"off\"\nmanifest = \"$tmp/none.json\"|" "$tmp/sealed.toml" >"$tmp/plain.toml"
once() { # ARGV...: one boot to power-off, in ms
	local t0 t1
	rm -rf "$tmp/state/boot"; mkdir -p "$tmp/state/boot"
	t0=$(now); "$@" >/dev/null 2>&1 </dev/null; t1=$(now)
	echo $(( (t1 - t0) / 1000000 ))
}
mapfile -t sealed_argv < <(bin/c8s-launcher args --config "$tmp/sealed.toml" --id boot)
mapfile -t plain_argv < <(bin/c8s-launcher args --config "$tmp/plain.toml" --id boot)
printf '%s\n' "${sealed_argv[@]}" | grep -q 'c8s.verity.roothash' || { echo "the sealed config does not attach the verity root"; exit 1; }
# Interleaved, so that load on the machine weighs on both alike.
sealed=() plain=()
for i in $(seq "$RUNS"); do
	sealed+=("$(once "${sealed_argv[@]}")")
	plain+=("$(once "${plain_argv[@]}")")
done
sealed_ms=$(printf '%s\n' "${sealed[@]}" | median)
plain_ms=$(printf '%s\n' "${plain[@]}" | median)
echo "boot to the agent and power-off, sealed image (verity root): median ${sealed_ms} ms (runs: ${sealed[*]})"
echo "boot to the agent and power-off, plain initramfs: median ${plain_ms} ms (runs: ${plain[*]})"
awk -v a="$sealed_ms" -v b="$plain_ms" 'BEGIN{printf "ratio sealed/plain boot = %.3f (goal <= 1.10)\n", a/b}'
