#!/usr/bin/env bash
# make bench (hack/bench.sh), issue 15: what the agent's measured policy
# costs, with the agent before it (POLICY_BASE, default d2ea3c9: the last
# commit before the policy) built and measured in the same run as this
# tree's:
#   - policy evaluation per request (guest/policy benchmarks, GOMAXPROCS=1
#     as in a 1-vCPU pod VM) over a generated pod's policy and adapted
#     specs: CreateContainer of its app container, an exec probe, ...;
#     the fastest and the median of POLICY_COUNT runs (the machine may be
#     shared: the load is printed)
#   - the agent's CreateContainer work before the OCI runtime (spec.Adapt
#     and the policy; guest/agent benchmarks), with and without the policy
#   - c8s-agent's size, a stripped static binary as `make build` builds
#     it, before and after, and the symbols of the policy's packages
#   - the agent's VmRSS and VmHWM while serving, each agent booted the same
#     way as /init of the guest image under TCG (guest/boot
#     BenchmarkAgentMemory; needs `make image` and QEMU)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${POLICY_BASE:-d2ea3c9}
COUNT=${POLICY_COUNT:-5}
BENCHTIME=${POLICY_BENCHTIME:-200ms}
MEM_COUNT=${POLICY_MEM_COUNT:-2}
IMAGE_DIR=${C8S_IMAGE_DIR:-$PWD/_output/image}
tmp=$(mktemp -d /tmp/c8s-bench-policy.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

echo "== agent policy: evaluation per request; agent size and memory before ($BASE) and after (this tree)"
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "$(nproc) cores; the load average is printed with each part (other work on the machine shows in the figures)"

# Reads benchmark output of N rounds; prints per benchmark the fastest
# and the median ns/op, B/op and allocs/op, and writes NAME MIN MEDIAN
# ALLOCS lines to the file $1 for the figures below.
summarize() {
	awk -v out="$1" '
	/^Benchmark/ {
		name = $1; sub(/-[0-9]+$/, "", name)
		for (i = 2; i < NF; i++) {
			if ($(i+1) == "ns/op") ns = $i
			if ($(i+1) == "B/op") bop = $i
			if ($(i+1) == "allocs/op") al = $i
		}
		if (!(name in n)) order[++k] = name
		v[name, ++n[name]] = ns; B[name] = bop; A[name] = al
	}
	END {
		for (j = 1; j <= k; j++) {
			nm = order[j]; c = n[nm]
			for (a = 1; a <= c; a++) s[a] = v[nm, a]
			for (a = 2; a <= c; a++) { x = s[a]; for (b = a - 1; b >= 1 && s[b] > x; b--) s[b+1] = s[b]; s[b+1] = x }
			med = (c % 2) ? s[(c+1)/2] : (s[c/2] + s[c/2+1]) / 2
			printf "%-38s min %9.0f ns/op  median %9.0f ns/op  %6d B/op  %4d allocs/op  (%d runs)\n", nm, s[1], med, B[nm], A[nm], c
			printf "%s %s %s %s\n", nm, s[1], med, A[nm] > out
		}
	}'
}
# fig NAME FIELD: a figure summarize wrote (2 min, 3 median, 4 allocs).
fig() { awk -v n="$1" -v f="$2" '$1 == n {print $f}' "$tmp/figs"; }
us() { awk -v ns="$1" 'BEGIN{printf "%.1f µs", ns/1000}'; }

echo "-- policy evaluation (guest/policy: a generated pod's policy, the specs as the guest adapted them; GOMAXPROCS=1; load $(load))"
: >"$tmp/figs"
: >"$tmp/bench.txt"
# Each test binary built once and run COUNT rounds of every benchmark, so
# that the figures a ratio compares were taken minutes apart at most.
if go test -c -o "$tmp/policy.test" ./guest/policy >"$tmp/build.txt" 2>&1 &&
	go test -c -o "$tmp/agent.test" ./guest/agent >>"$tmp/build.txt" 2>&1; then
	ok=1
	for i in $(seq "$COUNT"); do
		(cd guest/policy && GOMAXPROCS=1 "$tmp/policy.test" -test.run '^$' -test.bench . -test.benchtime "$BENCHTIME" -test.benchmem) >>"$tmp/bench.txt" 2>&1 || ok=
		(cd guest/agent && GOMAXPROCS=1 "$tmp/agent.test" -test.run '^$' -test.bench 'BenchmarkCreateContainerAdapt' -test.benchtime "$BENCHTIME" -test.benchmem) >>"$tmp/bench.txt" 2>&1 || ok=
	done
else
	ok=
	cat "$tmp/build.txt"
fi
if [[ -n $ok ]]; then
	summarize "$tmp/figs" <"$tmp/bench.txt"
	echo "policy per CreateContainer (app: 21 env entries against 15 patterns, 18 mounts, 6 namespaces): $(us "$(fig BenchmarkCreateContainer 2)") (median $(us "$(fig BenchmarkCreateContainer 3)")), $(fig BenchmarkCreateContainer 4) allocs"
	echo "policy per exec (an exec probe on the app's list of 3): $(us "$(fig BenchmarkExec 2)") (median $(us "$(fig BenchmarkExec 3)")), $(fig BenchmarkExec 4) allocs"
	a=$(fig BenchmarkCreateContainerAdapt 2) ap=$(fig BenchmarkCreateContainerAdaptPolicy 2)
	echo "agent CreateContainer before the OCI runtime (spec.Adapt of the host's JSON, then the policy): $(us "$a") without the policy, $(us "$ap") with it"
	awk -v a="$a" -v b="$ap" 'BEGIN{printf "ratio agent create path with/without policy = %.2f\n", b/a}'
else
	grep -hE '^(---|FAIL|panic)|_test.go' "$tmp/bench.txt" 2>/dev/null || true
	echo "policy benchmarks FAILED"
fi

echo "-- c8s-agent size (CGO_ENABLED=0 -trimpath -ldflags '-s -w', as make build; load $(load))"
build() { # DIR OUT [LDFLAGS]
	(cd "$1" && CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "${3-}" -o "$2" ./guest/cmd/c8s-agent)
}
have_before=
if git cat-file -e "$BASE^{commit}" 2>/dev/null; then
	# The old tree from git's objects, not a checkout: the work tree, the
	# index and the worktree list stay as they are.
	mkdir -p "$tmp/before"
	git archive "$BASE" | tar -x -C "$tmp/before"
	if build "$tmp/before" "$tmp/c8s-agent.before" '-s -w'; then have_before=1; fi
else
	echo "commit $BASE is not in this clone: no before figures"
fi
build "$PWD" "$tmp/c8s-agent.after" '-s -w'
after_b=$(stat -c %s "$tmp/c8s-agent.after")
if [[ -n $have_before ]]; then
	before_b=$(stat -c %s "$tmp/c8s-agent.before")
	echo "c8s-agent before ($BASE): $before_b bytes ($((before_b / 1024)) KiB)"
	echo "c8s-agent after (this tree): $after_b bytes ($((after_b / 1024)) KiB); +$(((after_b - before_b) / 1024)) KiB"
	awk -v a="$after_b" -v b="$before_b" 'BEGIN{printf "ratio agent size after/before = %.3f\n", a/b}'
else
	echo "c8s-agent (this tree): $after_b bytes"
fi
# What the policy's packages weigh: symbol sizes of an unstripped build
# (code and data; not the runtime's tables about them).
build "$PWD" "$tmp/c8s-agent.syms"
re_users=$(go list -deps -f '{{.ImportPath}} {{join .Imports " "}}' ./guest/cmd/c8s-agent | awk '/ regexp( |$)/{sub("github.com/c8s-dev/c8s/", "", $1); printf "%s%s", sep, $1; sep=", "}')
re_before=
if [[ -n $have_before ]] && (cd "$tmp/before" && go list -deps ./guest/cmd/c8s-agent | grep -qx regexp); then re_before=1; fi
go tool nm -size "$tmp/c8s-agent.syms" | awk -v users="$re_users" -v before="$re_before" '
	$4 ~ /^github.com\/c8s-dev\/c8s\/guest\/policy\./ { p += $2 }
	$4 ~ /^github.com\/c8s-dev\/c8s\/guest\/api\/policy\./ { ap += $2 }
	$4 ~ /^regexp(\/syntax)?\./ { re += $2 }
	END {
		printf "symbols: guest/policy %.0f KiB, guest/api/policy %.0f KiB; regexp and regexp/syntax %.0f KiB (%s; imported by %s)\n",
			p/1024, ap/1024, re/1024, before ? "linked before too" : "not linked before", users
	}'

echo "-- c8s-agent memory while serving (PID 1 of a pod VM: TCG, 1 vCPU, 512 MiB; init data, a container, an exec, a reader of /proc/1/status; median of $MEM_COUNT boots each; load $(load))"
if [[ ! -f $IMAGE_DIR/vmlinuz ]] || ! command -v qemu-system-x86_64 >/dev/null; then
	echo "no guest image in $IMAGE_DIR or no QEMU: run make image (make bench does); no memory figures"
	exit 0
fi
if C8S_IMAGE_DIR=$IMAGE_DIR C8S_BENCH_AGENT_BEFORE=${have_before:+$tmp/c8s-agent.before} C8S_BENCH_AGENT_AFTER=$tmp/c8s-agent.after \
	go test -run '^$' -bench BenchmarkAgentMemory -benchtime 1x -count "$MEM_COUNT" -timeout 15m ./guest/boot >"$tmp/mem.txt" 2>&1; then
	# mem NAME METRIC: the median over the runs.
	mem() {
		awk -v n="BenchmarkAgentMemory/$1" -v m="$2" '
			{ name = $1; sub(/-[0-9]+$/, "", name) }
			name == n { for (i = 2; i < NF; i++) if ($(i+1) == m) v[++c] = $i }
			END {
				for (a = 2; a <= c; a++) { x = v[a]; for (b = a - 1; b >= 1 && v[b] > x; b--) v[b+1] = v[b]; v[b+1] = x }
				if (c) print (c % 2) ? v[(c+1)/2] : (v[c/2] + v[c/2+1]) / 2
			}' "$tmp/mem.txt"
	}
	for m in VmRSS VmHWM RssAnon RssShmem; do
		line="$m:"
		for who in before after-nopolicy after; do
			v=$(mem "$who" "$m-KiB")
			if [[ -n $v ]]; then line+=" $who $v KiB,"; fi
		done
		echo "${line%,}"
	done
	for m in VmRSS VmHWM; do
		b=$(mem before "$m-KiB") a=$(mem after "$m-KiB")
		if [[ -n $b && -n $a ]]; then
			awk -v a="$a" -v b="$b" -v m="$m" 'BEGIN{printf "ratio agent %s after/before = %.3f\n", m, a/b}'
		fi
	done
	echo "(VmRSS is the agent's resident pages: RssAnon its heap, stacks and Go runtime; RssShmem the pages of its binary it has mapped, here from the plain image's initramfs, a tmpfs that holds the whole binary in guest RAM anyway; from the sealed image's erofs root they count as RssFile)"
else
	grep -hE '^(---|FAIL|panic)|_test.go' "$tmp/mem.txt" | head -20 || true
	echo "agent memory benchmark FAILED"
fi
