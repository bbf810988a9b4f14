#!/usr/bin/env bash
# Pod start figures for `make bench` (issue 18), every baseline measured in
# the same run as c8s, the runs of each interleaved so that the shared
# machine's load drifts over all of them alike:
#   - headline: `ctr run --rm busybox true` on c8s over a truly bare boot:
#     QEMU with the same kernel (_output/image/vmlinuz), -machine q35
#     -accel tcg -m 512M -smp 1, SeaBIOS, and a busybox-static initramfs
#     whose /init runs `poweroff -f`                    (goal <= 1.35)
#   - the sealed image booted to c8s's own init, which powers off at once
#     (c8s_poweroff=1): the former baseline, kept for comparison
#   - the shim's per-phase trace of each pod (the "pod start trace" debug
#     line; shim/task/trace.go), medians per phase
#   - the guest's work under -icount, which the host's load does not move:
#     the bare boot's kernel to /init against the sealed image's kernel to
#     the agent serving and to the SCSI stack loaded (guest seconds)
#   - the host CPU of one start alone, c8s against bare, by process and
#     thread (perf's account of the scheduler's runtime; hack/lib/hostcpu.awk)
#   - start under load: N pods at once and N bare boots at once, throughput
#     (pods per minute) and p50/p95 start latency   (goal: ratio >= 0.75),
#     and the host CPU per pod of each batch by process and thread: with
#     the node's cores saturated, throughput is the inverse of it; and the
#     shim's trace of those pods, min/median/max per phase (a lock they
#     queue for shows as one phase spread in steps)
# RUNS (default 5) runs of each; ICOUNT_RUNS (default 2) of the -icount
# boots; N (default 10) at once, LOAD_RUNS (default 2) times each
# (LOAD_RUNS=0 leaves start under load out).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
N=${N:-10}
LOAD_RUNS=${LOAD_RUNS:-2}

source hack/lib/containerd.sh

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END{if (NR==0) {print "-"; exit} print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# pct P: the P-th percentile (nearest rank) of the numbers on stdin.
pct() { sort -n | awk -v p="$1" '{a[NR]=$1} END{r=int((p*NR+99)/100); if (r<1) r=1; print a[r]}'; }
ms_since() { echo $(( ($(now) - $1) / 1000000 )); }

busybox=/bin/busybox
if ! file -L "$busybox" 2>/dev/null | grep -q 'statically linked'; then
	echo "bench-start: $busybox is not Debian's busybox-static: run make deps" >&2
	exit 1
fi
kernel=$IMAGE_DIR/vmlinuz
qemu=$(command -v qemu-system-x86_64)
bios=/usr/share/seabios/bios-256k.bin

CD_LOG_LEVEL=debug cd_start # debug: the shim logs its start trace
cd_import_busybox
img=docker.io/c8s/busybox:test
cfg=$CD_DIR/c8s.toml
log=$CD_DIR/containerd.log

# The bare initramfs: busybox-static as /bin/busybox, /init powering off.
bare=$CD_DIR/bare
mkdir -p "$bare/root/bin"
cp "$busybox" "$bare/root/bin/busybox"
printf '#!/bin/busybox sh\n/bin/busybox poweroff -f\n' >"$bare/root/init"
chmod 0755 "$bare/root/init"
(cd "$bare/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$bare/initrd.cpio"

# bare_boot ID: one bare boot, its ms on stdout. Its kernel parameters are
# the issue's definition of the bare boot: launcher/vm.BaseKernelParams as
# it was when the goal was set (console, printk level, panic, timer check),
# nothing of c8s. They are pinned here rather than asked of the launcher
# (`c8s-launcher kernel-params`): a boot trim added to BaseKernelParams
# must make c8s faster, not the baseline it is measured against.
bare_params="console=ttyS0 quiet panic=-1 no_timer_check"
bare_boot() {
	local t0
	t0=$(now)
	"$qemu" -name "bare-$1" -nodefaults -no-user-config -nographic -no-reboot \
		-machine q35 -accel tcg -m 512M -smp 1 -bios "$bios" \
		-kernel "$kernel" -initrd "$bare/initrd.cpio" -append "$bare_params" \
		-serial "file:$bare/console-$1.log" </dev/null >/dev/null 2>&1 || return 1
	grep -q 'Power down' "$bare/console-$1.log" || return 1 # it did boot
	ms_since "$t0"
}

# The sealed image to c8s's own init: c8s's QEMU command line with
# c8s_poweroff=1, so that init powers the VM off as soon as it runs.
sealed_cfg=$CD_DIR/sealed.toml
sed -e "s|^state_dir = .*|state_dir = \"$CD_DIR/sealed-state\"|" "$cfg" >"$sealed_cfg"
sed -i "s|^\[hypervisor\]|[hypervisor]\nkernel_params = \"c8s_poweroff=1\"|" "$sealed_cfg"
mkdir -p "$CD_DIR/sealed-state"
mapfile -t sealed_argv < <(bin/c8s-launcher args --config "$sealed_cfg" --id sealed 2>/dev/null)
sealed_boot() {
	local t0
	rm -rf "$CD_DIR/sealed-state/sealed"
	mkdir -p "$CD_DIR/sealed-state/sealed"
	t0=$(now)
	"${sealed_argv[@]}" >/dev/null 2>&1 </dev/null
	ms_since "$t0"
}

# Host CPU by process and thread: perf records the scheduler's account of
# every task's runtime (sched_stat_runtime) while a start runs, and
# hack/lib/hostcpu.awk adds up that of the processes descended from the
# given roots (containerd's daemon for the shims and QEMUs it starts, the
# shell for ctr and the bare QEMUs), per pod.
have_perf=0
if perf record -q -e sched:sched_stat_runtime -a -o /dev/null -- true >/dev/null 2>&1; then
	have_perf=1
fi
cpu_perf=
cpu_start() { # FILE: start recording into FILE (sets cpu_perf)
	cpu_perf=
	((have_perf)) || return 0
	perf record -q -e sched:sched_stat_runtime -a -o "$1" </dev/null >/dev/null 2>"$1.err" &
	cpu_perf=$!
	sleep 1 # perf has listed the tasks that run already
}
cpu_stop() { # FILE ROOTS N: stop; "CLASS SECONDS" per pod on stdout, "total" first
	[[ -n $cpu_perf ]] || return 0
	kill -INT "$cpu_perf" 2>/dev/null || true
	wait "$cpu_perf" 2>/dev/null || true
	perf script -i "$1" --show-task-events -F pid,tid,event,trace 2>/dev/null |
		awk -v roots="$2" -v n="$3" -f hack/lib/hostcpu.awk
	rm -f "$1" "$1.err"
}
cpu_line() { # FILE (cpu_stop's output): one line
	[[ -s $1 ]] || { echo "not measured (no perf: make deps)"; return; }
	awk 'NR==1 {t=$2; next} $NF+0 >= 0.005 {v=$NF; $NF=""; sub(/ $/, ""); l = l (l ? ", " : "") $0 " " v} END{printf "%s s (%s)\n", t, l}' "$1"
}

c8s_run() { # ID: one `ctr run --rm IMG true`, its ms on stdout
	local t0
	t0=$(now)
	ctr run --runtime io.containerd.c8s.v2 --runtime-config-path "$cfg" --rm "$img" "$1" true || return 1
	ms_since "$t0"
}

# Warm up: the first pod pays for the node's accelerator probe (cached after).
c8s_run warmup >/dev/null
bare_boot warmup >/dev/null

echo "== pod start: ctr run --rm $img true on c8s against bare boots ($RUNS runs each, interleaved; load $(cut -d' ' -f1-3 /proc/loadavg))"
c8s=() bares=() sealed=()
for i in $(seq "$RUNS"); do
	c8s+=("$(c8s_run "bench-$i")")
	bares+=("$(bare_boot "$i")")
	sealed+=("$(sealed_boot)")
done
rm -rf "$CD_DIR/sealed-state"
c8s_ms=$(printf '%s\n' "${c8s[@]}" | median)
bare_ms=$(printf '%s\n' "${bares[@]}" | median)
sealed_ms=$(printf '%s\n' "${sealed[@]}" | median)
echo "c8s ctr run --rm true: median ${c8s_ms} ms  (runs: ${c8s[*]})"
echo "bare boot (same kernel, busybox-static initramfs, poweroff -f): median ${bare_ms} ms  (runs: ${bares[*]})"
echo "sealed image to c8s's first init (c8s_poweroff=1): median ${sealed_ms} ms  (runs: ${sealed[*]})"
awk -v a="$c8s_ms" -v b="$bare_ms" 'BEGIN{printf "HEADLINE ratio c8s/bare-boot = %.3f (goal <= 1.35)\n", a/b}'
awk -v a="$c8s_ms" -v b="$sealed_ms" 'BEGIN{printf "ratio c8s/sealed-image-to-first-stage-init = %.3f (former baseline)\n", a/b}'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

# The shim's trace of each timed pod: phase medians, in the order of a
# pod's life. Host phases are the shim's clock; guest_* are the guest's
# own (display only, from its console).
echo "== pod start trace: median per phase over the $RUNS timed pods (ms; shim/task/trace.go)"
trace_lines() { grep -F "msg=\"pod start trace\"" "$log" | grep -E "container=bench-[0-9]+( |$)"; }
phases="shim_to_create config rootfs wire vm_start vm_prepare qemu_spawn host_side agent_ready outside_guest_clock guest_kernel_to_agent guest_stage1_work guest_agent_to_serving guest_uptime_serving attest attach create create_to_start start run exit_to_delete teardown total"
if [[ -z $(trace_lines) ]]; then
	echo "no trace lines in $log (is the shim logging at debug level?)"
else
	for p in $phases; do
		vals=$(trace_lines | grep -o "[ ]${p}_ms=[0-9]*" | cut -d= -f2 || true)
		[[ -n $vals ]] || continue
		printf '  %-26s %6s   (runs: %s)\n' "$p" "$(median <<<"$vals")" "$(tr '\n' ' ' <<<"$vals")"
	done
	echo "  (vm_start = vm_prepare + qemu_spawn + host_side + the wait for the agent; agent_ready counts from QEMU's spawn;"
	echo "   outside_guest_clock = agent_ready - guest_uptime_serving: firmware, kernel load and decompression, the first answer's round trip;"
	echo "   guest_kernel_to_agent ends at the agent's main (/init, Go runtime started); guest_stage1_work is the first stage in the agent's"
	echo "   process, dm-verity root to switch (guest/stage1); guest_agent_to_serving counts from its end)"
fi

# ---------------------------------------------------------------------------
# Guest work, whatever the load: under -icount (one virtual nanosecond per
# guest instruction, idle time skipped) the guest's clock counts the work
# the guest did rather than the host's wall clock, so these figures hold on
# a loaded machine where the ones above swing. Bare: kernel start to its
# /init. Sealed image: kernel start to the agent serving its channel, and
# to the SCSI stack the first container's disks wait for being loaded.
icount_runs=${ICOUNT_RUNS:-2}
mkdir -p "$bare/uptime/root/bin" "$bare/uptime/root/proc"
cp "$busybox" "$bare/uptime/root/bin/busybox"
printf '#!/bin/busybox sh\n/bin/busybox mount -t proc proc /proc\n/bin/busybox cat /proc/uptime\n/bin/busybox poweroff -f\n' >"$bare/uptime/root/init"
chmod 0755 "$bare/uptime/root/init"
(cd "$bare/uptime/root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$bare/uptime.cpio"
icount_cfg=$CD_DIR/icount.toml
sed -e "s|^state_dir = .*|state_dir = \"$CD_DIR/icount-state\"|" "$cfg" >"$icount_cfg"
mkdir -p "$CD_DIR/icount-state"
mapfile -t icount_argv < <(bin/c8s-launcher args --config "$icount_cfg" --id icount 2>/dev/null)
bare_icount() { # the guest's uptime (s) when the bare /init runs
	"$qemu" -icount shift=0,sleep=off -nodefaults -no-user-config -nographic -no-reboot \
		-machine q35 -accel tcg -m 512M -smp 1 -bios "$bios" \
		-kernel "$kernel" -initrd "$bare/uptime.cpio" -append "$bare_params" \
		-serial "file:$bare/icount.log" </dev/null >/dev/null 2>&1 || return 1
	tr -d '\r' <"$bare/icount.log" | grep -aoE '[0-9]+\.[0-9]+ [0-9]+\.[0-9]+$' | head -n 1 | cut -d' ' -f1
}
sealed_icount() { # "SERVING SCSI": the guest's uptime (s) at each
	local dir=$CD_DIR/icount-state/icount pid i serving scsi
	rm -rf "$dir"
	mkdir -p "$dir"
	(exec "${icount_argv[@]}" -icount shift=0,sleep=off </dev/null >/dev/null 2>&1) &
	pid=$!
	for i in $(seq 1200); do # up to 2 minutes of wall clock
		grep -aq 'loaded [0-9]* kernel modules' "$dir/console.log" 2>/dev/null && break
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	kill "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
	serving=$(grep -a 'msg=serving' "$dir/console.log" | grep -oE 'guest_uptime=[0-9.]+s' | head -n 1 | tr -dc '0-9.')
	scsi=$(grep -a 'loaded [0-9]* kernel modules' "$dir/console.log" | grep -oE 'guest_uptime=[0-9.]+s' | head -n 1 | tr -dc '0-9.')
	rm -rf "$dir"
	[[ -n $serving && -n $scsi ]] || return 1
	echo "$serving $scsi"
}
echo "== guest work under -icount (guest seconds, independent of the host's load; $icount_runs runs each)"
ib=() is=() ic=()
for i in $(seq "$icount_runs"); do
	ib+=("$(bare_icount || echo -)")
	read -r a b <<<"$(sealed_icount || echo "- -")"
	is+=("$a") ic+=("$b")
done
rm -rf "$CD_DIR/icount-state"
ib_m=$(printf '%s\n' "${ib[@]}" | { grep -v -- - || true; } | median)
is_m=$(printf '%s\n' "${is[@]}" | { grep -v -- - || true; } | median)
ic_m=$(printf '%s\n' "${ic[@]}" | { grep -v -- - || true; } | median)
echo "bare: kernel to /init ${ib_m} s  (runs: ${ib[*]})"
echo "sealed image: kernel to agent serving ${is_m} s (runs: ${is[*]}); to the SCSI stack loaded ${ic_m} s (runs: ${ic[*]})"
awk -v a="$is_m" -v c="$ic_m" -v b="$ib_m" 'BEGIN{if (b > 0) printf "guest work ratio: agent serving/bare init = %.3f, SCSI ready/bare init = %.3f\n", a/b, c/b}'

# The host CPU of one start alone, c8s against bare: the part of the
# headline ratio that is CPU (QEMU's vCPU is the guest's own work).
echo "== host CPU of one start alone (CPU seconds by process and thread; perf sched_stat_runtime)"
cpu_start "$CD_DIR/cpu-one.data"
c8s_run cpu-one >/dev/null || echo "c8s pod: FAILED (its CPU below is of a failed start)"
cpu_stop "$CD_DIR/cpu-one.data" "$CD_PID $BASHPID" 1 >"$CD_DIR/cpu-one-c8s"
cpu_start "$CD_DIR/cpu-one.data"
bare_boot cpu-one >/dev/null || echo "bare boot: FAILED (its CPU below is of a failed boot)"
cpu_stop "$CD_DIR/cpu-one.data" "$BASHPID" 1 >"$CD_DIR/cpu-one-bare"
echo "c8s pod:   $(cpu_line "$CD_DIR/cpu-one-c8s")"
echo "bare boot: $(cpu_line "$CD_DIR/cpu-one-bare")"
awk 'FNR==1 {v[++i]=$2} END{if (i == 2 && v[2] > 0) printf "host CPU ratio c8s/bare, one alone = %.3f\n", v[1]/v[2]}' "$CD_DIR/cpu-one-c8s" "$CD_DIR/cpu-one-bare"

if ((LOAD_RUNS == 0)); then
	echo "== start under load: not measured (LOAD_RUNS=0)"
	exit 0
fi

# ---------------------------------------------------------------------------
# Start under load: N at once. Latency is each one's launch to exit;
# throughput is N over the wall time until the last one ends.
leftovers() { # what a batch must not leave: QEMU processes, shims, VM dirs
	pgrep -f "qemu-system.*$CD_DIR" || true
	pgrep -f "containerd-shim-c8s-v2.*$CD_DIR" || true
	find "$CD_DIR/c8s-state" -mindepth 1 -maxdepth 3 -name console.log 2>/dev/null || true
}
batch() { # KIND ROUND: N at once; prints "wall_ms lat1 lat2 ..." (host CPU per pod in DIR/cpu)
	local kind=$1 round=$2 t0 i dir wall roots=$BASHPID pids=()
	dir=$CD_DIR/batch-$kind-$round
	mkdir -p "$dir"
	[[ $kind == c8s ]] && roots+=" $CD_PID"
	cpu_start "$dir/perf.data"
	t0=$(now)
	for i in $(seq "$N"); do
		if [[ $kind == c8s ]]; then
			(c8s_run "load-$round-$i" >"$dir/$i" 2>"$dir/$i.err" || echo FAIL >"$dir/$i") &
		else
			(bare_boot "load-$round-$i" >"$dir/$i" 2>"$dir/$i.err" || echo FAIL >"$dir/$i") &
		fi
		pids+=($!)
	done
	wait "${pids[@]}"
	wall=$(ms_since "$t0")
	cpu_stop "$dir/perf.data" "$roots" "$N" >"$dir/cpu"
	echo "$wall $(for i in $(seq "$N"); do cat "$dir/$i"; done | tr '\n' ' ')"
}
echo "== start under load: $N pods at once against $N bare boots at once ($LOAD_RUNS rounds each, interleaved; load $(cut -d' ' -f1-3 /proc/loadavg))"
before=$(ls -A "$CD_DIR/c8s-state" | sort | tr '\n' ' ')
c_lat=() b_lat=() c_tp=() b_tp=() failed=0
for r in $(seq "$LOAD_RUNS"); do
	for kind in c8s bare; do
		read -r wall lats <<<"$(batch "$kind" "$r")"
		if grep -q FAIL <<<"$lats"; then
			failed=1
			echo "round $r: a $kind start FAILED:"
			{ cat "$CD_DIR/batch-$kind-$r"/*.err; [[ $kind == bare ]] && tail -n 5 "$bare"/console-load-"$r"-*.log; } 2>/dev/null | head -n 20 || true
		fi
		tp=$(awk -v n="$N" -v w="$wall" 'BEGIN{printf "%.1f", n*60000/w}')
		echo "round $r $kind: $N in ${wall} ms = ${tp} per min; latencies ms: $lats"
		echo "  host CPU per pod: $(cpu_line "$CD_DIR/batch-$kind-$r/cpu")"
		if [[ $kind == c8s ]]; then c_lat+=($lats); c_tp+=("$tp"); else b_lat+=($lats); b_tp+=("$tp"); fi
	done
done
after=$(ls -A "$CD_DIR/c8s-state" | sort | tr '\n' ' ')
left=$(leftovers)
c_tpm=$(printf '%s\n' "${c_tp[@]}" | median)
b_tpm=$(printf '%s\n' "${b_tp[@]}" | median)
num() { grep -E '^[0-9]+$' || true; }
echo "c8s:  throughput median ${c_tpm} pods/min; latency p50 $(printf '%s\n' "${c_lat[@]}" | num | pct 50) ms, p95 $(printf '%s\n' "${c_lat[@]}" | num | pct 95) ms"
echo "bare: throughput median ${b_tpm} boots/min; latency p50 $(printf '%s\n' "${b_lat[@]}" | num | pct 50) ms, p95 $(printf '%s\n' "${b_lat[@]}" | num | pct 95) ms"
awk -v a="$c_tpm" -v b="$b_tpm" 'BEGIN{printf "ratio c8s/bare throughput, %d at once = %.3f (goal >= 0.75)\n", '"$N"', a/b}'
if ((have_perf)); then
	# Per-pod host CPU, median over the rounds, by class: with both cores
	# saturated, the throughput ratio is about the inverse of the CPU ratio.
	cpu_median() { # KIND CLASS
		cat "$CD_DIR"/batch-"$1"-*/cpu 2>/dev/null | awk -v c="$2" '{v=$NF; $NF=""; sub(/ $/, "")} $0 == c {print v}' | median
	}
	c_cpu=$(cpu_median c8s total) b_cpu=$(cpu_median bare total)
	echo "host CPU per pod, $N at once (median of the rounds, s): c8s $c_cpu, bare $b_cpu"
	cat "$CD_DIR"/batch-c8s-*/cpu "$CD_DIR"/batch-bare-*/cpu | awk '{$NF=""; sub(/ $/, ""); if ($0 != "total" && !seen[$0]++) print}' |
		while read -r class; do
			cv=$(cpu_median c8s "$class") bv=$(cpu_median bare "$class")
			awk -v c="$cv" -v b="$bv" 'BEGIN{exit !(c+0 >= 0.005 || b+0 >= 0.005)}' || continue
			printf '  %-22s c8s %6s  bare %6s\n' "$class" "$cv" "$bv"
		done
	awk -v a="$c_cpu" -v b="$b_cpu" 'BEGIN{if (a > 0 && b > 0) printf "host CPU ratio c8s/bare, %d at once = %.3f (its inverse, %.3f, is the throughput ratio CPU alone allows)\n", '"$N"', a/b, b/a}'
fi
if ((failed)); then echo "FAIL: a start under load failed"; fi
if [[ -n $left || $before != "$after" ]]; then
	echo "LEAK: left behind: ${left:-none}; state dir before: [$before] after: [$after]"
else
	echo "nothing leaked: no QEMU, no shim, state dir as before"
fi
# The shim's trace of the pods started at once: a phase that some pods
# wait in much longer than others (latencies spread in steps) is a lock
# or a single-threaded step they queue for; on saturated cores every
# phase stretches alike.
echo "== pod start trace under load: per phase over the $((N * LOAD_RUNS)) pods at once, ms: min / median / max"
load_trace() { grep -F "msg=\"pod start trace\"" "$log" | grep -E "container=load-[0-9]+-[0-9]+( |$)" || true; }
for p in $phases; do
	vals=$(load_trace | grep -o "[ ]${p}_ms=[0-9]*" | cut -d= -f2 | sort -n || true)
	[[ -n $vals ]] || continue
	printf '  %-26s %6s / %6s / %6s\n' "$p" "$(head -n 1 <<<"$vals")" "$(median <<<"$vals")" "$(tail -n 1 <<<"$vals")"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
