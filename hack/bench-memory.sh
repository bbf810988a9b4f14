#!/usr/bin/env bash
# Memory figures of issue 18, from /proc/PID/smaps_rollup and smaps.
#
#   hack/bench-memory.sh procs C8S_SHIM_PID RUNC_SHIM_PID QEMU_PID
#     the c8s shim against containerd-shim-runc-v2 in the same run: RSS,
#     PSS, and PSS split into anonymous and file-backed pages, with the
#     ratios (goal: RSS <= 1.2x); then the pod's QEMU split into the guest
#     RAM mapping, the TCG translation buffer (the rwx mapping), QEMU's
#     binary and libraries, and the rest (heap, thread arenas, stacks).
#   hack/bench-memory.sh pods N
#     N busybox pods running at once on a private containerd: QEMU RSS per pod
#     (mean, min, max) with the same split, and the shims' mean RSS and PSS
#     against N runc containers' shims in the same run, with the ratios (the
#     shims of each kind share their binary's page cache, so PSS < RSS).
set -euo pipefail
cd "$(dirname "$0")/.."

# rollup PID: "RSS PSS PSS_ANON PSS_FILE" in KiB.
rollup() {
	awk '/^Rss:/{r=$2} /^Pss:/{p=$2} /^Pss_Anon:/{a=$2} /^Pss_File:/{f=$2} END{print r+0, p+0, a+0, f+0}' "/proc/$1/smaps_rollup"
}

# qemu_split PID: "GUEST_RAM TCG_BUF FILE OTHER" resident KiB. The guest
# RAM is the largest anonymous (or memfd) mapping, the TCG buffer the rwx
# one; FILE is every mapping of a file on disk.
qemu_split() {
	awk '
	/^[0-9a-f]+-[0-9a-f]+ /{ if (name != "") done(); perm=$2; path=$6; for (i=7;i<=NF;i++) path=path" "$i; name=$1; next }
	/^Size:/{ size=$2 } /^Rss:/{ rss=$2 }
	function done() {
		if (perm ~ /x/ && perm ~ /w/) tcg += rss
		else if (path ~ /^\// && path !~ /^\/memfd:/) file += rss
		else { if (size > big) { other += bigrss; big = size; bigrss = rss } else other += rss }
		name = ""
	}
	END { done(); print bigrss+0, tcg+0, file+0, other+0 }' "/proc/$1/smaps"
}

# shim_split PID: "TEXT RODATA DATA ANON" resident KiB of a (static Go)
# shim: its binary's code, read-only data (rodata, type data, pclntab) and
# data/bss mappings, and the anonymous memory (heap, goroutine stacks, GC
# and runtime metadata). The binary's pages come from the page cache, and
# a binary's size shows nearly 1:1 in TEXT and RODATA: the kernel maps the
# cached pages around each one touched (fault-around).
shim_split() {
	local exe
	exe=$(readlink "/proc/$1/exe")
	awk -v exe="$exe" '
	/^[0-9a-f]+-[0-9a-f]+ /{ if (name != "") done(); perm=$2; path=$6; name=$1; next }
	/^Rss:/{ rss=$2 }
	function done() {
		if (path == exe) { if (perm ~ /x/) text += rss; else if (perm ~ /w/) data += rss; else ro += rss }
		else if (path == "" || path ~ /^\[(heap|stack)/) anon += rss
		name = ""
	}
	END { done(); print text+0, ro+0, data+0, anon+0 }' "/proc/$1/smaps"
}

# reporting PID: whether the QEMU's guest hands freed pages back (the sim
# TEE's free page reporting balloon, launcher/vm/tee/sim): its guest RAM
# figure is then what the guest holds, not every page it ever touched.
reporting() {
	if tr '\0' ' ' <"/proc/$1/cmdline" | grep -q 'free-page-reporting=on'; then
		echo "free page reporting on"
	else
		echo "no free page reporting"
	fi
}

procs() {
	local c8s=$1 runc=$2 qemu=$3
	read -r cr cp ca cf < <(rollup "$c8s")
	read -r rr rp ra rf < <(rollup "$runc")
	echo "containerd-shim-c8s-v2:  RSS ${cr} KiB, PSS ${cp} KiB (anon ${ca}, file ${cf})"
	echo "containerd-shim-runc-v2: RSS ${rr} KiB, PSS ${rp} KiB (anon ${ra}, file ${rf})"
	awk -v a="$cr" -v b="$rr" -v c="$cp" -v d="$rp" -v e="$ca" -v f="$ra" -v g="$cf" -v h="$rf" 'BEGIN{
		printf "ratio c8s-shim/runc-shim RSS = %.3f (goal <= 1.2); PSS = %.3f; anon = %.3f; file = %.3f\n", a/b, c/d, e/f, g/h }'
	local s
	for s in "c8s $c8s" "runc $runc"; do
		set -- $s
		read -r text ro data anon < <(shim_split "$2")
		echo "  $1 shim resident by mapping: text ${text} KiB, rodata ${ro} KiB, data/bss ${data} KiB, anonymous ${anon} KiB"
	done
	read -r qr qp _ _ < <(rollup "$qemu")
	read -r ram tcg file other < <(qemu_split "$qemu")
	echo "QEMU host RSS per pod: ${qr} KiB ($((qr / 1024)) MiB), PSS ${qp} KiB: guest RAM touched $((ram / 1024)) MiB ($(reporting "$qemu")), TCG translation buffer $((tcg / 1024)) MiB, QEMU binary and libraries $((file / 1024)) MiB, heap/arenas/stacks $((other / 1024)) MiB"
}

pods() {
	local n=$1
	source hack/lib/containerd.sh
	cd_start
	cd_import_busybox
	local img=docker.io/c8s/busybox:test cfg=$CD_DIR/c8s.toml i
	ctr run --runtime io.containerd.c8s.v2 --runtime-config-path "$cfg" --rm "$img" warmup true
	# One after the other: the figure is memory with N pods running (the
	# start under load is hack/bench-start.sh's); a pod that fails to start
	# only lowers the running count printed.
	for i in $(seq "$n"); do
		ctr run -d --runtime io.containerd.c8s.v2 --runtime-config-path "$cfg" "$img" "mem-$i" sleep 600 >/dev/null || true
	done
	sleep 5
	local qs=() ss=()
	mapfile -t qs < <(pgrep -f "qemu-system.*$CD_DIR/c8s-state")
	mapfile -t ss < <(pgrep -f "containerd-shim-c8s-v2 .*-address $CD_SOCK")
	local line
	[[ ${#qs[@]} -gt 0 ]] && echo "pod VMs: $(reporting "${qs[0]}") (guest RAM is what the guest holds or has touched since it last reported)"
	for q in "${qs[@]}"; do line="$(rollup "$q") $(qemu_split "$q")"; echo "$line"; done | awk -v n="${#qs[@]}" -v want="$n" '
		{ r[NR]=$1; p+=$2; ram+=$5; tcg+=$6; file+=$7; other+=$8; s+=$1; if (min==""||$1<min) min=$1; if ($1>max) max=$1 }
		END { printf "%d pods started, %d running: QEMU RSS per pod mean %d MiB (min %d, max %d), PSS mean %d MiB; guest RAM touched %d MiB, TCG buffer %d MiB, QEMU binary and libraries %d MiB, heap/arenas/stacks %d MiB (means)\n",
			want, n, s/n/1024, min/1024, max/1024, p/n/1024, ram/n/1024, tcg/n/1024, file/n/1024, other/n/1024 }'
	# The baseline in the same run: N runc containers, one runc shim each,
	# sharing their binary as the N c8s shims share theirs (so PSS, which
	# divides shared pages among their users, compares like with like).
	for i in $(seq "$n"); do
		ctr run -d "$img" "mem-runc-$i" sleep 600 >/dev/null || true
	done
	sleep 2
	local rs=()
	mapfile -t rs < <(pgrep -f "containerd-shim-runc-v2 .*-address $CD_SOCK")
	local c r
	c=$(for s in "${ss[@]}"; do rollup "$s"; done | awk '{r+=$1; p+=$2; a+=$3; f+=$4} END{ if (NR) printf "%d %d %d %d %d", NR, r/NR, p/NR, a/NR, f/NR }')
	r=$(for s in "${rs[@]}"; do rollup "$s"; done | awk '{r+=$1; p+=$2; a+=$3; f+=$4} END{ if (NR) printf "%d %d %d %d %d", NR, r/NR, p/NR, a/NR, f/NR }')
	local split='{t+=$1; o+=$2; d+=$3; a+=$4} END{ if (NR) printf "  %s shims resident by mapping (means): text %d KiB, rodata %d KiB, data/bss %d KiB, anonymous %d KiB\n", k, t/NR, o/NR, d/NR, a/NR }'
	for s in "${ss[@]}"; do shim_split "$s"; done | awk -v k=c8s "$split"
	for s in "${rs[@]}"; do shim_split "$s"; done | awk -v k=runc "$split"
	awk -v c="$c" -v r="$r" 'BEGIN{
		split(c, x, " "); split(r, y, " ")
		if (x[1]) printf "the %d c8s shims: RSS mean %d KiB, PSS mean %d KiB (anon %d, file %d)\n", x[1], x[2], x[3], x[4], x[5]
		if (y[1]) printf "the %d runc shims: RSS mean %d KiB, PSS mean %d KiB (anon %d, file %d)\n", y[1], y[2], y[3], y[4], y[5]
		if (x[1] && y[1]) printf "ratio c8s-shim/runc-shim with %d and %d running: RSS = %.3f (goal <= 1.2); PSS = %.3f; anon = %.3f; file PSS = %.3f\n", x[1], y[1], x[2]/y[2], x[3]/y[3], x[4]/y[4], x[5]/y[5] }'
	for i in $(seq "$n"); do ctr tasks kill -s KILL "mem-$i" >/dev/null 2>&1 || true; ctr tasks kill -s KILL "mem-runc-$i" >/dev/null 2>&1 || true; done
	sleep 2
	for i in $(seq "$n"); do
		for t in "mem-$i" "mem-runc-$i"; do ctr tasks delete "$t" >/dev/null 2>&1 || true; ctr containers delete "$t" >/dev/null 2>&1 || true; done
	done
}

case ${1:-} in
procs) shift; procs "$@" ;;
pods) shift; pods "${1:-10}" ;;
*) echo "usage: $0 procs C8S_SHIM RUNC_SHIM QEMU | pods N" >&2; exit 2 ;;
esac
