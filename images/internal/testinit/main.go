//go:build linux

// Command testinit is a stand-in /init for the guest image boot test
// (images/boot_test.go). It mounts the pseudo file systems, loads every
// module listed in /etc/c8s/modules in order, checks the virtio devices and
// runc, reports each result on the console as one "C8S-TESTINIT ..." line and
// powers the VM off. It never returns: as PID 1 that would panic the kernel.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Marker lines the test looks for.
const (
	prefix = "C8S-TESTINIT"
	okLine = prefix + " OK"
)

var console = os.Stdout

func report(format string, args ...any) {
	fmt.Fprintf(console, prefix+" "+format+"\n", args...)
}

func main() {
	err := run()
	if err != nil {
		report("FAIL %v", err)
	} else {
		fmt.Fprintln(console, okLine)
	}
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		report("FAIL reboot: %v", err)
	}
	select {} // PID 1 must not exit.
}

func run() error {
	mounts := []struct{ src, dst, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
	}
	for _, m := range mounts {
		if err := unix.Mount(m.src, m.dst, m.fstype, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dst, err)
		}
	}
	if c, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		console = c
	}
	uname := unix.Utsname{}
	if err := unix.Uname(&uname); err == nil {
		report("KERNEL %s", unix.ByteSliceToString(uname.Release[:]))
	}
	if err := loadModules("/etc/c8s/modules"); err != nil {
		return err
	}
	if err := checkFilesystems("erofs", "overlay"); err != nil {
		return err
	}
	for _, drv := range []string{"virtio_scsi", "virtio_console"} {
		if _, err := os.Stat(filepath.Join("/sys/bus/virtio/drivers", drv)); err != nil {
			return fmt.Errorf("virtio driver %s not registered: %w", drv, err)
		}
	}
	if err := checkVirtioPorts(); err != nil {
		return err
	}
	out, err := exec.Command("/usr/bin/runc", "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("/usr/bin/runc --version: %w: %s", err, out)
	}
	report("RUNC %s", strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", " | "))
	return nil
}

// loadModules loads each module path listed in list, in order, reporting
// "MODULE <path> loaded|exists|nodev". EEXIST (already loaded) is accepted;
// ENODEV is reported, and the test decides which modules may return it.
func loadModules(list string) error {
	f, err := os.Open(list)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path := strings.TrimSpace(sc.Text())
		if path == "" {
			continue
		}
		status, err := loadModule(path)
		if err != nil {
			return fmt.Errorf("load module %s: %w", path, err)
		}
		report("MODULE %s %s", path, status)
	}
	return sc.Err()
}

func loadModule(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	switch {
	case err == nil:
		return "loaded", nil
	case errors.Is(err, unix.EEXIST):
		return "exists", nil
	case errors.Is(err, unix.ENODEV):
		return "nodev", nil
	}
	return "", err
}

func checkFilesystems(names ...string) error {
	data, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 {
			have[fields[len(fields)-1]] = true
		}
	}
	for _, n := range names {
		if !have[n] {
			return fmt.Errorf("file system %s not available after loading modules", n)
		}
	}
	return nil
}

// checkVirtioPorts reports every virtio-serial port as "PORT <dev> <name>"
// after checking that its device node exists. Without udev there is no
// /dev/virtio-ports/NAME; the name is in /sys/class/virtio-ports/DEV/name.
func checkVirtioPorts() error {
	devs, err := os.ReadDir("/sys/class/virtio-ports")
	if err != nil {
		return fmt.Errorf("virtio-serial ports: %w", err)
	}
	if len(devs) == 0 {
		return errors.New("no virtio-serial ports in /sys/class/virtio-ports")
	}
	for _, d := range devs {
		name, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", d.Name(), "name"))
		if err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join("/dev", d.Name())); err != nil {
			return fmt.Errorf("virtio-serial port device: %w", err)
		}
		report("PORT /dev/%s %s", d.Name(), strings.TrimSpace(string(name)))
	}
	if _, err := os.Stat("/dev/virtio-ports"); err == nil {
		report("VIRTIO-PORTS-DIR present")
	} else {
		report("VIRTIO-PORTS-DIR absent")
	}
	return nil
}
