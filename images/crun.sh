#!/usr/bin/env bash
# Usage: images/crun.sh CACHE
#
# Builds the guest's crun into CACHE (once; later calls reuse it) and prints
# its path: Debian 12's crun source package, with Debian's patches, built as
# a static PIE without systemd, CRIU or plugin support.
#
# Why not the crun package: Debian's crun links libsystemd, which pulls in
# libgcrypt, libgpg-error, liblzma, libzstd and liblz4 that crun never uses
# in the guest (it has no systemd). Every `crun create` and `crun start`
# loaded all ten libraries: under emulation about 100 ms of guest time per
# call, most of it the dynamic loader mapping and relocating them (issue 18).
# Built static it loads nothing: crun create 300 -> 210 ms, crun start 140
# -> 55 ms (guest console step timers, one pod each, loaded machine).
#
# What differs from the package, on purpose:
#   --disable-systemd   no systemd cgroup driver (the guest has no systemd;
#                       shim/manager/features.go claims none)
#   --disable-criu, --disable-dl  no checkpoint/restore, no handler plugins
#                       (the package has neither: its crun --version shows
#                       no +CRIU, and it ships no handlers)
#   no libgcrypt        as in the package (which was built without it): the
#                       seccomp profile is compiled at each create, not cached
#   static PIE          with Debian's hardening flags (stack protector, stack
#                       clash protection, fortify, full RELRO, BIND_NOW)
# The same source, version and commit as the package (crun --version), so
# the features the shim reports (shim/manager/features.go) still hold.
#
# Reproducible: the source is pinned by sha256, build paths are mapped to a
# fixed name, there is no debug information, ar writes no timestamps, and the
# build runs in a clean environment (no CC, CFLAGS, LIBS, PKG_CONFIG_PATH ...
# of the caller's); the cache key covers this script and the versions of the
# compiler, the kernel headers and the static libraries linked in, which
# images/build.sh records in the manifest's packages.
#
# The cache is as trusted as the checkout it belongs to, like bin/ and Go's
# build cache, from which the agent comes: a cached crun is checked again on
# every use (a static PIE, version and commit, features), which catches a
# stale or damaged file, not a crafted one; images/verify-reproducible.sh
# (make image-verify) builds one afresh and compares the images.
#
# Environment:
#   DEBIAN_POOL  where to download the source from (default: deb.debian.org,
#                then snapshot.debian.org)
set -euo pipefail

CRUN_VERSION=1.8.1
CRUN_DEBIAN_REVISION=1+deb12u1
CRUN_COMMIT=f8a096be060b22ccd3d5f3ebe44108517fbf6c30
CRUN_ORIG_SHA256=01b68269d94e5fe11106a9b14c2f144be03b16ec798951f4efa6aa16ba9da29a
CRUN_DEBIAN_SHA256=4688a1fea2d19c6e2e38f5bad8c9c5f85be4d6033eb91dbb241c413e647e59e0
# The packages whose static libraries and compiler go into the binary.
CRUN_BUILD_PACKAGES=(gcc-12 libgcc-12-dev binutils libc6-dev linux-libc-dev libseccomp-dev libcap-dev libyajl-dev)

die() {
	echo "images/crun.sh: $*" >&2
	exit 1
}

[[ $# -eq 1 ]] || die "usage: images/crun.sh CACHE"
CACHE=$1
for tool in curl sha256sum xz tar gcc-12 make ar strip readelf git dpkg-query pkg-config; do
	command -v "$tool" >/dev/null || die "$tool not found; run 'make deps' (hack/install-deps.sh)"
done
versions=""
for pkg in "${CRUN_BUILD_PACKAGES[@]}"; do
	v=$(dpkg-query -W -f='${db:Status-Abbrev}|${Version}' "$pkg" 2>/dev/null) || v=""
	[[ $v == ii* ]] || die "package $pkg is not installed; run 'make deps' (hack/install-deps.sh)"
	versions+="$pkg=${v#*|} "
done
key=$({
	cat "$0"
	echo "$versions"
} | sha256sum | cut -c1-16)
out="$CACHE/crun-$CRUN_VERSION-$CRUN_DEBIAN_REVISION-static-$key/crun"

# check BINARY: it is what the shim's features describe, and static.
check() {
	local version flags f headers
	headers=$(readelf -lh "$1" 2>&1) || die "$1 is not an ELF file: $headers"
	grep -q 'Type:[[:space:]]*DYN' <<<"$headers" || die "$1 is not a position-independent executable"
	if grep -q 'Requesting program interpreter' <<<"$headers"; then
		die "$1 is dynamically linked"
	fi
	version=$("$1" --version) || die "$1 does not run"
	grep -qx "crun version $CRUN_VERSION" <<<"$version" || die "$1 reports another version: $version"
	grep -qx "commit: $CRUN_COMMIT" <<<"$version" || die "$1 reports another commit: $version"
	flags=$(grep -E '^[+-]' <<<"$version")
	for f in +SECCOMP +CAP +EBPF; do
		[[ " $flags " == *" $f "* ]] || die "$1 lacks $f: $flags"
	done
	for f in +SYSTEMD +CRIU +WASM +LIBKRUN; do
		[[ " $flags " != *" $f "* ]] || die "$1 has $f: $flags"
	done
}

if [[ -x "$out" && -f "$(dirname "$out")/packages" ]]; then
	check "$out"
	echo "$out"
	exit 0
fi

mkdir -p "$CACHE"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/c8s-crun.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# fetch NAME SHA256: NAME from the cache or the Debian pool, checked.
fetch() {
	local name=$1 sum=$2 f="$CACHE/$1" base
	if [[ ! -f "$f" ]] || ! echo "$sum  $f" | sha256sum -c --quiet >/dev/null 2>&1; then
		for base in ${DEBIAN_POOL:-http://deb.debian.org/debian http://snapshot.debian.org/archive/debian/20250520T000000Z}; do
			rm -f "$WORK/$name"
			curl -fsSL --retry 3 -o "$WORK/$name" "$base/pool/main/c/crun/$name" 2>"$WORK/curl.log" && break
			rm -f "$WORK/$name"
		done
		[[ -f "$WORK/$name" ]] || die "cannot download $name from the Debian pool ($(tail -n1 "$WORK/curl.log")); set DEBIAN_POOL to a mirror, or put the file in $CACHE"
		echo "$sum  $WORK/$name" | sha256sum -c --quiet >/dev/null 2>&1 ||
			die "$name does not have the pinned sha256 $sum: a corrupted download, or the pool changed it"
		mv -f "$WORK/$name" "$f"
	fi
	# What is extracted is a checked copy, not the cache's file.
	cp "$f" "$WORK/$name"
	echo "$sum  $WORK/$name" | sha256sum -c --quiet >/dev/null 2>&1 || die "$f changed under the build"
}
orig=crun_$CRUN_VERSION.orig.tar.xz
debian=crun_$CRUN_VERSION-$CRUN_DEBIAN_REVISION.debian.tar.xz
fetch "$orig" "$CRUN_ORIG_SHA256"
fetch "$debian" "$CRUN_DEBIAN_SHA256"

echo "images: building a static crun $CRUN_VERSION-$CRUN_DEBIAN_REVISION (Debian's source, once; cached)" >&2
# A clean environment for every step from extraction on: nothing of the
# caller's (CC, CPPFLAGS, LIBS, PKG_CONFIG_PATH, MAKEFLAGS, TAR_OPTIONS,
# GIT_*, a PATH with other tools first, git configuration) reaches the
# build. The compiler is the gcc-12 the cache key names, whatever
# /usr/bin/gcc points to.
clean=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="$WORK" LC_ALL=C TZ=UTC SOURCE_DATE_EPOCH=0 GIT_CONFIG_NOSYSTEM=1 CC=gcc-12)
src="$WORK/crun-$CRUN_VERSION"
"${clean[@]}" tar -C "$WORK" -xJf "$WORK/$orig"
"${clean[@]}" tar -C "$src" -xJf "$WORK/$debian"
# Debian's patches, in the order of their series (git apply works outside
# a repository; the ceiling keeps it from finding one above WORK).
while read -r p; do
	[[ -z $p || $p == \#* ]] && continue
	(cd "$src" && "${clean[@]}" GIT_CEILING_DIRECTORIES="$WORK" git apply -p1 "debian/patches/$p") || die "Debian's patch $p does not apply"
done <"$src/debian/patches/series"

# libyajl-dev names its static library libyajl_s.a.
mkdir -p "$WORK/lib"
ln -s "$(dpkg-query -L libyajl-dev | grep '/libyajl_s\.a$' | head -n1)" "$WORK/lib/libyajl.a"
[[ -e "$WORK/lib/libyajl.a" ]] || die "libyajl-dev has no libyajl_s.a"

cflags="-O2 -g0 -ffile-prefix-map=$src=crun-$CRUN_VERSION -fstack-protector-strong -fstack-clash-protection -fcf-protection -D_FORTIFY_SOURCE=2 -Wformat -Werror=format-security"
ldflags="-L$WORK/lib -static-pie -Wl,-z,relro -Wl,-z,now"
(
	cd "$src"
	"${clean[@]}" ./configure --prefix=/usr --disable-systemd --disable-criu --disable-dl --disable-shared --enable-static \
		ac_cv_search_gcry_check_version=no CFLAGS="$cflags" LDFLAGS="-L$WORK/lib" >"$WORK/build.log" 2>&1
	"${clean[@]}" make git-version.h >>"$WORK/build.log" 2>&1
	"${clean[@]}" make -C libocispec -j"$(nproc)" >>"$WORK/build.log" 2>&1
	"${clean[@]}" make -j"$(nproc)" crun LDFLAGS="$ldflags" >>"$WORK/build.log" 2>&1
) || die "the crun build failed; its log: $(tail -n 20 "$WORK/build.log")"
"${clean[@]}" strip --strip-all -o "$WORK/crun" "$src/crun"

check "$WORK/crun"

mkdir -p "$(dirname "$out")"
install -m 0755 "$WORK/crun" "$out.tmp"
mv -f "$out.tmp" "$out"
# What images/build.sh records in the manifest: the source, then what
# went into the binary.
{
	echo "src:crun=$CRUN_VERSION-$CRUN_DEBIAN_REVISION"
	printf '%s\n' $versions
} >"$(dirname "$out")/packages"
echo "$out"
