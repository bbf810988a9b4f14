#!/usr/bin/env bash
# Usage: images/build.sh OUTDIR
#
# Builds the c8s guest image into OUTDIR, reproducibly, from pinned Debian
# packages and the guest agent built by `make build`:
#   vmlinuz        the kernel of KERNEL_PKG at KERNEL_VERSION
#   initrd.img     zstd -9 compressed newc cpio: /init (the agent), crun, runc and the
#                  libraries it links, the kernel modules the agent loads
#                  (listed in load order in /etc/c8s/modules), /etc/c8s/image.json
#   manifest.json  sizes and sha256 of every artefact plus version information
#                  (schema: images/manifest)
#
# Environment:
#   SOURCE_DATE_EPOCH  timestamp for every file in the initramfs (default 0,
#                      so that equal inputs give equal images whatever the commit)
#   C8S_AGENT          agent binary to use as /init (default bin/c8s-agent)
#   C8S_CACHE          download cache (default _output/cache)
set -euo pipefail

# The guest kernel, pinned. Change these together (sha256 of the .deb).
KERNEL_PKG=linux-image-6.12.107+deb12-cloud-amd64-unsigned
KERNEL_VERSION=6.12.107-1~deb12u1
KERNEL_DEB_SHA256=752d15dbe0817b35ec227f352e226122ec6567bd47e7240c90e01e61a179baad

# Modules the agent loads, by name; their dependencies are added in front.
MODULES=(
	virtio_scsi
	sd_mod
	virtio_blk
	overlay
	erofs
	dm-mod
	dm-verity
	vsock
	vmw_vsock_virtio_transport
	sev-guest
	tdx-guest
	tsm
)

CMDLINE="console=ttyS0 quiet panic=-1"
# The sim TEE's firmware (launcher/tee.SimFirmware) and the pod shapes whose
# sim launch digests the manifest records.
SIM_FIRMWARE=${SIM_FIRMWARE:-/usr/share/seabios/bios-256k.bin}
SIM_VCPUS=${SIM_VCPUS:-1,2,4,8}
# The TDVF whose MRTD the manifest records (Debian's OVMF carries TDX metadata).
TDX_FIRMWARE=${TDX_FIRMWARE:-/usr/share/ovmf/OVMF.fd}

die() {
	echo "images/build.sh: $*" >&2
	exit 1
}

[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=$1
AGENT=${C8S_AGENT:-$ROOT/bin/c8s-agent}
CACHE=${C8S_CACHE:-$ROOT/_output/cache}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
export LC_ALL=C TZ=UTC
umask 022

for tool in go apt-get dpkg-deb depmod zstd xz ldd sha256sum readelf; do
	command -v "$tool" >/dev/null || die "$tool not found; run 'make deps' (hack/install-deps.sh)"
done
[[ -f "$AGENT" ]] || die "agent $AGENT not found; run 'make build' first"
if readelf -l "$AGENT" 2>/dev/null | grep -q 'Requesting program interpreter'; then
	die "agent $AGENT is dynamically linked; it runs as /init and must be static (CGO_ENABLED=0)"
fi
RUNC=$(command -v runc) || die "runc not found; run 'make deps'"
CRUN=$(command -v crun) || die "crun not found; run 'make deps'"

mkdir -p "$OUTDIR" "$CACHE"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/c8s-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# --- helpers (images/cmd) -----------------------------------------------------
(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$WORK/bin/" ./images/cmd/mkinitramfs ./images/cmd/mkmanifest) ||
	die "cannot build images/cmd/mkinitramfs and mkmanifest"

# --- kernel package ----------------------------------------------------------
deb="$CACHE/${KERNEL_PKG}_${KERNEL_VERSION//:/%3a}_amd64.deb"
if [[ ! -f "$deb" ]]; then
	echo "images: downloading $KERNEL_PKG=$KERNEL_VERSION"
	fetch() { (cd "$WORK" && apt-get download -q "$KERNEL_PKG=$KERNEL_VERSION" >/dev/null 2>"$WORK/apt.log"); }
	if ! fetch && [[ $(id -u) -eq 0 ]]; then
		echo "images: apt-get download failed; refreshing the package lists once"
		apt-get update -qq && fetch || true
	fi
	if [[ ! -f "$(echo "$WORK"/"${KERNEL_PKG}"_*.deb)" ]]; then
		cat "$WORK/apt.log" >&2
		die "cannot fetch $KERNEL_PKG=$KERNEL_VERSION with apt-get download.
Run 'apt-get update' and retry; if Debian no longer serves that version, pin the
new one in KERNEL_VERSION and KERNEL_DEB_SHA256 at the top of images/build.sh."
	fi
	mv "$WORK"/"${KERNEL_PKG}"_*.deb "$deb"
fi
got=$(sha256sum "$deb" | cut -d' ' -f1)
if [[ "$got" != "$KERNEL_DEB_SHA256" ]]; then
	die "$deb has sha256 $got, expected $KERNEL_DEB_SHA256.
Delete it to download it again, or, after a deliberate version change, update KERNEL_DEB_SHA256."
fi

dpkg-deb -x "$deb" "$WORK/kpkg"
KREL=$(ls "$WORK/kpkg/lib/modules")
[[ -n "$KREL" && -f "$WORK/kpkg/boot/vmlinuz-$KREL" ]] || die "$deb has no vmlinuz/modules for one kernel release"
depmod -b "$WORK/kpkg" "$KREL"
MODDIR="$WORK/kpkg/lib/modules/$KREL"

# --- module load order -------------------------------------------------------
declare -A modpath=() seen=()
while IFS= read -r line; do
	file=${line%%:*}
	name=$(basename "$file")
	name=${name%%.ko*}
	modpath[${name//-/_}]=$file
done <"$MODDIR/modules.dep"
declare -A deps=()
while IFS= read -r line; do
	file=${line%%:*}
	deps[$file]=${line#*:}
done <"$MODDIR/modules.dep"

order=()
visit() { # FILE: append FILE after everything it depends on
	local file=$1 d i list
	[[ -n "${seen[$file]:-}" ]] && return
	seen[$file]=1
	read -ra list <<<"${deps[$file]}"
	# modules.dep lists dependencies so that the last must be loaded first.
	for ((i = ${#list[@]} - 1; i >= 0; i--)); do
		visit "${list[i]}"
	done
	order+=("$file")
}
for m in "${MODULES[@]}"; do
	key=${m//-/_}
	if [[ -z "${modpath[$key]:-}" ]]; then
		if grep -qE "/${m//[-_]/[-_]}\.ko\$" "$MODDIR/modules.builtin"; then
			echo "images: module $m is built into $KREL, skipping"
			continue
		fi
		die "module $m is neither a module nor built into kernel $KREL"
	fi
	visit "${modpath[$key]}"
done

# --- initramfs tree ----------------------------------------------------------
R="$WORK/root"
mkdir -p "$R"/{proc,sys,dev,run,tmp,mnt,etc/c8s,usr/bin,lib/modules/"$KREL"}
chmod 1777 "$R/tmp"
install -m 0755 "$AGENT" "$R/init"
install -m 0755 "$RUNC" "$R/usr/bin/runc"
while read -r lib; do
	mkdir -p "$R$(dirname "$lib")"
	install -m 0755 "$(readlink -f "$lib")" "$R$lib"
done < <(for b in "$RUNC" "$CRUN"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
install -m 0755 "$CRUN" "$R/usr/bin/crun"

: >"$R/etc/c8s/modules"
for file in "${order[@]}"; do
	dst="/lib/modules/$KREL/${file%.xz}"
	dst=${dst%.zst}
	dst=${dst%.gz}
	mkdir -p "$R$(dirname "$dst")"
	case "$file" in
	*.ko.xz) xz -dc "$MODDIR/$file" >"$R$dst" ;;
	*.ko.zst) zstd -qdc "$MODDIR/$file" >"$R$dst" ;;
	*.ko.gz) gzip -dc "$MODDIR/$file" >"$R$dst" ;;
	*.ko) cp "$MODDIR/$file" "$R$dst" ;;
	*) die "unexpected module file $file" ;;
	esac
	chmod 0644 "$R$dst"
	echo "$dst" >>"$R/etc/c8s/modules"
done

pkgver() { dpkg-query -W -f='${Version}' "$1"; }
owner() { # PATH: the Debian package that ships PATH (usrmerge: try both spellings)
	local real p
	real=$(readlink -f "$1")
	for p in "$1" "$real" "${real#/usr}"; do
		dpkg-query -S "$p" 2>/dev/null | head -n1 | cut -d: -f1 && return 0
	done
	die "no Debian package owns $1; install it from a package (make deps)"
}
RUNC_PKG=$(owner "$RUNC")
RUNC_VERSION=$(pkgver "$RUNC_PKG")
# Every package whose files end up in the image, for provenance.
PACKAGES=("$KERNEL_PKG=$KERNEL_VERSION")
declare -A owners=()
while read -r f; do
	pkg=$(owner "$f")
	owners[$pkg]=1
done < <(echo "$RUNC"; echo "$CRUN"; for b in "$RUNC" "$CRUN"; do ldd "$b"; done | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
for pkg in $(printf '%s\n' "${!owners[@]}" | sort); do
	PACKAGES+=("$pkg=$(pkgver "$pkg")")
done
AGENT_SHA256=$(sha256sum "$AGENT" | cut -d' ' -f1)
cat >"$R/etc/c8s/image.json" <<EOF
{
  "schema": "c8s.io/image-info/v1",
  "kernel": {
    "package": "$KERNEL_PKG",
    "version": "$KERNEL_VERSION",
    "release": "$KREL"
  },
  "runc": {
    "package": "$RUNC_PKG",
    "version": "$RUNC_VERSION"
  },
  "packages": [$(printf '"%s", ' "${PACKAGES[@]}" | sed 's/, $//')],
  "agent_sha256": "$AGENT_SHA256",
  "source_date_epoch": $SOURCE_DATE_EPOCH
}
EOF
chmod 0644 "$R/etc/c8s/modules" "$R/etc/c8s/image.json"

# Archive in sorted order, owned by root, every mtime SOURCE_DATE_EPOCH,
# normalised inodes and link counts; /dev/console lets the kernel give /init
# a console before anything is mounted.
"$WORK/bin/mkinitramfs" -root "$R" -o "$WORK/initrd.cpio" -mtime "$SOURCE_DATE_EPOCH" \
	-chardev dev/console:0600:5:1
zstd -q -9 -T1 "$WORK/initrd.cpio" -o "$WORK/initrd.img"

# --- outputs -----------------------------------------------------------------
# Assemble in WORK, then rename into OUTDIR, manifest last, so that a reader
# never sees a manifest that describes other files.
mkdir -p "$WORK/out"
cp "$WORK/kpkg/boot/vmlinuz-$KREL" "$WORK/out/vmlinuz"
mv "$WORK/initrd.img" "$WORK/out/initrd.img"
chmod 0644 "$WORK/out/vmlinuz" "$WORK/out/initrd.img"
"$WORK/bin/mkmanifest" \
	-dir "$WORK/out" \
	-kernel vmlinuz -initrd initrd.img \
	-kernel-package "$KERNEL_PKG" -kernel-version "$KERNEL_VERSION" -kernel-release "$KREL" \
	-runc-package "$RUNC_PKG" -runc-version "$RUNC_VERSION" \
	-cmdline "$CMDLINE" -agent-sha256 "$AGENT_SHA256" \
	$(printf -- '-package %s ' "${PACKAGES[@]}") \
	-source-date-epoch "$SOURCE_DATE_EPOCH" \
	-sim-firmware "$SIM_FIRMWARE" -sim-vcpus "$SIM_VCPUS" \
	-tdx-firmware "$TDX_FIRMWARE"
rm -f "$OUTDIR/manifest.json"
for f in vmlinuz initrd.img manifest.json; do
	cp "$WORK/out/$f" "$OUTDIR/.$f.tmp"
	mv -f "$OUTDIR/.$f.tmp" "$OUTDIR/$f"
done

echo "images: built $KREL image in $OUTDIR:"
(cd "$OUTDIR" && ls -l vmlinuz initrd.img manifest.json && sha256sum vmlinuz initrd.img)
