// Package rootfs turns a container's root filesystem, as containerd hands
// it to the shim (snapshot mounts or a prepared directory), into a disk
// image the pod VM attaches and the guest mounts.
//
// The guest cannot see the host's filesystem, and a confidential guest must
// not share live host directories, so the shim copies the rootfs into an
// ext4 image once per container: a sparse file with room for the
// container's writes. A guest started as a TEE (every c8s pod VM names
// one: c8s.tee) mounts it read-only and keeps the container's writes in
// its own memory (guest/agent confidential.go), so the host's copy is
// never written; a guest that names no TEE writes to the image. Either
// way writes are discarded with the container, as they would be with any
// VM-isolated runtime.
package rootfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/internal/child"
)

// FSType is the filesystem of the images Build writes.
const FSType = "ext4"

// Options sizes the image.
type Options struct {
	// FreeMiB is the space left for the container's writes on top of the
	// rootfs contents. The file is sparse, so unused space costs nothing.
	FreeMiB int64
}

// Build writes an ext4 image of the container's rootfs to image. When
// mounts is not empty they are mounted on target (the bundle's rootfs
// directory) for the copy and unmounted again before Build returns;
// otherwise target must already hold the rootfs.
func Build(ctx context.Context, mounts []mount.Mount, target, image string, opts Options) (retErr error) {
	if len(mounts) > 0 {
		if err := os.MkdirAll(target, 0o711); err != nil {
			return fmt.Errorf("create rootfs mount point: %w", err)
		}
		if err := mount.All(mounts, target); err != nil {
			return fmt.Errorf("mount container rootfs at %s: %w", target, err)
		}
		defer func() {
			if err := mount.UnmountAll(target, 0); err != nil {
				log.G(ctx).WithError(err).WithField("path", target).Warn("unmount container rootfs")
				if retErr == nil {
					retErr = fmt.Errorf("unmount container rootfs: %w", err)
				}
			}
		}()
	}
	if _, err := os.Stat(target); err != nil {
		return fmt.Errorf("container rootfs %s: %w", target, err)
	}
	used, files, err := usage(target)
	if err != nil {
		return fmt.Errorf("measure container rootfs: %w", err)
	}
	size := used + used/4 + opts.FreeMiB<<20 + 16<<20
	size = (size + 1<<20 - 1) &^ (1<<20 - 1)

	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return fmt.Errorf("create disk directory: %w", err)
	}
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create rootfs disk: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.Remove(image)
		}
	}()
	if err := f.Truncate(size); err != nil {
		f.Close()
		return fmt.Errorf("size rootfs disk: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	mkfs, err := findMkfs()
	if err != nil {
		return err
	}
	inodes := files*2 + 4096
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", FSType,
		"-O", "^has_journal", "-N", fmt.Sprint(inodes),
		"-E", "root_owner=0:0,lazy_itable_init=1",
		"-d", target, image)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// It dies with the shim: left reading the mounted snapshot, it would
	// keep the mount busy for `shim delete`, and the bundle with it.
	done := make(chan error, 1)
	if err := child.Start(cmd, true, func() { done <- cmd.Wait() }); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	if err := <-done; err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// Remove deletes an image written by Build. A missing image is not an
// error.
func Remove(image string) error {
	if err := os.Remove(image); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// usage sums the apparent sizes of the regular files below dir, rounded up
// to blocks, and counts its entries.
func usage(dir string) (bytes, entries int64, err error) {
	err = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		entries++
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			bytes += (info.Size() + 4095) &^ 4095
		} else {
			bytes += 4096
		}
		return nil
	})
	return bytes, entries, err
}

func findMkfs() (string, error) {
	if p, err := exec.LookPath("mkfs.ext4"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("mkfs.ext4 not found: install e2fsprogs (it builds the container rootfs disks)")
}
