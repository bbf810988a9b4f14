#!/usr/bin/env bash
# Installs c8s on this node: binaries, guest image, c8s config and the
# containerd drop-in. Existing configs are kept; run again to upgrade the
# binaries and image. containerd is not restarted.
#   PREFIX (default /usr/local), SYSCONFDIR (default /etc), DESTDIR (staging root)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:-${PREFIX:-/usr/local}}
SYSCONFDIR=${SYSCONFDIR:-/etc}
DESTDIR=${DESTDIR:-}
image=_output/image

for f in bin/containerd-shim-c8s-v2 bin/c8s-launcher bin/c8s-measure "$image/vmlinuz" "$image/initrd.img" "$image/manifest.json"; do
	[[ -f $f ]] || { echo "install: $f is missing: run 'make build image' first" >&2; exit 1; }
done

render() { sed -e "s|@SYSCONFDIR@|$SYSCONFDIR|g" -e "s|@DATADIR@|$PREFIX/share|g" "$1"; }

install -d "$DESTDIR$PREFIX/bin" "$DESTDIR$PREFIX/share/c8s" "$DESTDIR$SYSCONFDIR/c8s" "$DESTDIR$SYSCONFDIR/containerd/conf.d"
install -m 0755 bin/containerd-shim-c8s-v2 bin/c8s-launcher bin/c8s-measure "$DESTDIR$PREFIX/bin/"
install -m 0644 "$image/vmlinuz" "$image/initrd.img" "$image/manifest.json" "$DESTDIR$PREFIX/share/c8s/"

conf=$DESTDIR$SYSCONFDIR/c8s/config.toml
if [[ -e $conf ]]; then
	echo "kept existing $conf"
else
	render packaging/c8s/config.toml >"$conf"
	echo "wrote $conf"
fi
render packaging/containerd/c8s.toml >"$DESTDIR$SYSCONFDIR/containerd/conf.d/c8s.toml"
echo "wrote $DESTDIR$SYSCONFDIR/containerd/conf.d/c8s.toml"
if [[ -f $DESTDIR$SYSCONFDIR/containerd/config.toml ]] && ! grep -q 'conf.d' "$DESTDIR$SYSCONFDIR/containerd/config.toml"; then
	echo "note: $SYSCONFDIR/containerd/config.toml does not import conf.d; add: imports = [\"$SYSCONFDIR/containerd/conf.d/*.toml\"]"
fi
echo "installed c8s into $DESTDIR$PREFIX; restart containerd to pick up the CRI handler"
