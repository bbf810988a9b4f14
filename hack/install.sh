#!/usr/bin/env bash
# Installs c8s on this node with `c8s-launcher install`: binaries, guest image
# (verified against its manifest), c8s config (an existing one is kept) and
# the c8s runtime handlers in containerd's config (a drop-in where the config
# imports one, else an edit after a timestamped backup; see launcher/admin/install).
# Idempotent; `c8s-launcher uninstall` undoes it. containerd is restarted only
# with RESTART=1.
#   PREFIX (default /usr/local), SYSCONFDIR (default /etc), DESTDIR (staging root)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-${PREFIX:-/usr/local}}
SYSCONFDIR=${SYSCONFDIR:-/etc}
DESTDIR=${DESTDIR:-}
image=_output/image

for f in bin/containerd-shim-c8s-v2 bin/c8s-launcher bin/c8s-verify bin/c8s-measure "$image/vmlinuz" "$image/initrd.img" "$image/rootfs.img" "$image/manifest.json"; do
	[[ -f $f ]] || { echo "install: $f is missing: run 'make build image' first" >&2; exit 1; }
done

args=(--root "${DESTDIR:-/}" --prefix "$PREFIX" --sysconfdir "$SYSCONFDIR" --bin-dir bin --image-dir "$image")
[[ ${RESTART:-0} == 1 ]] && args+=(--restart)
bin/c8s-launcher install "${args[@]}"
echo "installed c8s into ${DESTDIR:-/}"
