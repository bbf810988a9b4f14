#!/usr/bin/env bash
# Installs the Debian packages c8s builds and tests with. Idempotent: only the
# packages that are missing are installed, and `apt-get update` runs only when
# something is missing. Must run as root on Debian 12 (bookworm).
#
# To add a package, append one line to the list below.
set -euo pipefail

PACKAGES=(
	qemu-system-x86
	seabios
	qemu-utils
	busybox-static
	ovmf
	runc
	crun
	cpio
	cryptsetup-bin
	erofs-utils
	squashfs-tools
	systemd-boot-efi
	e2fsprogs
	zstd
	xz-utils
	gzip
	binutils
	kmod
	protobuf-compiler
	libprotobuf-dev
	gcc
	libc6-dev
	make
	git
	diffutils
	python3
	python3-cryptography
	systemd
	osslsigncode
	openssl
	linux-image-amd64
	docker-registry
	curl
	iproute2
	debootstrap
)

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
