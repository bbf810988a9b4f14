#!/usr/bin/env bash
# Usage: hack/build-tools.sh OUTDIR
#
# Builds containerd, ctr and containerd-shim-runc-v2 into OUTDIR from the tools
# module in tests/tools, at the containerd version that the root go.mod
# requires (the version the shim is built against). The build is cached: a
# stamp file in OUTDIR records what was built, and a run that would build the
# same thing again does nothing.
#
# tests/tools/go.mod must require the same containerd version as go.mod; when
# it does not, the script fails and prints the command that brings it in line.
#
# To add a tool group later (e.g. Kubernetes components), add its packages to
# a new array below, its version to stamp_content, and one build line.
set -euo pipefail

if [[ $# -ne 1 ]]; then
	echo "usage: $0 OUTDIR" >&2
	exit 2
fi

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS_MOD="$ROOT/tests/tools"
OUTDIR=$1
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

stamp_content() {
	echo "containerd=$want"
	echo "go=$("$GO" env GOVERSION)"
}

cached=1
if [[ ! -f "$STAMP" ]] || [[ "$(cat "$STAMP")" != "$(stamp_content)" ]]; then
	cached=0
fi
for bin in "${CONTAINERD_BINS[@]}"; do
	[[ -x "$OUTDIR/$bin" ]] || cached=0
done
if [[ $cached -eq 1 ]]; then
	echo "build-tools: containerd $want already built in $OUTDIR (cached)"
	exit 0
fi

echo "build-tools: building containerd $want into $OUTDIR"
rm -f "$STAMP"
tmp=$(mktemp -d "$OUTDIR/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
(cd "$TOOLS_MOD" && "$GO" build -trimpath -buildvcs=false -tags no_btrfs -o "$tmp/" "${CONTAINERD_PKGS[@]}")
for bin in "${CONTAINERD_BINS[@]}"; do
	mv -f "$tmp/$bin" "$OUTDIR/$bin"
done
stamp_content >"$STAMP"
echo "build-tools: built ${CONTAINERD_BINS[*]} in $((SECONDS - start)) s"
