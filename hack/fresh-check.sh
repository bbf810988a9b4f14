#!/usr/bin/env bash
# make fresh-check: proves that a clone of the commit under test builds and
# passes its unit tests on a fresh Debian 12 machine, with every Debian
# package coming from `make deps`.
#
# It builds a minimal Debian 12 root with `debootstrap --variant=minbase`
# from the mirror the host's apt sources name, clones HEAD into it, and,
# inside a private mount and PID namespace chrooted there, installs make
# (the README's two commands assume it, as a machine of this kind has it)
# and runs
#   make deps build check-protos unit
# Go is not a Debian package at the version c8s uses, so the host's Go
# toolchain is bind-mounted read-only; the host's module and build caches
# are bind-mounted too for speed (FRESH_GO_CACHES=0 gives the root empty
# ones). Nothing else of the host is visible inside.
#
# Environment:
#   FRESH_ROOT       where the root is built (default _output/fresh-root;
#                    removed first, and afterwards unless FRESH_KEEP=1)
#   FRESH_MIRROR     Debian mirror (default: the first one in the host's
#                    apt sources)
#   FRESH_GO_CACHES  1 (default) shares the host's Go caches, 0 does not
#   FRESH_TARGETS    make targets run inside (default: deps build check-protos unit)
#   FRESH_PREREQS    Debian packages installed before make runs, besides make
#                    (default none; "ca-certificates git gcc libc6-dev" makes
#                    the root like a new machine of this kind, to time
#                    `FRESH_TARGETS=demo FRESH_GO_CACHES=0`)
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
FRESH_ROOT=${FRESH_ROOT:-$ROOT/_output/fresh-root}
FRESH_TARGETS=${FRESH_TARGETS:-deps build check-protos unit}
export FRESH_PREREQS=${FRESH_PREREQS:-}
SUITE=bookworm

die() {
	echo "fresh-check: $*" >&2
	exit 1
}

[[ $(id -u) -eq 0 ]] || die "run as root: debootstrap and chroot need it"
command -v debootstrap >/dev/null || die "debootstrap not found; run 'make deps'"
command -v unshare >/dev/null || die "unshare not found (util-linux)"
GOROOT_HOST=$(go env GOROOT 2>/dev/null) || die "go not found: the root borrows the host's Go toolchain"
commit=$(git -C "$ROOT" rev-parse HEAD)
if [[ -n $(git -C "$ROOT" status --porcelain --untracked-files=no) ]]; then
	echo "fresh-check: note: uncommitted changes are not part of the check; it tests commit $commit"
fi

# The mirror the host's apt uses: deb822 sources first, then one-line ones.
mirror=${FRESH_MIRROR:-}
if [[ -z $mirror ]]; then
	mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
		awk '/^URIs:/ {print $2; exit}' || true)
fi
if [[ -z $mirror ]]; then
	mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
		awk '$1 == "deb" && $0 ~ /debian/ {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' || true)
fi
[[ -n $mirror ]] || die "cannot find a Debian mirror in the host's apt sources; set FRESH_MIRROR"

start=$SECONDS
phase() { printf 'fresh-check: [%4d s] %s\n' $((SECONDS - start)) "$*"; }

cleanup() {
	# The namespace's mounts went with it; only the files remain.
	if [[ ${FRESH_KEEP:-0} != 1 ]]; then
		rm -rf --one-file-system "$FRESH_ROOT"
	fi
}
rm -rf --one-file-system "$FRESH_ROOT"
mkdir -p "$FRESH_ROOT"
trap cleanup EXIT

phase "debootstrap --variant=minbase $SUITE from $mirror"
debootstrap --variant=minbase "$SUITE" "$FRESH_ROOT" "$mirror" >"$FRESH_ROOT.debootstrap.log" 2>&1 ||
	{ tail -30 "$FRESH_ROOT.debootstrap.log" >&2; die "debootstrap failed (full log: $FRESH_ROOT.debootstrap.log)"; }
rm -f "$FRESH_ROOT.debootstrap.log"

# The same package sources as the host (security and updates included),
# and name resolution for the mirror.
rm -f "$FRESH_ROOT/etc/apt/sources.list"
mkdir -p "$FRESH_ROOT/etc/apt/sources.list.d"
if compgen -G "/etc/apt/sources.list.d/debian*.sources" >/dev/null; then
	cp /etc/apt/sources.list.d/debian*.sources "$FRESH_ROOT/etc/apt/sources.list.d/"
else
	printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$SUITE" "$mirror" "$SUITE" >"$FRESH_ROOT/etc/apt/sources.list"
fi
cp /etc/resolv.conf /etc/hosts "$FRESH_ROOT/etc/" 2>/dev/null || true
# The network's own certificate authorities (a TLS-inspecting egress, as
# here), which the machine trusts: Debian's ca-certificates adds them to
# the root's bundle when `make deps` installs it.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
	mkdir -p "$FRESH_ROOT/usr/local/share/ca-certificates"
	cp /usr/local/share/ca-certificates/*.crt "$FRESH_ROOT/usr/local/share/ca-certificates/"
fi
# Debian's minbase root has no git: the clone is made from the host, as a
# user's `git clone` would give it.
phase "clone $commit"
git clone -q --no-local --no-hardlinks "$ROOT" "$FRESH_ROOT/src/c8s"
git -C "$FRESH_ROOT/src/c8s" checkout -q "$commit"

mkdir -p "$FRESH_ROOT/usr/local/go" "$FRESH_ROOT/root/go/pkg/mod" "$FRESH_ROOT/root/.cache/go-build"
binds=(--bind "$GOROOT_HOST" /usr/local/go ro)
if [[ ${FRESH_GO_CACHES:-1} == 1 ]]; then
	mkdir -p "$(go env GOMODCACHE)" "$(go env GOCACHE)"
	binds+=(--bind "$(go env GOMODCACHE)" /root/go/pkg/mod rw --bind "$(go env GOCACHE)" /root/.cache/go-build rw)
fi

# Inside: a private mount and PID namespace, so that every mount and every
# process (QEMU a test may start) is gone when it ends.
inner=$(
	cat <<'EOS'
set -euo pipefail
R=$1; shift
# The root must be a mount point, as on a machine: runc makes / a slave
# mount, which fails on a plain directory. First, so the binds land on it.
mount --bind "$R" "$R"
while [[ $1 == --bind ]]; do
	mkdir -p "$R$3"
	mount --bind "$2" "$R$3"
	[[ $4 == ro ]] && mount -o remount,bind,ro "$R$3"
	shift 4
done
shift # --
mount -t proc proc "$R/proc"
mount --rbind /sys "$R/sys"
mount --rbind /dev "$R/dev"
mount -t tmpfs tmpfs "$R/tmp"
mount -t tmpfs tmpfs "$R/run"
exec chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive \
	PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
	GOTOOLCHAIN=local \
	bash -c 'set -e
		# What the README assumes a machine has (make; FRESH_PREREQS may add
		# what a machine of this kind has besides, to time it as one).
		apt-get update -qq && apt-get install -y -qq --no-install-recommends make '"$FRESH_PREREQS"' >/dev/null
		cd /src/c8s
		start=$(date +%s)
		make '"$*"'
		echo "fresh-check: make '"$*"' took $(($(date +%s) - start)) s inside the root"'
EOS
)
phase "inside the root: make $FRESH_TARGETS"
status=0
unshare --mount --pid --fork --propagation private bash -c "$inner" fresh "$FRESH_ROOT" "${binds[@]}" -- "$FRESH_TARGETS" || status=$?
if [[ $status != 0 ]]; then
	phase "FAILED: make $FRESH_TARGETS exited $status inside a fresh Debian 12 root"
	exit "$status"
fi
phase "passed: a fresh Debian 12 root with only 'make deps' packages built commit $commit and ran make $FRESH_TARGETS"
