#!/usr/bin/env bash
# Usage: images/verify-reproducible.sh
#
# Builds the guest image twice, into two fresh temporary directories, and
# compares every artefact byte for byte. Exits non-zero, naming the files that
# differ, when the two builds are not identical. The second build compiles
# its crun afresh (images/crun.sh) in another directory, from a cache that
# has the downloads but not the first build's crun, so that crun's build is
# proven reproducible too.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/c8s-repro.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

cache=${C8S_CACHE:-$ROOT/_output/cache}
mkdir -p "$tmp/cache2"
for n in 1 2; do
	echo "verify-reproducible: build $n"
	env=()
	if [[ $n == 2 ]]; then
		for f in "$cache"/*; do
			[[ -f $f ]] || continue
			cp -l "$f" "$tmp/cache2/" 2>/dev/null || cp "$f" "$tmp/cache2/"
		done
		env=(C8S_CACHE="$tmp/cache2" TMPDIR="$tmp")
	fi
	env "${env[@]}" "$ROOT/images/build.sh" "$tmp/build$n" >"$tmp/build$n.log" 2>&1 || {
		cat "$tmp/build$n.log" >&2
		echo "verify-reproducible: build $n failed" >&2
		exit 1
	}
done

status=0
files=$(cd "$tmp/build1" && ls)
files2=$(cd "$tmp/build2" && ls)
[[ "$files" == "$files2" ]] || { echo "verify-reproducible: the builds have different files:" $files "/" $files2 >&2; exit 1; }
for f in $files; do
	a=$(sha256sum "$tmp/build1/$f" | cut -d' ' -f1)
	b=$(sha256sum "$tmp/build2/$f" | cut -d' ' -f1)
	if cmp -s "$tmp/build1/$f" "$tmp/build2/$f"; then
		echo "identical  $a  $f"
	else
		echo "DIFFERENT  $a != $b  $f" >&2
		cmp "$tmp/build1/$f" "$tmp/build2/$f" >&2 || true
		status=1
	fi
done
if [[ $status -ne 0 ]]; then
	echo "verify-reproducible: the two builds differ" >&2
	exit 1
fi
echo "verify-reproducible: both builds are identical"
