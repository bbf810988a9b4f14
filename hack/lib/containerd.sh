# Shell helpers shared by demo.sh and bench.sh: a private containerd with
# its own root, state and sockets, c8s registered, torn down on exit.
# Source it, then call cd_start; it sets CD_DIR, CD_SOCK and the ctr function.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS_BIN=$ROOT/_output/tools/bin
IMAGE_DIR=$ROOT/_output/image

cd_start() {
	CD_DIR=$(mktemp -d /tmp/c8s-containerd.XXXXXX)
	CD_SOCK=$CD_DIR/containerd.sock
	mkdir -p "$CD_DIR/root" "$CD_DIR/state" "$CD_DIR/c8s-state"
	cat >"$CD_DIR/config.toml" <<TOML
version = 3
disabled_plugins = ["io.containerd.grpc.v1.cri"]
root = "$CD_DIR/root"
state = "$CD_DIR/state"
[grpc]
  address = "$CD_SOCK"
[ttrpc]
  address = "$CD_SOCK.ttrpc"
TOML
	cat >"$CD_DIR/c8s.toml" <<TOML
[hypervisor]
kernel = "$IMAGE_DIR/vmlinuz"
initrd = "$IMAGE_DIR/initrd.img"
tee = "sim"
accel = "auto"
[runtime]
state_dir = "$CD_DIR/c8s-state"
TOML
	PATH=$ROOT/bin:$TOOLS_BIN:$PATH "$TOOLS_BIN/containerd" --config "$CD_DIR/config.toml" --log-level "${CD_LOG_LEVEL:-warn}" >"$CD_DIR/containerd.log" 2>&1 &
	CD_PID=$!
	trap cd_stop EXIT
	for _ in $(seq 100); do
		[[ -S $CD_SOCK ]] && "$TOOLS_BIN/ctr" -a "$CD_SOCK" version >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "containerd did not come up; its log:" >&2
	cat "$CD_DIR/containerd.log" >&2
	return 1
}

ctr() { "$TOOLS_BIN/ctr" -a "$CD_SOCK" "$@"; }

cd_import_busybox() {
	(cd "$ROOT" && go run ./tests/cmd/mkbusyboximage "$CD_DIR/busybox.tar") >/dev/null
	ctr images import "$CD_DIR/busybox.tar" >/dev/null
}

cd_stop() {
	if [[ -n ${CD_PID:-} ]]; then
		for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s KILL "$t" >/dev/null 2>&1 || true; done
		sleep 0.5
		for t in $(ctr tasks ls -q 2>/dev/null); do ctr tasks delete -f "$t" >/dev/null 2>&1 || true; done
		for c in $(ctr containers ls -q 2>/dev/null); do ctr containers delete "$c" >/dev/null 2>&1 || true; done
		kill "$CD_PID" 2>/dev/null || true
		wait "$CD_PID" 2>/dev/null || true
		CD_PID=
	fi
	if [[ -n ${CD_DIR:-} ]]; then
		umount -R "$CD_DIR/state" 2>/dev/null || true
		rm -rf "$CD_DIR"
	fi
}
