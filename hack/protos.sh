#!/usr/bin/env bash
# Generates the ttrpc APIs (guest/api, shim/api) from their .proto files, or,
# with "check", fails when the committed generated code is not current.
# The plugins are built at the versions go.mod pins, so output is stable.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-generate}

command -v protoc >/dev/null || { echo "protoc not found: run 'make deps' (Debian package protobuf-compiler)" >&2; exit 1; }
plugins=$PWD/_output/tools/protoc-bin
pbver=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
ttrpcver=$(go list -m -f '{{.Version}}' github.com/containerd/ttrpc)
stamp="$plugins/.versions"
if [[ ! -x $plugins/protoc-gen-go || ! -x $plugins/protoc-gen-go-ttrpc || "$(cat "$stamp" 2>/dev/null)" != "$pbver $ttrpcver" ]]; then
	mkdir -p "$plugins"
	# From this module, so the versions and checksums are go.mod's and
	# go.sum's, and a warm module cache needs no network.
	go build -o "$plugins/" google.golang.org/protobuf/cmd/protoc-gen-go github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc
	echo "$pbver $ttrpcver" >"$stamp"
fi

out=$PWD
if [[ $mode == check ]]; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
protos=$(find guest/api shim/api -name '*.proto' | sort)
PATH=$plugins:$PATH protoc -I . -I /usr/include \
	--go_out="$out" --go_opt=module=github.com/c8s-dev/c8s \
	--go-ttrpc_out="$out" --go-ttrpc_opt=module=github.com/c8s-dev/c8s \
	$protos

if [[ $mode == check ]]; then
	status=0
	for f in $(cd "$out" && find guest/api shim/api -name '*.go' | sort); do
		if ! cmp -s "$out/$f" "$f"; then
			echo "out of date: $f (run 'make protos' and commit the result)" >&2
			status=1
		fi
	done
	[[ $status == 0 ]] && echo "generated APIs in guest/api and shim/api are current"
	exit $status
fi
