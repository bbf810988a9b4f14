#!/usr/bin/env bash
# Usage: hack/build-tools.sh OUTDIR [GROUP...]
#
# GROUP is containerd, kubernetes or staticcheck; without one, containerd
# and kubernetes are built. `make demo` builds only containerd: it needs
# nothing else; `make lint` (hack/lint.sh) builds only staticcheck.
#
# Builds containerd, ctr and containerd-shim-runc-v2 into OUTDIR from the tools
# module in tests/tools, at the containerd version that the root go.mod
# requires (the version the shim is built against), and etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kubelet from the module in
# tests/tools/kubernetes, at the k8s.io/kubernetes version it requires (for
# the real-Kubernetes e2e tests), and staticcheck from the module in tests/tools/staticcheck, at the
# honnef.co/go/tools version it requires. Each group is cached: a stamp
# file in OUTDIR records what was built, and a run that would build the
# same thing again does nothing.
#
# tests/tools/go.mod must require the same containerd version as go.mod; when
# it does not, the script fails and prints the command that brings it in line.
#
set -euo pipefail

if [[ $# -lt 1 ]]; then
	echo "usage: $0 OUTDIR [containerd] [kubernetes] [staticcheck]" >&2
	exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS_MOD="$ROOT/tests/tools"
OUTDIR=$1
shift
GROUPS_WANTED=" ${*:-containerd kubernetes} "
for g in $GROUPS_WANTED; do
	case $g in
	containerd | kubernetes | staticcheck) ;;
	*)
		echo "build-tools: unknown group $g (want containerd, kubernetes or staticcheck)" >&2
		exit 2
		;;
	esac
done
wanted() { [[ $GROUPS_WANTED == *" $1 "* ]]; }
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
STAMP="$OUTDIR/.c8s-tools.stamp"
GO=${GO:-go}

CONTAINERD_MOD=github.com/containerd/containerd/v2
CONTAINERD_PKGS=(
	"$CONTAINERD_MOD/cmd/containerd"
	"$CONTAINERD_MOD/cmd/ctr"
	"$CONTAINERD_MOD/cmd/containerd-shim-runc-v2"
)
CONTAINERD_BINS=(containerd ctr containerd-shim-runc-v2)

modversion() { # DIR MODULE
	(cd "$1" && "$GO" list -m -f '{{.Version}}' "$2")
}

if wanted containerd; then
	want=$(modversion "$ROOT" "$CONTAINERD_MOD")
	have=$(modversion "$TOOLS_MOD" "$CONTAINERD_MOD")
	if [[ -z "$want" ]]; then
		echo "build-tools: cannot read the $CONTAINERD_MOD version from $ROOT/go.mod" >&2
		exit 1
	fi
	if [[ "$want" != "$have" ]]; then
		cat >&2 <<EOF
build-tools: tests/tools/go.mod requires $CONTAINERD_MOD $have,
but the root go.mod requires $want. Bring the tools module in line with:
  (cd tests/tools && go get $CONTAINERD_MOD@$want && go mod tidy)
EOF
		exit 1
	fi
fi

# build_group NAME STAMP MODDIR "PKGS..." "BINS..." STAMP_CONTENT [GO BUILD FLAGS...]
# builds PKGS in MODDIR into OUTDIR unless STAMP and every BIN say it is done.
# A package whose binary is named "server" (etcd) is installed as "etcd".
build_group() {
	local name=$1 stamp=$2 moddir=$3 pkgs=$4 bins=$5 content=$6
	shift 6
	local cached=1 bin
	if [[ ! -f "$stamp" ]] || [[ "$(cat "$stamp")" != "$content" ]]; then
		cached=0
	fi
	for bin in $bins; do
		[[ -x "$OUTDIR/$bin" ]] || cached=0
	done
	if [[ $cached -eq 1 ]]; then
		echo "build-tools: $name already built in $OUTDIR (cached)"
		return 0
	fi
	echo "build-tools: building $name into $OUTDIR"
	rm -f "$stamp"
	local tmp start=$SECONDS
	tmp=$(mktemp -d "$OUTDIR/.build.XXXXXX")
	# shellcheck disable=SC2086
	if ! (cd "$moddir" && "$GO" build -trimpath -buildvcs=false "$@" -o "$tmp/" $pkgs); then
		rm -rf "$tmp"
		return 1
	fi
	[[ -f "$tmp/server" ]] && mv -f "$tmp/server" "$tmp/etcd"
	for bin in $bins; do
		mv -f "$tmp/$bin" "$OUTDIR/$bin"
	done
	rm -rf "$tmp"
	echo "$content" >"$stamp"
	echo "build-tools: built $bins in $((SECONDS - start)) s"
}

goversion=$("$GO" env GOVERSION)
# Without cgo, as c8s itself is built: the two builds then share every
# compiled package they have in common (the standard library first), which
# takes about 40 s off a cold `make demo` here.
wanted containerd && CGO_ENABLED=0 build_group "containerd $want" "$STAMP" "$TOOLS_MOD" "${CONTAINERD_PKGS[*]}" "${CONTAINERD_BINS[*]}" \
	"$(printf 'containerd=%s\ngo=%s\ncgo=0' "$want" "$goversion")" -tags no_btrfs

if wanted staticcheck; then
	SC_MOD="$TOOLS_MOD/staticcheck"
	sc=$(modversion "$SC_MOD" honnef.co/go/tools)
	CGO_ENABLED=0 build_group "staticcheck $sc" "$OUTDIR/.c8s-staticcheck.stamp" "$SC_MOD" honnef.co/go/tools/cmd/staticcheck staticcheck \
		"$(printf 'staticcheck=%s\ngo=%s\ncgo=0' "$sc" "$goversion")"
fi

wanted kubernetes || exit 0
KUBE_MOD="$TOOLS_MOD/kubernetes"
KUBE_PKGS=(
	go.etcd.io/etcd/server/v3
	k8s.io/kubernetes/cmd/kube-apiserver
	k8s.io/kubernetes/cmd/kube-controller-manager
	k8s.io/kubernetes/cmd/kube-scheduler
	k8s.io/kubernetes/cmd/kubelet
)
KUBE_BINS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet)
kube=$(modversion "$KUBE_MOD" k8s.io/kubernetes)
etcd=$(modversion "$KUBE_MOD" go.etcd.io/etcd/server/v3)
build_group "Kubernetes $kube (etcd $etcd)" "$OUTDIR/.c8s-kube.stamp" "$KUBE_MOD" "${KUBE_PKGS[*]}" "${KUBE_BINS[*]}" \
	"$(printf 'kubernetes=%s\netcd=%s\ngo=%s' "$kube" "$etcd" "$goversion")"
