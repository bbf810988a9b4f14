package initsys

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// switchedEnv marks the agent that SwitchRoot has re-executed.
const switchedEnv = "C8S_SWITCHED_ROOT"

// SwitchRoot moves PID 1 off the initramfs onto a tmpfs root and
// re-executes it there, as switch_root does. The kernel's initial rootfs
// cannot be pivot_root'ed away from, and runc jails every container with
// pivot_root, so containers can only run once / is an ordinary mount.
//
// It copies the initramfs into the tmpfs, deletes the originals to give
// their memory back, moves the tmpfs onto / and execs /init again. On
// success it does not return; after the re-exec it returns nil at once.
func SwitchRoot() error {
	if os.Getenv(switchedEnv) == "1" {
		return nil
	}
	const newRoot = "/.c8s-root"
	if err := os.Mkdir(newRoot, 0o755); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount("tmpfs", newRoot, "tmpfs", 0, "mode=0755"); err != nil {
		return fmt.Errorf("switch root: mount tmpfs: %w", err)
	}
	if err := copyTree("/", newRoot, newRoot); err != nil {
		return fmt.Errorf("switch root: copy initramfs: %w", err)
	}
	entries, err := os.ReadDir("/")
	if err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	for _, e := range entries {
		if p := "/" + e.Name(); p != newRoot {
			os.RemoveAll(p)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move tmpfs onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	env := append(os.Environ(), switchedEnv+"=1")
	return fmt.Errorf("switch root: exec /init: %w", syscall.Exec("/init", os.Args, env))
}

// copyTree copies the tree at src into dst (an existing directory),
// skipping skip, preserving modes, symlinks and device nodes.
func copyTree(src, dst, skip string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path == skip {
			return filepath.SkipDir
		}
		rel, err := filepath.Rel(src, path)
		if err != nil || rel == "." {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		switch mode := info.Mode(); {
		case mode.IsDir():
			if err := os.Mkdir(target, mode.Perm()); err != nil {
				return err
			}
		case mode&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case mode.IsRegular():
			if err := copyFile(path, target, mode.Perm()); err != nil {
				return err
			}
		case mode&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe) != 0:
			if err := unix.Mknod(target, st.Mode, int(st.Rdev)); err != nil {
				return err
			}
		default:
			return nil
		}
		if err := os.Lchown(target, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if info.Mode()&fs.ModeSymlink == 0 {
			return os.Chmod(target, info.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky))
		}
		return nil
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
