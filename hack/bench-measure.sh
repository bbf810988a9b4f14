#!/usr/bin/env bash
# Wall time of `c8s-measure snp` against the reference tool
# virtee/sev-snp-measure (Python) and against the floor of hashing the same
# bytes, for an 8-vCPU SNP guest with a direct kernel boot.
#
#   hack/bench-measure.sh              # RUNS=10 runs each, medians
#   KERNEL=... INITRD=... hack/bench-measure.sh
#
# Inputs: the AmdSevX64 fixture (testdata/snp/ovmf_AmdSev_suffix.bin),
# the newest /boot/vmlinuz-* and its /boot/initrd.img-* (synthetic 8 MiB and
# 32 MiB files when absent). The reference tool is taken, without network,
# from its fetched mirror ../.mirror/virtee+sev-snp-measure next to the
# repository, copied to a scratch directory for the run (never into the
# repository); it needs python3 (Debian's, with python3-cryptography: see
# hack/install-deps.sh). Without the mirror the c8s figures are still printed.
# REFERENCE_MIRROR overrides the mirror's git directory.
#
# Goals: >= 20x faster than the reference; within 1.5x of the hash floor.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
RUNS=${RUNS:-10}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ovmf=$ROOT/testdata/snp/ovmf_AmdSev_suffix.bin
[[ -f $ovmf ]] || { echo "bench-measure: $ovmf is missing (shared fixtures)" >&2; exit 1; }
kernel=${KERNEL:-$(ls -1 /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n1 || true)}
initrd=${INITRD:-}
if [[ -z $initrd && -n $kernel ]]; then
	initrd=/boot/initrd.img-${kernel#/boot/vmlinuz-}
fi
if [[ -z $kernel || ! -r $kernel || ! -r $initrd ]]; then
	kernel=$tmp/kernel initrd=$tmp/initrd
	head -c $((8 << 20)) /dev/urandom >"$kernel"
	head -c $((32 << 20)) /dev/urandom >"$initrd"
fi
common=(--ovmf "$ovmf" --vcpu-type EPYC-v4 --kernel "$kernel" --initrd "$initrd" --append "console=ttyS0 root=/dev/vda")
args=(--vcpus 8 "${common[@]}")

go build -trimpath -o "$tmp/c8s-measure" ./measurements/cmd/c8s-measure

now() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END{print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# time_ms CMD...: median wall time in ms over RUNS runs (after one warm-up).
time_ms() {
	"$@" >/dev/null
	for _ in $(seq "$RUNS"); do
		local t0; t0=$(now)
		"$@" >/dev/null
		echo $((($(now) - t0) / 1000))
	done | median | awk '{printf "%.1f", $1/1000}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }

bytes=$(($(stat -c %s "$ovmf") + $(stat -c %s "$kernel") + $(stat -c %s "$initrd")))
echo "inputs: $ovmf, $kernel, $initrd ($((bytes >> 20)) MiB); 8 vCPUs; median of $RUNS runs"

c8s=$(time_ms "$tmp/c8s-measure" snp "${args[@]}")
floor384=$(time_ms sha384sum "$ovmf" "$kernel" "$initrd")
floor256=$(time_ms sha256sum "$kernel" "$initrd")
echo "c8s-measure snp:                 ${c8s} ms"
echo "floor sha384sum (all inputs):    ${floor384} ms   c8s/floor = $(ratio "$c8s" "$floor384")  (goal <= 1.5)"
echo "floor sha256sum (kernel+initrd): ${floor256} ms   c8s/floor = $(ratio "$c8s" "$floor256")  (QEMU hashes kernel and initrd with SHA-256)"
c8sset=$(time_ms "$tmp/c8s-measure" snp --vcpus 1-8 "${common[@]}")
echo "c8s-measure snp --vcpus 1-8:     ${c8sset} ms   (8 digests)"

# In-process: the library against Go's own SHA-256 of the same bytes
# (synthetic 8 MiB kernel + 32 MiB initrd, see measurements/snp/bench_test.go).
go test -run '^$' -bench 'BenchmarkSNPKernel' -benchtime "${BENCHTIME:-10x}" ./measurements/snp |
	awk '/^BenchmarkSNPKernel/{sub(/-[0-9]+$/, "", $1); t[$1]=$3/1e6; printf "go %-32s %8.1f ms\n", $1, $3/1e6}
	     END{if (t["BenchmarkSNPKernelFloorSHA256"]) printf "go library/SHA-256 floor = %.2f\n", t["BenchmarkSNPKernel"]/t["BenchmarkSNPKernelFloorSHA256"]}'

mirror=${REFERENCE_MIRROR:-$ROOT/../.mirror/virtee+sev-snp-measure/repo}
py=/usr/bin/python3
[[ -x $py ]] || py=$(command -v python3 || true)
if [[ ! -d $mirror || -z $py ]]; then
	echo "reference tool not available (need $mirror and python3); c8s figures only"
	exit 0
fi
mkdir "$tmp/ref"
git --git-dir "$mirror" archive HEAD | tar -x -C "$tmp/ref"
ref() { (cd "$tmp/ref" && "$py" sev-snp-measure.py --mode snp "$@"); }
ours_out=$("$tmp/c8s-measure" snp "${args[@]}")
ref_out=$(ref "${args[@]}")
if [[ $ours_out == "$ref_out" ]]; then
	echo "digests: identical ($ours_out)"
else
	echo "digests: DIFFER: c8s $ours_out, reference $ref_out" >&2
	exit 1
fi
refms=$(time_ms ref "${args[@]}")
echo "reference sev-snp-measure (${py}, $(git --git-dir "$mirror" rev-parse --short HEAD)): ${refms} ms"
echo "speedup: $(ratio "$refms" "$c8s")x  (goal >= 20)"
echo "speedup for 8 shapes (1 c8s run vs 8 reference runs): $(ratio "$(awk -v r="$refms" 'BEGIN{print 8*r}')" "$c8sset")x"
