#!/usr/bin/env bash
# make bench: Go benchmarks, then the pod figures against peers measured in
# the same run:
#   - `ctr run --rm IMG true` on c8s, over a bare QEMU boot of the same
#     kernel and initramfs to init and power-off   (goal <= 1.15)
#   - the c8s shim's RSS over containerd-shim-runc-v2's  (goal <= 1.2)
#   - QEMU's host RSS per pod
#   - exec with 4 MB of output, tty and pipes, over runc's
#   - the sealed image: build time, sizes, sealed/plain boot (hack/bench-image.sh)
#   - the agent's measured policy: evaluation per CreateContainer and per
#     exec, the agent's size and RSS against the agent before it
#     (hack/bench-policy.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}

echo "== Go benchmarks"
go test -run '^$' -bench . -benchtime "${BENCHTIME:-1x}" ./measurements/... 2>&1 | grep -E '^(Benchmark|ok|FAIL)' || true

echo "== attestation: verified SNP reports per second per core vs raw ECDSA P-384 verifies (goal ratio >= 0.8)"
GOMAXPROCS=1 go test -run '^$' -bench 'BenchmarkVerify' -benchtime "${ATTEST_BENCHTIME:-300x}" ./launcher/attest 2>&1 | grep -E '^(Benchmark|ok|FAIL)' || true

hack/bench-image.sh || true

hack/bench-policy.sh || true

[[ -x hack/bench-measure.sh ]] && { echo "== c8s-measure against the reference tool"; hack/bench-measure.sh || true; }

source hack/lib/containerd.sh
CD_LOG_LEVEL=info cd_start
cd_import_busybox
img=docker.io/c8s/busybox:test
cfg=$CD_DIR/c8s.toml

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

# Warm up: the first pod pays for the node's accelerator probe (cached after).
ctr run --runtime io.containerd.c8s.v2 --runtime-config-path "$cfg" --rm "$img" warmup true

echo "== pod start-to-exit: ctr run --rm $img true ($RUNS runs)"
c8s=()
for i in $(seq "$RUNS"); do
	t0=$(now); ctr run --runtime io.containerd.c8s.v2 --runtime-config-path "$cfg" --rm "$img" "bench-$i" true; t1=$(now)
	c8s+=($(( (t1 - t0) / 1000000 )))
done

# The bare boot: the same QEMU command line c8s uses (same kernel, initrd,
# machine, devices, accelerator), with c8s_poweroff=1 so that init powers
# the VM off as soon as it runs.
bare_cfg=$CD_DIR/bare.toml
sed -e "s|^state_dir = .*|state_dir = \"$CD_DIR/bare-state\"|" "$cfg" >"$bare_cfg"
sed -i "s|^\[hypervisor\]|[hypervisor]\nkernel_params = \"c8s_poweroff=1\"|" "$bare_cfg"
mkdir -p "$CD_DIR/bare-state"
cp -r "$CD_DIR/c8s-state/cache" "$CD_DIR/bare-state/" 2>/dev/null || true
mapfile -t argv < <(bin/c8s-launcher args --config "$bare_cfg" --id bare)
bare=()
for i in $(seq "$RUNS"); do
	rm -rf "$CD_DIR/bare-state/bare"; mkdir -p "$CD_DIR/bare-state/bare"
	t0=$(now); "${argv[@]}" >/dev/null 2>&1 </dev/null; t1=$(now)
	bare+=($(( (t1 - t0) / 1000000 )))
done
rm -rf "$CD_DIR/bare-state"
c8s_ms=$(printf '%s\n' "${c8s[@]}" | median)
bare_ms=$(printf '%s\n' "${bare[@]}" | median)
echo "c8s ctr run --rm true: median ${c8s_ms} ms  (runs: ${c8s[*]})"
echo "bare QEMU boot to init and power-off: median ${bare_ms} ms  (runs: ${bare[*]})"
awk -v a="$c8s_ms" -v b="$bare_ms" 'BEGIN{printf "ratio c8s/bare-boot = %.3f (goal <= 1.15)\n", a/b}'

# From QEMU start to verified attestation, as the shim logs it per pod
# ("pod VM is up" agent_ready=..., then "pod VM attested" took=...).
ms() { case $1 in *ms) echo "${1%ms}" ;; *s) awk -v s="${1%s}" 'BEGIN{printf "%d", s*1000}' ;; esac; }
up=() att=()
while read -r line; do
	case $line in
	*"pod VM is up"*) v=$(grep -o 'agent_ready=[0-9.]*m\?s' <<<"$line" | cut -d= -f2); up_ms=$(ms "$v") ;;
	*"pod VM attested"*) v=$(grep -o 'took=[0-9.]*m\?s' <<<"$line" | cut -d= -f2); a=$(ms "$v"); att+=("$a"); up+=($((up_ms + a))) ;;
	esac
done < <(grep -E 'pod VM is up|pod VM attested' "$CD_DIR/containerd.log")
if ((${#up[@]})); then
	echo "QEMU start to verified attestation: median $(printf '%s\n' "${up[@]}" | median) ms; the attestation itself: median $(printf '%s\n' "${att[@]}" | median) ms (${#up[@]} pods)"
fi

rss_kb() { local sum=0; for p in "$@"; do sum=$((sum + $(awk '/^VmRSS/{print $2}' "/proc/$p/status"))); done; echo $sum; }

echo "== memory of a running container"
ctr run -d --runtime io.containerd.c8s.v2 --runtime-config-path "$cfg" "$img" rss-c8s sleep 600 >/dev/null
ctr run -d "$img" rss-runc sleep 600 >/dev/null
sleep 2
c8s_shim=$(pgrep -f 'containerd-shim-c8s-v2 .*-id rss-c8s' | head -1)
runc_shim=$(pgrep -f 'containerd-shim-runc-v2 .*-id rss-runc' | head -1)
qemu=$(pgrep -f "qemu-system.*$CD_DIR/c8s-state" | head -1)
c8s_rss=$(rss_kb "$c8s_shim"); runc_rss=$(rss_kb "$runc_shim"); qemu_rss=$(rss_kb "$qemu")
echo "containerd-shim-c8s-v2 RSS: ${c8s_rss} KiB"
echo "containerd-shim-runc-v2 RSS: ${runc_rss} KiB"
awk -v a="$c8s_rss" -v b="$runc_rss" 'BEGIN{printf "ratio c8s-shim/runc-shim RSS = %.3f (goal <= 1.2)\n", a/b}'
echo "QEMU host RSS per pod: ${qemu_rss} KiB ($(( qemu_rss / 1024 )) MiB)"
# Exec with large output, as critest's "exec with tty=true and large
# output" does: 4 MB through a terminal and through pipes, c8s against runc
# in the same run. The guest's own work under TCG (the same pipeline with
# its output dropped inside the VM) is printed as the floor c8s cannot go
# below here.
echo "== exec with 4 MB of output ($RUNS runs each)"
exec_ms() { # TASK FLAG SCRIPT
	local t0 t1
	t0=$(now)
	script -qfec "$TOOLS_BIN/ctr -a $CD_SOCK tasks exec $2 --exec-id e$RANDOM$RANDOM $1 sh -c '$3'" /dev/null >/dev/null
	t1=$(now)
	echo $(((t1 - t0) / 1000000))
}
big='head -c 4000000 /dev/zero | tr "\\0" a'
for mode in tty pipe; do
	flag=; [[ $mode == tty ]] && flag=--tty
	c=() r=()
	for i in $(seq "$RUNS"); do
		c+=($(exec_ms rss-c8s "$flag" "$big"))
		r+=($(exec_ms rss-runc "$flag" "$big"))
	done
	cm=$(printf '%s\n' "${c[@]}" | median); rm_=$(printf '%s\n' "${r[@]}" | median)
	echo "exec $mode 4 MB: c8s median ${cm} ms (runs: ${c[*]}), runc median ${rm_} ms (runs: ${r[*]})"
	awk -v a="$cm" -v b="$rm_" -v m="$mode" 'BEGIN{printf "ratio c8s/runc exec %s large output = %.2f\n", m, a/b}'
done
f=()
for i in $(seq "$RUNS"); do f+=($(exec_ms rss-c8s "" 'head -c 4000000 /dev/zero | tr "\\0" a >/dev/null')); done
echo "c8s floor, the same exec with its output dropped in the guest: median $(printf '%s\n' "${f[@]}" | median) ms (runs: ${f[*]})"

for t in rss-c8s rss-runc; do ctr tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
sleep 1
for t in rss-c8s rss-runc; do ctr tasks delete "$t" >/dev/null 2>&1 || true; ctr containers delete "$t" >/dev/null 2>&1 || true; done

# ---------------------------------------------------------------------------
# Live migration (launcher/migrate, issue 8): a pod VM from the guest image
# moves to a second node on loopback through the shim's Migrate code path,
# for a 256 MiB and a 1 GiB guest. Per size: QEMU's total-time and downtime,
# c8s preflight-to-cut-over (re-attestation included) and its ratio to
# QEMU's total-time (goal <= 1.2), re-attestation (goal < 100 ms in sim)
# split into the agent channel's first answer through the destination
# (reattest-connect-ms: under TCG the guest runs cold code on the new QEMU)
# and fresh evidence plus its verification (reattest-verify-ms), and the
# pod's first attestation on the source for comparison.
echo "== live migration: 256 MiB and 1 GiB guests, loopback"
go test -run '^$' -bench 'BenchmarkMigrate' -benchtime "${MIGRATE_BENCHTIME:-3x}" ./shim/sandbox 2>/dev/null | grep -E '^(Benchmark|ok|FAIL)' || true
