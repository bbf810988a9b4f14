# Shell helpers shared by demo.sh and bench.sh: a private containerd with
# its own root, state and sockets, c8s registered, torn down on exit. The
# daemon is tests/internal/containerdtest's, the Go tests' own, through its
# command tests/cmd/c8s-containerd.
# Source it, then call cd_start; it sets CD_DIR, CD_SOCK and the ctr function.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS_BIN=$ROOT/_output/tools/bin
IMAGE_DIR=$ROOT/_output/image
CD_BIN=$ROOT/_output/c8s-containerd

cd_start() {
	(cd "$ROOT" && go build -o "$CD_BIN" ./tests/cmd/c8s-containerd) || return 1
	local vars
	vars=$("$CD_BIN" start --namespace default --tools-bin "$TOOLS_BIN" --path-prefix "$ROOT/bin" \
		--log-level "${CD_LOG_LEVEL:-warn}") || return 1
	eval "$vars"
	trap cd_stop EXIT
	mkdir -p "$CD_DIR/c8s-state"
	cat >"$CD_DIR/c8s.toml" <<TOML
[hypervisor]
kernel = "$IMAGE_DIR/vmlinuz"
initrd = "$IMAGE_DIR/initrd.img"
tee = "sim"
accel = "auto"
[runtime]
state_dir = "$CD_DIR/c8s-state"
TOML
}

ctr() { "$TOOLS_BIN/ctr" -a "$CD_SOCK" "$@"; }

cd_import_busybox() {
	(cd "$ROOT" && go run ./tests/cmd/mkbusyboximage "$CD_DIR/busybox.tar") >/dev/null
	ctr images import "$CD_DIR/busybox.tar" >/dev/null
}

cd_stop() {
	if [[ -n ${CD_DIR:-} ]]; then
		"$CD_BIN" stop --dir "$CD_DIR" || true
		CD_DIR=
	fi
}
