#!/usr/bin/env bash
# Installs the Debian packages c8s builds and tests with. Idempotent: only the
# packages that are missing are installed, and `apt-get update` runs only when
# something is missing. Must run as root on Debian 12 (bookworm).
#
# `hack/install-deps.sh demo` installs only what `make demo` needs.
# To add a package, append one line to the list it belongs to below.
set -euo pipefail

# What `make demo` needs: QEMU and firmware, the container runtimes the
# guest image carries, the image build's tools, busybox for the demo image.
DEMO_PACKAGES=(
	ca-certificates
	qemu-system-x86
	seabios
	ovmf
	busybox-static
	runc
	cryptsetup-bin
	erofs-utils
	systemd-boot-efi
	zstd
	xz-utils
	gzip
	binutils
	kmod
	gcc
	libc6-dev
	make
	git
	# the guest's crun, built static from Debian's source (images/crun.sh)
	curl
	pkgconf
	libseccomp-dev
	libcap-dev
	libyajl-dev
)
# What the rest of the build and every test need besides.
TEST_PACKAGES=(
	qemu-utils
	cpio # GNU cpio reads the newc writer's archives in internal/newc's test
	squashfs-tools
	e2fsprogs
	protobuf-compiler
	libprotobuf-dev
	diffutils
	python3
	python3-cryptography
	systemd
	osslsigncode
	openssl
	linux-image-amd64
	docker-registry
	iproute2
	debootstrap
	linux-perf # hack/bench-start.sh: host CPU per pod by process and thread
)

case ${1:-all} in
demo) PACKAGES=("${DEMO_PACKAGES[@]}") ;;
all) PACKAGES=("${DEMO_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
*)
	echo "usage: $0 [demo|all]" >&2
	exit 2
	;;
esac

missing=()
for pkg in "${PACKAGES[@]}"; do
	status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$pkg" 2>/dev/null || true)
	if [[ "$status" != ii* ]]; then
		missing+=("$pkg")
	fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
	echo "install-deps: all ${#PACKAGES[@]} packages already installed"
	exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
	echo "install-deps: missing packages: ${missing[*]}" >&2
	echo "install-deps: run this script as root (or install them with apt-get)" >&2
	exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
