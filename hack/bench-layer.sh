#!/usr/bin/env bash
# make bench, layer disks (measurements/layer, issue 16): the first
# conversion of an image layer into its dm-verity-protected ext4 disk, as a
# node does once per layer digest before the layer is cached, measured on a
# generated layer of LAYER_MIB (256) MiB, from its uncompressed tar and from
# its gzip blob (decompression included). Printed per GiB of uncompressed
# layer.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYER_MIB=${LAYER_MIB:-256}

echo "== layer disks: first conversion of a ${LAYER_MIB} MiB layer (tar -> ext4 + dm-verity tree)"
out=$(C8S_LAYER_BENCH_MIB=$LAYER_MIB go test -run '^$' -bench 'BenchmarkBuild' -benchtime "${LAYER_BENCHTIME:-3x}" ./measurements/layer 2>&1) || { echo "$out"; exit 1; }
grep -E '^Benchmark' <<<"$out"
# "BenchmarkBuild/gzip/256MiB-2  3  ... ns/op  ... MB/s  4.1 s/GiB"
while read -r name _ _ _ mbs _ sgib _; do
	kind=${name#BenchmarkBuild/}; kind=${kind%%/*}
	printf 'first conversion time per GiB of layers (%s layer): %.1f s  (%s MB/s of tar)\n' "$kind" "$sgib" "$mbs"
done < <(grep -E '^BenchmarkBuild/' <<<"$out")
