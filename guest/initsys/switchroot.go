package initsys

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// SwitchedEnv marks an init that already runs on a root it can
// pivot_root away from: the agent after SwitchRoot re-executed it. (The
// sealed image's first stage, guest/stage1, switches into the verified
// root in the agent's own process, which then does not call SwitchRoot.)
const SwitchedEnv = "C8S_SWITCHED_ROOT"

// SwitchRoot moves PID 1 off the kernel's initial rootfs and re-executes
// it. The initial rootfs cannot be pivot_root'ed away from, and the OCI
// runtime (crun, or runc) jails every container with pivot_root, so
// containers can only run once / is an ordinary mount. A recursive bind
// mount of the initramfs, moved onto / and chrooted into, is one, and
// costs no copy of the files.
//
// On success it does not return; after the re-exec it returns nil at once.
func SwitchRoot() error {
	if os.Getenv(SwitchedEnv) == "1" {
		return nil
	}
	const newRoot = "/.c8s-root"
	if err := os.Mkdir(newRoot, 0o755); err != nil && !os.IsExist(err) {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount("/", newRoot, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("switch root: bind-mount the initramfs: %w", err)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move the bind mount onto /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: %w", err)
	}
	env := append(os.Environ(), SwitchedEnv+"=1")
	return fmt.Errorf("switch root: exec /init: %w", syscall.Exec("/init", os.Args, env))
}
