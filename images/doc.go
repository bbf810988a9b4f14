// Package images builds the c8s guest image (build.sh: kernel, initramfs,
// manifest) and holds the test that boots it under QEMU. The manifest schema
// is in package manifest.
package images
