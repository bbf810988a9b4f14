// Package initsys does what c8s-agent must do as the VM's PID 1 before it
// can run containers: mount the API filesystems and cgroup2, load the
// kernel modules the image lists, bring up loopback, set the hostname,
// disable core dumps (coredump.go), log to the console, and power the VM
// off when asked or when all is lost.
package initsys

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
)

// ModulesList is the image's list of kernel modules, one path per line (under
// /lib/modules/<release>/ unless absolute), in load order.
const ModulesList = "/etc/c8s/modules"

// Hostname is the guest's hostname; containers get their own UTS namespace.
const Hostname = "c8s"

type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

var mounts = []mount{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, ""},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5"},
	{"shm", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
	{"cgroup2", "/sys/fs/cgroup", "cgroup2", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RELATIME, "nsdelegate"},
}

// Mount mounts the API filesystem MountAll mounts at target, with the same
// flags, unless target is a mount point already.
func Mount(target string) error {
	for _, m := range mounts {
		if m.target == target {
			return m.mount()
		}
	}
	return fmt.Errorf("%s is not an API filesystem's mount point", target)
}

func (m mount) mount() error {
	if err := os.MkdirAll(m.target, 0o755); err != nil {
		return fmt.Errorf("create mount point %s: %w", m.target, err)
	}
	if mounted(m.target) {
		return nil
	}
	err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
	if err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
	}
	return nil
}

// mounted reports whether dir is a mount point: on another file system
// than its parent. (A mount of proc, sysfs or devtmpfs over one already
// there does not fail with EBUSY: it stacks another.)
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(dir, &st) != nil || unix.Stat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

// cgroupControllers are enabled for the containers' cgroups where the kernel
// has them.
var cgroupControllers = []string{"cpu", "memory", "pids", "io", "cpuset", "hugetlb"}

// SetupConsoleLogging sends the logs to /dev/console (the serial port).
func SetupConsoleLogging(level logrus.Level) {
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY|unix.O_NOCTTY, 0); err == nil {
		logrus.SetOutput(f)
	}
	logrus.SetLevel(level)
	logrus.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, TimestampFormat: time.RFC3339Nano, DisableColors: true})
}

// MountAll mounts the API filesystems and cgroup2 and enables the cgroup
// controllers. Mount points that are already mounted (the sealed image's
// first stage mounted /proc, /sys and /dev) are left alone.
func MountAll() error {
	for _, m := range mounts {
		if err := m.mount(); err != nil {
			return err
		}
	}
	for _, l := range [][2]string{
		{"/proc/self/fd", "/dev/fd"}, {"/proc/self/fd/0", "/dev/stdin"},
		{"/proc/self/fd/1", "/dev/stdout"}, {"/proc/self/fd/2", "/dev/stderr"},
	} {
		if err := os.Symlink(l[0], l[1]); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("link %s: %w", l[1], err)
		}
	}
	EnableControllers("/sys/fs/cgroup")
	return nil
}

// EnableControllers enables, in the subtree_control of the cgroup at dir,
// every controller of cgroupControllers that dir's cgroup.controllers offers.
func EnableControllers(dir string) {
	raw, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		log.L.WithError(err).Warn("cannot read the available cgroup controllers")
		return
	}
	for _, c := range wantedControllers(strings.Fields(string(raw))) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
			log.L.WithError(err).Warnf("enable cgroup controller %s", c)
		}
	}
}

// wantedControllers are the cgroupControllers among available, in
// cgroupControllers order.
func wantedControllers(available []string) []string {
	var out []string
	for _, c := range cgroupControllers {
		if slices.Contains(available, c) {
			out = append(out, c)
		} else {
			log.L.Infof("cgroup controller %s is not available", c)
		}
	}
	return out
}

// DeferredModules are the parts of the module list that boot does not
// load, because most pods never need them: the TEE guest drivers and
// configfs (attestation loads them), vsock (loaded only when there is no
// virtio-serial port), device-mapper with its libraries, erofs, overlayfs,
// virtio-blk (the sealed image's first stage loads those it needs; the
// agent loads overlayfs for a container's writable layer), and the
// network drivers and the bridge (loaded when a pod needs them), and
// netfilter (loaded for a pod of the attested mesh). Under emulation every module costs boot time. Each entry is a
// path fragment of the module file.
var DeferredModules = []string{
	"/drivers/virt/coco/", "/fs/configfs/", // attestation
	"/net/vmw_vsock/",                                                                      // only without a virtio-serial port
	"/drivers/md/", "/lib/reed_solomon/", "/lib/libcrc32c", "/fs/erofs/", "/fs/overlayfs/", // verity, erofs, overlay
	"/drivers/block/virtio_blk",                                                     // root disks are on virtio-scsi
	"/drivers/net/", "/net/core/failover", "/net/bridge/", "/net/802/", "/net/llc/", // pod networking, bridges in containers
	"/net/netfilter/", "/net/ipv4/netfilter/", "/net/ipv6/netfilter/", // the mesh's redirects (nftables)
	"/drivers/char/hw_random/", // virtio-rng: only a sim VM takes the host's entropy (guest/boot)
	// virtio-balloon: free page reporting in sim VMs only (launcher/vm/tee/sim);
	// an SNP or TDX guest binds no host balloon
	BalloonModule,
}

// BalloonModule is the module-path fragment of the virtio-balloon driver,
// through which a sim VM reports the pages it frees to the host.
const BalloonModule = "/drivers/virtio/virtio_balloon"

// LoadModules loads, in order, the modules of the list file for which want
// returns true (every module when want is nil), ignoring modules already
// loaded, and returns how many it loaded.
func LoadModules(list string, want func(path string) bool) int {
	f, err := os.Open(list)
	if errors.Is(err, os.ErrNotExist) {
		log.L.Infof("no module list at %s", list)
		return 0
	}
	if err != nil {
		log.L.WithError(err).Error("open module list")
		return 0
	}
	defer f.Close()
	var u unix.Utsname
	_ = unix.Uname(&u)
	paths, err := moduleList(f, filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:])))
	if err != nil {
		log.L.WithError(err).Errorf("read module list %s", list)
	}
	loaded := 0
	for _, path := range paths {
		if want != nil && !want(path) {
			continue
		}
		if moduleLive(sysModuleDir, path) {
			// Loaded already (the first stage's, or another caller's):
			// finit_module would check its signature again before
			// finding it loaded, which costs time under emulation.
			continue
		}
		t0 := Uptime()
		err := finitModuleRetrying(path)
		log.L.WithField("took", Uptime()-t0).WithField("guest_uptime", Uptime()).Debugf("kernel module %s", filepath.Base(path))
		if err != nil {
			if errors.Is(err, unix.ENODEV) {
				// Platform drivers (sev-guest, tdx-guest) refuse to load
				// on other platforms.
				log.L.Infof("kernel module %s: no such device on this machine", path)
				continue
			}
			log.L.WithError(err).Errorf("load kernel module %s", path)
			continue
		}
		loaded++
	}
	return loaded
}

// Deferred reports whether a module path belongs to DeferredModules, or,
// with fragments, to those fragments.
func Deferred(path string, fragments ...string) bool {
	if len(fragments) == 0 {
		fragments = DeferredModules
	}
	for _, f := range fragments {
		if strings.Contains(path, f) {
			return true
		}
	}
	return false
}

// moduleList parses a module list: one path per line, relative to base
// unless absolute; blank lines and # comments are skipped.
func moduleList(r io.Reader, base string) ([]string, error) {
	var paths []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		path := strings.TrimSpace(sc.Text())
		if path == "" || strings.HasPrefix(path, "#") {
			continue
		}
		if !filepath.IsAbs(path) {
			path = filepath.Join(base, path)
		}
		paths = append(paths, path)
	}
	return paths, sc.Err()
}

// Loaded reports whether the module in file path is loaded and live.
func Loaded(path string) bool { return moduleLive(sysModuleDir, path) }

// sysModuleDir is where the kernel lists its modules.
var sysModuleDir = "/sys/module"

// finitModule loads a module file (a variable for tests).
var finitModule = loadModule

// finitModuleRetrying is finitModule, again while it fails with EINTR: a
// signal (the agent's SIGCHLD when a container's runtime exits) can
// interrupt finit_module while the module's init waits, and the module
// must still load (a lost overlay load failed the pod's first create with
// "fsopen overlay: no such device").
func finitModuleRetrying(path string) error {
	for {
		err := finitModule(path)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// moduleLive reports whether the module of file path is loaded and
// initialized, as sysModule/NAME/initstate says. One still loading is not
// (finit_module then waits for it).
func moduleLive(sysModule, path string) bool {
	state, err := os.ReadFile(filepath.Join(sysModule, moduleName(path), "initstate"))
	return err == nil && strings.TrimSpace(string(state)) == "live"
}

// ModuleParams are the parameters the guest loads a module with, by module
// name. scsi_mod scans nothing by itself (scan=manual): a pod's disks come
// to the virtio-scsi controller by hot-plug, which adds each one, or are
// asked for one address at a time (rootfs.FindSCSIDisk); the default
// asynchronous scan of every target of the controller cost 50-420 ms of
// guest time on the create path under emulation (issue 18).
var ModuleParams = map[string]string{
	"scsi_mod": "scan=manual",
}

// moduleName is the kernel's name of the module in file path.
func moduleName(path string) string {
	return strings.ReplaceAll(strings.TrimSuffix(filepath.Base(path), ".ko"), "-", "_")
}

// finitModuleFd is finit_module(2) (a variable for tests).
var finitModuleFd = unix.FinitModule

func loadModule(path string) error {
	mod, err := os.Open(path)
	if err != nil {
		return err
	}
	defer mod.Close()
	err = finitModuleFd(int(mod.Fd()), ModuleParams[moduleName(path)], 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// SetupNetwork sets the hostname and brings up the loopback interface.
func SetupNetwork() error {
	if err := unix.Sethostname([]byte(Hostname)); err != nil {
		return fmt.Errorf("set hostname: %w", err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("socket for interface setup: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("get flags of lo: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bring up lo: %w", err)
	}
	return nil
}

// PowerOff syncs and powers the VM off. As PID 1 it never returns: should
// the reboot call fail, it parks forever (exiting would panic the kernel).
func PowerOff() {
	log.L.Info("powering off")
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		log.L.WithError(err).Error("power off failed")
	}
	select {}
}

// Fatal logs err and powers the VM off.
func Fatal(err error) {
	log.L.WithError(err).Error("fatal error in c8s-agent")
	PowerOff()
}

// KernelParam returns the value of key=value on the kernel command line, and
// whether key appears (a bare key has the value "").
func KernelParam(key string) (string, bool) {
	raw, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return "", false
	}
	return cmdlineParam(string(raw), key)
}

func cmdlineParam(cmdline, key string) (string, bool) {
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		if k == key {
			return v, true
		}
	}
	return "", false
}

// Uptime returns the time since the guest kernel started
// (CLOCK_BOOTTIME), for boot-time diagnostics; zero if it cannot be read.
func Uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano()).Round(time.Millisecond)
}
