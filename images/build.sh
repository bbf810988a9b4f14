#!/usr/bin/env bash
# Usage: images/build.sh OUTDIR
#
# Builds the sealed c8s guest image into OUTDIR, reproducibly, from pinned
# Debian packages and the guest binaries built by `make build`:
#   vmlinuz           the kernel of KERNEL_PKG at KERNEL_VERSION
#   rootfs.img        the guest root: an erofs file system holding runc and the
#                     libraries it links, a symlink to crun (in the runtime tree
#                     below), the kernel modules the agent loads
#                     (/etc/c8s/modules), /etc/c8s/image.json; followed by its
#                     dm-verity hash tree (veritysetup, fixed salt and UUIDs)
#   initrd.img        the modules the first stage needs to map rootfs.img through
#                     dm-verity and switch into it (zstd cpio), followed by an
#                     uncompressed cpio of what runs from memory: the agent as
#                     /init, which runs the first stage in its own process
#                     (guest/stage1) and goes on as the agent in the verified
#                     root, and the runtime tree (crun, static: images/crun.sh),
#                     which the first stage mounts read-only at RUNTIME_MOUNT there
#   initrd-plain.img  the unsealed initramfs of the same root tree (development,
#                     and the baseline `make bench` compares sealed boots with)
#   c8s.efi           a UKI: Debian's systemd-stub with kernel, initrd.img, the
#                     common command line (root hash included, no TEE named: the
#                     launcher does not boot the UKI), os-release and uname
#   snp.igvm          an IGVM of SNP_FIRMWARE + kernel + initrd.img + the SNP
#                     command line (c8s.tee=snp), when SNP_FIRMWARE is given or
#                     the SNP fixture is found
#   manifest.json     sizes and sha256 of every artefact, the verity parameters, the
#                     common command line, and each TEE's expected launch digests
#                     over its own command line (schema: manifest)
#
# Environment:
#   SOURCE_DATE_EPOCH  timestamp for every file in the initramfs (default 0,
#                      so that equal inputs give equal images whatever the commit)
#   C8S_AGENT          the agent binary, /init of both initramfs (default
#                      bin/c8s-agent)
#   C8S_LAUNCHER       c8s-launcher, which says the kernel parameters every pod
#                      VM boots with, and each TEE's own (default bin/c8s-launcher)
#   SNP_FIRMWARE       an AmdSevX64 OVMF (with SNP_KERNEL_HASHES) whose SNP launch
#                      digests the manifest records (default: the published
#                      sev-snp-measure fixture in testdata/snp; clearly
#                      marked as such in the manifest)
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
	virtio_net
	bridge
	# the attested mesh's redirects (nftables NAT), loaded for mesh pods only
	nfnetlink
	nf_tables
	nf_conntrack
	nf_nat
	nft_chain_nat
	nft_redir
	nft_ct
	# the host's entropy, loaded in sim VMs only (TCG has no RDRAND)
	virtio_rng
	# free page reporting to the host, loaded in sim VMs only (guest/boot)
	virtio_balloon
)
# Modules the first stage (guest/stage1) loads to reach the verified root.
# sha256-ssse3 first: dm-verity, for the root and every layer disk, hashes
# with the best SHA-256 the crypto API has when its table loads, and
# without this module (which nothing else loads) that is the portable C
# one, several times slower than the CPU's SHA-NI or AVX2 code on SNP and
# TDX hosts. On a CPU without SSSE3 (TCG's qemu64) it refuses to load
# (ENODEV), and the portable one stays.
STAGE1_MODULES=(sha256-ssse3 virtio_blk dm-verity erofs)

# Fixed, documented inputs of the hash tree and file system, so that equal
# trees give equal bytes. Changing them changes the root hash.
ROOTFS_UUID=c8c8c8c8-0000-4000-8000-726f6f746673
VERITY_UUID=c8c8c8c8-0000-4000-8000-766572697479
VERITY_SALT=$(printf 'c8s guest rootfs verity salt v1' | sha256sum | cut -d' ' -f1)
# The sim TEE's firmware (launcher/vm/tee/sim.Firmware) and the pod shapes whose
# sim launch digests the manifest records.
SIM_FIRMWARE=${SIM_FIRMWARE:-/usr/share/seabios/bios-256k.bin}
SIM_VCPUS=${SIM_VCPUS:-1,2,4,8}
# The TDVF whose MRTD the manifest records (Debian's OVMF carries TDX metadata).
TDX_FIRMWARE=${TDX_FIRMWARE:-/usr/share/ovmf/OVMF.fd}
# SEV-SNP: shapes, vCPU type and VMSA features of the recorded digests.
SNP_VCPUS=${SNP_VCPUS:-1,2,4,8}
SNP_VCPU_TYPE=${SNP_VCPU_TYPE:-EPYC-v4}
SNP_GUEST_FEATURES=${SNP_GUEST_FEATURES:-0x1}
UKI_STUB=${UKI_STUB:-/usr/lib/systemd/boot/efi/linuxx64.efi.stub}

die() {
	echo "images/build.sh: $*" >&2
	exit 1
}

[[ $# -eq 1 ]] || { echo "usage: $0 OUTDIR" >&2; exit 2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR=$1
AGENT=${C8S_AGENT:-$ROOT/bin/c8s-agent}
LAUNCHER=${C8S_LAUNCHER:-$ROOT/bin/c8s-launcher}
CACHE=${C8S_CACHE:-$ROOT/_output/cache}
SNP_FIXTURE=$ROOT/testdata/snp/ovmf_AmdSev_suffix.bin
SNP_FIRMWARE_NOTE=""
if [[ -z "${SNP_FIRMWARE:-}" && -f "$SNP_FIXTURE" ]]; then
	SNP_FIRMWARE=$(readlink -f "$SNP_FIXTURE")
	SNP_FIRMWARE_NOTE="test fixture: the last 4 KiB of an AmdSevX64 OVMF as published with virtee/sev-snp-measure; not bootable. Set SNP_FIRMWARE to the AmdSevX64 OVMF your SNP nodes boot to get their digests."
fi
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
export LC_ALL=C TZ=UTC
umask 022

for tool in go apt-get dpkg-deb depmod zstd xz ldd sha256sum readelf mkfs.erofs veritysetup objcopy; do
	command -v "$tool" >/dev/null || die "$tool not found; run 'make deps' (hack/install-deps.sh)"
done
[[ -f "$UKI_STUB" ]] || die "$UKI_STUB not found; run 'make deps' (package systemd-boot-efi)"
[[ -f "$AGENT" ]] || die "$AGENT not found; run 'make build' first"
if readelf -l "$AGENT" 2>/dev/null | grep -q 'Requesting program interpreter'; then
	die "$AGENT is dynamically linked; it runs as init and must be static (CGO_ENABLED=0)"
fi
# The launcher's built-in parameters (launcher/vm.BaseKernelParams), from
# the launcher itself; the verity parameters of the root are appended
# (guest/api/verity).
[[ -x "$LAUNCHER" ]] || die "$LAUNCHER not found; run 'make build' first"
BASE_CMDLINE=$("$LAUNCHER" kernel-params) || die "$LAUNCHER kernel-params failed"
[[ -n "$BASE_CMDLINE" ]] || die "$LAUNCHER kernel-params printed nothing"
# Each TEE's own parameters (c8s.tee=<tee>, launcher/vm/tee), from the
# launcher too: a pod VM of that TEE boots the common command line followed
# by them, so its digests (and the SNP IGVM) are over that line.
declare -A TEE_PARAMS=()
for t in sim snp tdx; do
	TEE_PARAMS[$t]=$("$LAUNCHER" kernel-params -tee "$t") || die "$LAUNCHER kernel-params -tee $t failed"
	[[ -n "${TEE_PARAMS[$t]}" ]] || die "$LAUNCHER kernel-params -tee $t printed nothing"
done
RUNC=$(command -v runc) || die "runc not found; run 'make deps'"

mkdir -p "$OUTDIR" "$CACHE"
# crun: Debian's source built static (images/crun.sh says why), cached.
CRUN=$("$ROOT/images/crun.sh" "$CACHE") || die "cannot build the guest's crun (images/crun.sh)"
OUTDIR=$(cd "$OUTDIR" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/c8s-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

# --- helpers (images/cmd) -----------------------------------------------------
(cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -o "$WORK/bin/" ./images/cmd/mkinitramfs ./images/cmd/mkmanifest ./images/cmd/pestamp ./measurements/cmd/c8s-measure) ||
	die "cannot build the image helpers (images/cmd, c8s-measure)"

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
declare -A modpath=() deps=()
while IFS= read -r line; do
	file=${line%%:*}
	name=$(basename "$file")
	name=${name%%.ko*}
	modpath[${name//-/_}]=$file
	deps[$file]=${line#*:}
done <"$MODDIR/modules.dep"

# install_modules TREE NAME...: decompress NAME and its dependencies into
# TREE and list them in load order in TREE/etc/c8s/modules.
install_modules() {
	local tree=$1 m key file dst
	shift
	local -A seen=()
	local order=()
	visit() { # FILE: append FILE after everything it depends on
		local file=$1 i list
		[[ -n "${seen[$file]:-}" ]] && return
		seen[$file]=1
		read -ra list <<<"${deps[$file]}"
		# modules.dep lists dependencies so that the last must be loaded first.
		for ((i = ${#list[@]} - 1; i >= 0; i--)); do
			visit "${list[i]}"
		done
		order+=("$file")
	}
	for m in "$@"; do
		key=${m//-/_}
		if [[ -z "${modpath[$key]:-}" ]]; then
			if grep -qE "/${m//[-_]/[-_]}\.ko\$" "$MODDIR/modules.builtin"; then
				continue
			fi
			die "module $m is neither a module nor built into kernel $KREL"
		fi
		visit "${modpath[$key]}"
	done
	mkdir -p "$tree/etc/c8s"
	: >"$tree/etc/c8s/modules"
	for file in "${order[@]}"; do
		dst="/lib/modules/$KREL/${file%.xz}"
		dst=${dst%.zst}
		dst=${dst%.gz}
		mkdir -p "$tree$(dirname "$dst")"
		case "$file" in
		*.ko.xz) xz -dc "$MODDIR/$file" >"$tree$dst" ;;
		*.ko.zst) zstd -qdc "$MODDIR/$file" >"$tree$dst" ;;
		*.ko.gz) gzip -dc "$MODDIR/$file" >"$tree$dst" ;;
		*.ko) cp "$MODDIR/$file" "$tree$dst" ;;
		*) die "unexpected module file $file" ;;
		esac
		# Drop the module's BTF (type information for BPF, which the
		# guest never loads): the kernel checks a module's BTF against
		# its own at every load, and under emulation that was most of
		# the time each module took (scsi_mod 0.30 s of guest time with
		# it, 0.08 s without; measured under -icount, issue 18).
		objcopy --remove-section=.BTF "$tree$dst"
		chmod 0644 "$tree$dst"
		echo "$dst" >>"$tree/etc/c8s/modules"
	done
	chmod 0644 "$tree/etc/c8s/modules"
}

# --- the guest root tree ------------------------------------------------------
R="$WORK/root"
mkdir -p "$R"/{proc,sys,dev,run,tmp,mnt,etc/c8s,usr/bin,lib/modules/"$KREL"}
chmod 1777 "$R/tmp"
install -m 0755 "$RUNC" "$R/usr/bin/runc"
# runc and the libraries it links live in the verified root: the guest runs
# runc only where the image has no crun (guest/boot).
while read -r lib; do
	mkdir -p "$R$(dirname "$lib")"
	install -m 0755 "$(readlink -f "$lib")" "$R$lib"
done < <(ldd "$RUNC" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
# What runs from memory: the agent and crun (static: it links nothing) are
# members of the measured initramfs (initrd.img), not of the
# verified root. Read through dm-verity, every page of their first run was
# hashed on the way in: 0.89 s of guest time from the agent's exec to its
# main, 0.34 s for a first `crun --version`, against 0.04 s and 0.06 s from
# memory (under -icount, issue 18). Each has one home: the root has
# symlinks into RUNTIME_MOUNT, where the first stage mounts the initramfs's
# runtime/ tree read-only (guest/stage1: Init, RuntimeDir, RuntimeMount),
# and nothing at those names otherwise; the agent is the initramfs's /init.
RUNTIME_MOUNT=/usr/lib/c8s/runtime
M="$WORK/ram"
mkdir -p "$M/runtime/usr/bin" "$R$RUNTIME_MOUNT"
install -m 0755 "$AGENT" "$M/init"
install -m 0755 "$CRUN" "$M/runtime/usr/bin/crun"
ln -s "$RUNTIME_MOUNT/usr/bin/crun" "$R/usr/bin/crun"
install_modules "$R" "${MODULES[@]}"
# The public Web PKI roots: Debian's ca-certificates (the Mozilla set it
# ships, in a fixed order, not the host's generated bundle, which local
# certificates may have been added to). A guest pull over HTTPS whose rule
# names no pull_ca verifies the registry against these and nothing else;
# they are measured as part of the root.
CA_DIR=/usr/share/ca-certificates/mozilla
compgen -G "$CA_DIR/*.crt" >/dev/null || die "no CA certificates in $CA_DIR: install ca-certificates (make deps)"
mkdir -p "$R/etc/ssl/certs"
(export LC_ALL=C; for f in "$CA_DIR"/*.crt; do cat "$f"; echo; done) >"$R/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$R/etc/ssl/certs/ca-certificates.crt"

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
PACKAGES=("$KERNEL_PKG=$KERNEL_VERSION" "ca-certificates=$(pkgver ca-certificates)")
declare -A owners=()
while read -r f; do
	pkg=$(owner "$f")
	owners[$pkg]=1
done < <(echo "$RUNC"; ldd "$RUNC" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u)
# crun's source package, and the compiler and static libraries that went
# into it (images/crun.sh lists them beside the binary).
mapfile -t crun_packages <"$(dirname "$CRUN")/packages"
while read -r p; do
	PACKAGES+=("$p")
done < <({
	for pkg in "${!owners[@]}"; do echo "$pkg=$(pkgver "$pkg")"; done
	printf '%s\n' "${crun_packages[@]}"
} | sort -u -t= -k1,1)
AGENT_SHA256=$(sha256sum "$AGENT" | cut -d' ' -f1)
cat >"$R/etc/c8s/image.json" <<EOJ
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
EOJ
cat >"$R/etc/os-release" <<EOJ
NAME="c8s guest"
ID=c8s
PRETTY_NAME="c8s confidential pod guest ($KREL)"
VERSION_ID="$KERNEL_VERSION"
EOJ
chmod 0644 "$R/etc/c8s/image.json" "$R/etc/os-release"
mkdir -p "$WORK/out"

# cpio ARCHIVE TREE: a zstd-compressed newc archive of TREE, in sorted order,
# owned by root, every mtime SOURCE_DATE_EPOCH, normalised inodes and link
# counts; /dev/console lets the kernel give init a console before anything
# is mounted.
cpio() {
	"$WORK/bin/mkinitramfs" -root "$2" -o "$WORK/initrd.cpio" -mtime "$SOURCE_DATE_EPOCH" \
		-chardev dev/console:0600:5:1
	zstd -q -9 -T1 -f "$WORK/initrd.cpio" -o "$1"
	rm -f "$WORK/initrd.cpio"
}
# The unsealed initramfs: the root tree with the agent as its /init and the
# runtime tree in place.
P="$WORK/plain"
cp -a "$R" "$P"
install -m 0755 "$AGENT" "$P/init"
cp -a "$M/runtime/." "$P$RUNTIME_MOUNT/"
cpio "$WORK/out/initrd-plain.img" "$P"
rm -rf "$P"

# --- rootfs.img: erofs + dm-verity hash tree ---------------------------------
find "$R" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
mkfs.erofs --quiet -T"$SOURCE_DATE_EPOCH" -U"$ROOTFS_UUID" --all-root -x-1 "$WORK/rootfs.data" "$R" ||
	die "mkfs.erofs failed"
size=$(stat -c %s "$WORK/rootfs.data")
blocks=$(((size + 4095) / 4096))
truncate -s $((blocks * 4096)) "$WORK/rootfs.data"
mv "$WORK/rootfs.data" "$WORK/out/rootfs.img"
# The hash tree follows the data in the same file, behind a verity
# superblock (one block); the kernel's table starts the tree after it.
veritysetup format --data-blocks="$blocks" --hash-offset=$((blocks * 4096)) \
	--salt="$VERITY_SALT" --uuid="$VERITY_UUID" --hash=sha256 \
	--data-block-size=4096 --hash-block-size=4096 \
	"$WORK/out/rootfs.img" "$WORK/out/rootfs.img" >"$WORK/verity.txt" || die "veritysetup format failed"
ROOT_HASH=$(awk -F: '/^Root hash:/ {gsub(/[ \t]/, "", $2); print $2}' "$WORK/verity.txt")
[[ ${#ROOT_HASH} -eq 64 ]] || { cat "$WORK/verity.txt" >&2; die "no root hash in veritysetup's output"; }
HASH_START=$((blocks + 1))
veritysetup verify --hash-offset=$((blocks * 4096)) --data-blocks="$blocks" \
	"$WORK/out/rootfs.img" "$WORK/out/rootfs.img" "$ROOT_HASH" || die "the fresh hash tree does not verify"
VERITY_PARAMS="c8s.root=/dev/vda c8s.rootfstype=erofs c8s.verity.roothash=$ROOT_HASH c8s.verity.salt=$VERITY_SALT c8s.verity.blocks=$blocks c8s.verity.hashstart=$HASH_START"
# CMDLINE is what every TEE shares; SNP_CMDLINE is the SNP VM's.
CMDLINE="$BASE_CMDLINE $VERITY_PARAMS"
SNP_CMDLINE="$CMDLINE ${TEE_PARAMS[snp]}"

# --- initrd.img: the first stage's modules, then what runs from memory -------
# The first archive holds no program: only the modules the first stage
# loads (and their list), its mount points and /dev/console. The agent,
# /init, runs the first stage in its own process (guest/stage1): one Go
# runtime to start under emulation rather than a first-stage program's and
# then the agent's (issue 18).
S="$WORK/stage1"
mkdir -p "$S"/{proc,sys,dev,newroot}
install_modules "$S" "${STAGE1_MODULES[@]}"
cpio "$WORK/initrd.stage1" "$S"
# What runs from memory (the agent, the runtime tree) follows as a second,
# uncompressed archive: the kernel unpacks concatenated archives in order
# before it runs /init, and an uncompressed one costs no decompression
# under emulation (kernel to the agent serving, under -icount: 1.85 s
# uncompressed, 1.92 s as lz4 -l, 2.19 s as zstd -3; lz4 would save about
# 11 MB of initrd, which QEMU and the guest each hold a copy of). The
# launch measurement of initrd.img covers both archives.
# The kernel wants each archive header 4-byte aligned: pad the zstd frame
# with zeros, which the kernel skips between archives.
"$WORK/bin/mkinitramfs" -root "$M" -o "$WORK/initrd.ram" -mtime "$SOURCE_DATE_EPOCH"
s1size=$(stat -c %s "$WORK/initrd.stage1")
truncate -s $(((s1size + 3) / 4 * 4)) "$WORK/initrd.stage1"
cat "$WORK/initrd.stage1" "$WORK/initrd.ram" >"$WORK/out/initrd.img"
rm -f "$WORK/initrd.stage1" "$WORK/initrd.ram"

cp "$WORK/kpkg/boot/vmlinuz-$KREL" "$WORK/out/vmlinuz"
chmod 0644 "$WORK/out/"*

# --- c8s.efi: the UKI ---------------------------------------------------------
# Sections as ukify lays them out: each at its own address above the stub's
# image, in the order systemd-stub measures them into PCR 11. Its .cmdline is
# the common command line: the launcher boots the kernel directly, never the
# UKI, so no TEE is named there.
printf '%s' "$CMDLINE" >"$WORK/cmdline.txt"
printf '%s' "$KREL" >"$WORK/uname.txt"
uki_args=()
vma=$((0x1000000))
for sec in .osrel:"$R/etc/os-release" .cmdline:"$WORK/cmdline.txt" .uname:"$WORK/uname.txt" \
	.initrd:"$WORK/out/initrd.img" .linux:"$WORK/out/vmlinuz"; do
	name=${sec%%:*} file=${sec#*:}
	uki_args+=(--add-section "$name=$file" --change-section-vma "$(printf '%s=%#x' "$name" "$vma")")
	vma=$(((vma + $(stat -c %s "$file") + 0x10fffff) & ~0xfffff))
done
objcopy "${uki_args[@]}" "$UKI_STUB" "$WORK/out/c8s.efi" || die "objcopy could not assemble the UKI"
# objcopy stamps the PE header with the current time: set it to
# SOURCE_DATE_EPOCH and recompute the header checksum.
"$WORK/bin/pestamp" -epoch "$SOURCE_DATE_EPOCH" "$WORK/out/c8s.efi" || die "cannot stamp the UKI"

# --- snp.igvm -------------------------------------------------------------------
igvm_args=()
if [[ -n "${SNP_FIRMWARE:-}" ]]; then
	[[ -f "$SNP_FIRMWARE" ]] || die "SNP_FIRMWARE=$SNP_FIRMWARE does not exist"
	"$WORK/bin/c8s-measure" igvm --from-ovmf --ovmf "$SNP_FIRMWARE" \
		--kernel "$WORK/out/vmlinuz" --initrd "$WORK/out/initrd.img" --append "$SNP_CMDLINE" \
		--vcpus 1 --vcpu-type "$SNP_VCPU_TYPE" --guest-features "$SNP_GUEST_FEATURES" \
		-o "$WORK/out/snp.igvm" >/dev/null || die "cannot write the SNP IGVM"
	igvm_args=(-igvm snp.igvm -snp-firmware "$SNP_FIRMWARE" -snp-firmware-note "$SNP_FIRMWARE_NOTE" -snp-params "${TEE_PARAMS[snp]}"
		-snp-vcpus "$SNP_VCPUS" -snp-vcpu-type "$SNP_VCPU_TYPE" -snp-guest-features "$SNP_GUEST_FEATURES")
else
	echo "images: no SNP_FIRMWARE and no SNP fixture: the manifest has no SNP digests and no IGVM"
fi

# --- outputs -----------------------------------------------------------------
# Assemble in WORK, then rename into OUTDIR, manifest last, so that a reader
# never sees a manifest that describes other files.
"$WORK/bin/mkmanifest" \
	-dir "$WORK/out" \
	-kernel vmlinuz -initrd initrd.img -initrd-plain initrd-plain.img -rootfs rootfs.img -uki c8s.efi \
	-verity-device /dev/vda -verity-fstype erofs -verity-root-hash "$ROOT_HASH" -verity-salt "$VERITY_SALT" \
	-verity-data-blocks "$blocks" -verity-hash-start "$HASH_START" -verity-uuid "$VERITY_UUID" -rootfs-uuid "$ROOTFS_UUID" \
	-kernel-package "$KERNEL_PKG" -kernel-version "$KERNEL_VERSION" -kernel-release "$KREL" \
	-runc-package "$RUNC_PKG" -runc-version "$RUNC_VERSION" \
	-cmdline "$CMDLINE" -agent-sha256 "$AGENT_SHA256" \
	$(printf -- '-package %s ' "${PACKAGES[@]}") \
	-source-date-epoch "$SOURCE_DATE_EPOCH" \
	-sim-firmware "$SIM_FIRMWARE" -sim-vcpus "$SIM_VCPUS" -sim-params "${TEE_PARAMS[sim]}" \
	-tdx-firmware "$TDX_FIRMWARE" -tdx-params "${TEE_PARAMS[tdx]}" \
	"${igvm_args[@]}"
rm -f "$OUTDIR/manifest.json" "$OUTDIR/snp.igvm"
for f in $(cd "$WORK/out" && ls | grep -vx manifest.json) manifest.json; do
	cp "$WORK/out/$f" "$OUTDIR/.$f.tmp"
	mv -f "$OUTDIR/.$f.tmp" "$OUTDIR/$f"
done

echo "images: built sealed $KREL image in $OUTDIR (root hash $ROOT_HASH):"
(cd "$OUTDIR" && ls -l $(cd "$WORK/out" && ls))
