#!/usr/bin/env bash
# Usage: hack/build-critools.sh OUTDIR
#
# Builds crictl and critest (cri-tools) into OUTDIR, and the CNI plugins
# critest's pods need (bridge, host-local, loopback, portmap) into OUTDIR/cni,
# from the tools module in tests/tools/critools, at the versions its go.mod
# requires. critest is a Go
# test binary, built with `go test -c` as cri-tools' own Makefile does. The
# build is cached: a stamp file in OUTDIR records what was built, and a run
# that would build the same thing again does nothing.
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 OUTDIR" >&2
	exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
MOD_DIR="$ROOT/tests/tools/critools"
OUTDIR=$1
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
STAMP="$OUTDIR/.c8s-critools.stamp"
GO=${GO:-go}
CRITOOLS_MOD=sigs.k8s.io/cri-tools
CNI_MOD=github.com/containernetworking/plugins
CNI_PKGS=(
	"$CNI_MOD/plugins/main/bridge"
	"$CNI_MOD/plugins/main/loopback"
	"$CNI_MOD/plugins/ipam/host-local"
	"$CNI_MOD/plugins/meta/portmap"
)

version=$(cd "$MOD_DIR" && "$GO" list -m -f '{{.Version}}' "$CRITOOLS_MOD")
cni_version=$(cd "$MOD_DIR" && "$GO" list -m -f '{{.Version}}' "$CNI_MOD")
stamp_content() {
	echo "cri-tools=$version"
	echo "cni-plugins=$cni_version"
	echo "go=$("$GO" env GOVERSION)"
}
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_content)" && -x "$OUTDIR/crictl" && -x "$OUTDIR/critest" && -x "$OUTDIR/cni/bridge" ]]; then
	echo "build-critools: crictl and critest $version already built in $OUTDIR (cached)"
	exit 0
fi

echo "build-critools: building crictl and critest $version, CNI plugins $cni_version into $OUTDIR"
rm -f "$STAMP"
tmp=$(mktemp -d "$OUTDIR/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
ldflags="-X $CRITOOLS_MOD/pkg/version.Version=$version"
(
	cd "$MOD_DIR"
	"$GO" build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/crictl" "$CRITOOLS_MOD/cmd/crictl"
	"$GO" test -c -trimpath -buildvcs=false -ldflags "$ldflags" -o "$tmp/critest" "$CRITOOLS_MOD/cmd/critest"
	mkdir -p "$tmp/cni"
	CGO_ENABLED=0 "$GO" build -trimpath -buildvcs=false -o "$tmp/cni/" "${CNI_PKGS[@]}"
)
mv -f "$tmp/crictl" "$tmp/critest" "$OUTDIR/"
rm -rf "$OUTDIR/cni"
mv "$tmp/cni" "$OUTDIR/cni"
stamp_content >"$STAMP"
echo "build-critools: built crictl, critest and the CNI plugins in $((SECONDS - start)) s"
