// Package boot is c8s-agent's main program: as the VM's PID 1 it runs the
// sealed image's first stage in its own process (guest/stage1: the
// verified root becomes /), sets up the guest (initsys), starts the reaper,
// and serves the agent's ttrpc services on the host channel until the VM is
// powered off. It never returns.
package boot

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/signal"
	"sync"
	"time"

	runc "github.com/containerd/go-runc"
	"github.com/containerd/log"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/c8s-dev/c8s/guest/agent"
	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/guest/attest"
	"github.com/c8s-dev/c8s/guest/channel"
	"github.com/c8s-dev/c8s/guest/initsys"
	"github.com/c8s-dev/c8s/guest/kbs"
	"github.com/c8s-dev/c8s/guest/ociruntime"
	"github.com/c8s-dev/c8s/guest/reaper"
	"github.com/c8s-dev/c8s/guest/stage1"
)

// PowerOffEnv, set through the kernel command line (c8s_poweroff=1; the
// kernel hands parameters without a dot to init as environment), makes PID
// 1 power the VM off at once. `make bench` times such boots as the bare
// baseline for pod start-up.
const PowerOffEnv = "c8s_poweroff"

// Guest paths.
const (
	StateDir      = "/run/c8s/containers"
	RuncRoot      = "/run/runc"
	CgroupsParent = "/c8s"
	// portWait bounds the wait for the virtio-serial port after module load.
	portWait = 5 * time.Second
)

// Main runs the agent.
func Main() {
	started := initsys.Uptime()
	pid1 := os.Getpid() == 1
	// sealed: the first stage made the verified root /, at uptime rootAt.
	var (
		sealed bool
		rootAt time.Duration
	)
	if pid1 {
		// Before anything else: in a sealed image, the first stage. It
		// returns with the verified root as /, or with why not, and then
		// nothing more may run.
		var err error
		if sealed, err = stage1.Run(); err != nil {
			stage1.Fail(err)
		}
		rootAt = initsys.Uptime()
		// The kernel named PID 1 after its file, /init.
		_ = os.WriteFile("/proc/self/comm", []byte("c8s-agent"), 0)
	}
	if pid1 && os.Getenv(PowerOffEnv) == "1" {
		// The benchmark's baseline: a boot that reaches init and powers off.
		initsys.PowerOff()
	}
	level := logrus.InfoLevel
	if v, ok := initsys.KernelParam("c8s.log_level"); ok {
		if l, err := logrus.ParseLevel(v); err == nil {
			level = l
		}
	}
	fatal := func(err error) {
		if pid1 {
			initsys.Fatal(err)
		}
		log.L.WithError(err).Fatal("c8s-agent failed")
	}
	if pid1 {
		// The Go runtime would exit on SIGTERM, SIGINT or SIGHUP, and PID 1
		// exiting panics the kernel. Catch them (rather than ignore them:
		// an ignored signal stays ignored in the OCI runtime and the
		// containers).
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGHUP)
		go func() {
			for sig := range sigs {
				log.L.Warnf("PID 1 received %v; ignoring it", sig)
			}
		}()
		if !sealed {
			// The unsealed initramfs: containers need a root that
			// pivot_root can leave (the first stage's is one).
			if err := initsys.SwitchRoot(); err != nil {
				fatal(err)
			}
		}
		initsys.SetupConsoleLogging(level)
		os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
		if err := initsys.MountAll(); err != nil {
			fatal(err)
		}
		// Before any container: no core file of a container's process
		// may land on a disk or share the host reads.
		if err := initsys.DisableCoreDumps("/proc/sys"); err != nil {
			fatal(err)
		}
		log.L.WithField("guest_uptime", initsys.Uptime()).Debug("filesystems mounted")
		tee, err := startedAs(cmdlinePath)
		if errors.Is(err, attest.ErrHardwareMismatch) {
			// The hardware is not the TEE the measured command line
			// names: the VM runs as neither.
			fatal(err)
		} else if err != nil {
			// The evidence source fails closed on it; here it only
			// means no host entropy.
			log.L.WithError(err).Warn("read the TEE this VM was started as")
		}
		// The modules boot loads are the SCSI stack for the containers'
		// root disks. Load them while the agent starts serving and the
		// pod attests: whoever needs a disk waits for it to appear
		// (rootfs.FindSCSIDisk), not for this. First, in a sim VM, the
		// entropy source the first crypto/rand read waits for
		// (hostEntropy).
		go func() {
			if load := hostEntropy(tee, func() {
				initsys.LoadModules(initsys.ModulesList, func(p string) bool { return initsys.Deferred(p, hwRNGModules) })
			}); load != nil {
				load()
				log.L.WithField("guest_uptime", initsys.Uptime()).Info("loaded the virtio-rng driver (sim TEE)")
			}
			n := initsys.LoadModules(initsys.ModulesList, func(p string) bool { return !initsys.Deferred(p) })
			log.L.WithField("guest_uptime", initsys.Uptime()).Infof("loaded %d kernel modules", n)
			// A container run from its image's layers (the default)
			// gets an overlay for its writable layer: load overlayfs
			// while the host verifies the attestation rather than in
			// the first CreateContainer (which still loads it if this
			// has not finished; device-mapper and dm-verity are the
			// first stage's, loaded already).
			initsys.LoadModules(initsys.ModulesList, func(p string) bool { return initsys.Deferred(p, "/fs/overlayfs/") })
			// Last: it matters once boot has freed what it touched.
			if load := freePageReporting(tee, func() {
				initsys.LoadModules(initsys.ModulesList, func(p string) bool { return initsys.Deferred(p, initsys.BalloonModule) })
			}); load != nil {
				load()
			}
		}()
		if err := initsys.SetupNetwork(); err != nil {
			log.L.WithError(err).Error("network setup failed")
		}
	} else {
		logrus.SetLevel(level)
	}
	log.L.WithField("version", agent.Version).WithField("pid1", pid1).WithField("guest_uptime", started).Info("c8s-agent starting")

	r, err := reaper.New()
	if err != nil {
		fatal(err)
	}
	runc.Monitor = r
	l, ch, err := channel.Listen(portWait, func() {
		if pid1 {
			initsys.LoadModules(initsys.ModulesList, func(p string) bool { return initsys.Deferred(p, "/net/vmw_vsock/") })
		}
	})
	if err != nil {
		fatal(err)
	}
	cfg := agent.Config{
		StateDir:      StateDir,
		CgroupsParent: CgroupsParent,
		Runtime:       ociRuntime(r, os.Stat),
		Channel:       ch,
	}
	if pid1 {
		cfg.PowerOff = initsys.PowerOff
	}
	cfg.Evidence = evidence(pid1)
	cfg.KBSDial = kbsDial()
	cfg.SecretsDir = agent.SecretsDir
	cfg.SharedDir = agent.SharedDir
	// The TEE the VM was started as decides where containers' writes and
	// emptyDirs live, and the policy of a VM launched without init data.
	// A command line that cannot be read or names an unknown TEE leaves
	// it unset: the evidence source then fails the same way, and the
	// agent takes no container (requirePolicy fails closed).
	if tee, err := startedAs(cmdlinePath); errors.Is(err, attest.ErrHardwareMismatch) {
		fatal(err)
	} else if err != nil {
		log.L.WithError(err).Error("the TEE this VM was started as is unknown")
	} else {
		cfg.TEE = tee
	}
	for param, size := range map[string]*string{"c8s.scratch_size": &cfg.ScratchSize, "c8s.emptydir_size": &cfg.EmptyDirSize} {
		if v, ok := initsys.KernelParam(param); ok {
			if !agent.ValidTmpfsSize(v) {
				log.L.Warnf("ignoring %s=%s: not a tmpfs size (bytes with k, m or g, or a percentage of RAM)", param, v)
				continue
			}
			*size = v
		}
	}
	if pid1 {
		cfg.MountSecrets = agent.MountSecretsTmpfs
		cfg.LoadOverlay = func() {
			initsys.LoadModules(initsys.ModulesList, func(p string) bool { return initsys.Deferred(p, "/fs/overlayfs/") })
		}
		cfg.LoadVerity = func() {
			initsys.LoadModules(initsys.ModulesList, func(p string) bool {
				return initsys.Deferred(p, "/drivers/md/", "/lib/reed_solomon/", "/lib/libcrc32c")
			})
		}
		cfg.LoadNetDriver = func() {
			// The bridge modules too: the guest has no modprobe for a
			// container's `brctl addbr` to load them on demand.
			initsys.LoadModules(initsys.ModulesList, func(p string) bool {
				return initsys.Deferred(p, "/drivers/net/", "/net/core/failover", "/net/bridge/", "/net/802/", "/net/llc/")
			})
		}
		cfg.LoadNetfilter = func() {
			initsys.LoadModules(initsys.ModulesList, func(p string) bool {
				return initsys.Deferred(p, "/net/netfilter/", "/net/ipv4/netfilter/", "/net/ipv6/netfilter/", "/lib/libcrc32c")
			})
		}
	}
	svc, err := agent.New(cfg)
	if err != nil {
		fatal(err)
	}
	srv, err := svc.NewServer()
	if err != nil {
		fatal(err)
	}
	// The boot times (guest clock) end up in the host's start trace
	// (shim/sandbox.GuestBoot): the kernel's start to the agent's main,
	// to the verified root in place, to serving.
	fields := logrus.Fields{"channel": ch, "address": l.Addr().String(), "boot_agent": started, "guest_uptime": initsys.Uptime()}
	if sealed {
		fields["boot_root"] = rootAt
	}
	log.L.WithFields(fields).Info("serving")
	for {
		err := srv.Serve(context.Background(), l)
		log.L.WithError(err).Error("ttrpc server stopped; serving again in 1s")
		time.Sleep(time.Second)
	}
}

// ociRuntime picks the guest's OCI runtime: crun when the image carries it,
// since under emulation its start-up costs a fraction of runc's (a Go
// binary that re-executes itself), else runc. Debian 12's crun accepts
// ociVersion 1.0 and 1.1 only, so bundles for it say 1.1.0; the fields
// runtime-spec 1.2 added that it does not know it ignores. Only an image
// without crun gets runc: a crun the root cannot read (a block the host
// corrupted fails dm-verity with EIO) stays the runtime, and fails every
// create, rather than swap in the other runtime.
func ociRuntime(r *reaper.Reaper, stat func(string) (os.FileInfo, error)) *ociruntime.Runtime {
	if _, err := stat("/usr/bin/crun"); err != nil && errors.Is(err, fs.ErrNotExist) {
		return &ociruntime.Runtime{Command: "/usr/bin/runc", Root: RuncRoot, Reaper: r}
	}
	return &ociruntime.Runtime{Command: "/usr/bin/crun", SpecVersion: "1.1.0", Root: RuncRoot, Reaper: r}
}

// cmdlinePath is the kernel command line the guest was booted with.
const cmdlinePath = "/proc/cmdline"

// evidence returns the agent's evidence source: the provider of the TEE the
// VM was started as (c8s.tee on the measured kernel command line; see
// attest.Detect), detected on first use (loading the deferred TEE guest
// modules then, so that pods that never attest do not pay for them). A
// failed detection is retried on the next request; a VM started as snp or
// tdx without its TEE device keeps failing, and the agent fails closed.
func evidence(pid1 bool) func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
	var (
		mu       sync.Mutex
		provider attest.Provider
	)
	detect := func(ctx context.Context) (attest.Provider, error) {
		mu.Lock()
		defer mu.Unlock()
		if provider != nil {
			return provider, nil
		}
		tee, err := startedAs(cmdlinePath)
		if err != nil {
			return nil, err
		}
		p, err := attest.Detect(ctx, "/", tee, teeModules(pid1, tee, func() {
			initsys.LoadModules(initsys.ModulesList, func(p string) bool { return initsys.Deferred(p, "/fs/configfs/", "/drivers/virt/coco/") })
		}))
		if err != nil {
			return nil, err
		}
		log.L.WithField("provider", p.Name()).WithField("tee", tee).Info("attestation provider")
		provider = p
		return p, nil
	}
	return func(ctx context.Context, reportData [64]byte) (*agentapi.GetEvidenceResponse, error) {
		p, err := detect(ctx)
		if err != nil {
			return nil, err
		}
		ev, err := p.Evidence(ctx, reportData)
		if err != nil {
			return nil, err
		}
		return &agentapi.GetEvidenceResponse{Kind: ev.Kind, Provider: ev.Provider, Report: ev.Report, CertTable: ev.CertTable, TdReport: ev.TDReport,
			EventLog: ev.EventLog, SimRtmrs: ev.SimRTMRs}, nil
	}
}

// teeModules returns load, which loads the TEE guest drivers, where the
// evidence source may need them: in PID 1 (only it loads modules) of a VM
// not started as sim. The sim TEE's secure processor answers on a
// virtio-serial port, and trying sev-guest and tdx-guest there (both
// refuse to load) would only delay the pod's first evidence.
func teeModules(pid1 bool, tee string, load func()) func() {
	if !pid1 || tee == teeparam.Sim {
		return nil
	}
	return load
}

// hwRNGModules is the module-path fragment of the virtio-rng driver.
const hwRNGModules = "/drivers/char/hw_random/"

// hostEntropy returns load, which loads the virtio-rng driver, where the
// kernel may take its first random bytes from the host: in a VM started
// as sim. QEMU's TCG CPU has no RDRAND, so without a seed the kernel's
// random pool is not ready when the agent first reads crypto/rand (the
// nonce of its first CreateContainer), and getrandom(2) then spends about
// a second of guest CPU collecting timer jitter. The sim TEE's host is
// trusted by construction. A hardware TEE's kernel is seeded from the
// CPU's RDRAND/RDSEED at boot and never takes the host's (the
// adversary's) device.
func hostEntropy(tee string, load func()) func() {
	if tee != teeparam.Sim {
		return nil
	}
	return load
}

// freePageReporting returns load, which loads the virtio-balloon driver,
// in a VM started as sim: its QEMU has a free page reporting balloon
// (launcher/vm/tee/sim.FreePageReporting) to which the guest hands back the
// pages it frees, so that the host does not keep resident every page the
// guest's boot touched. A hardware TEE's guest binds no balloon from the
// host (the adversary): its private memory cannot be handed back that way,
// and the driver would only take the host's requests.
func freePageReporting(tee string, load func()) func() {
	if tee != teeparam.Sim {
		return nil
	}
	return load
}

// hardware is the hardware TEE the guest runs in, as its kernel shows it.
var hardware attest.Hardware = attest.KernelHardware{Root: "/"}

// startedAs returns the TEE the kernel command line in the file at path
// names (teeparam.Key), or "" when it names none (a launcher that predates
// the parameter), once the hardware agrees (attest.StartedAs; else
// attest.ErrHardwareMismatch). An unreadable command line or a bad value is
// an error, not "none": the guest must not guess that it runs without a
// TEE.
func startedAs(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the kernel command line for %s: %w", teeparam.Key, err)
	}
	return attest.StartedAs(string(raw), hardware)
}

// kbsDial returns the dialer for the pod's key broker: streams over the
// relay port the host serves (the pod VM has no other path to it).
func kbsDial() func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &kbs.PortDialer{Open: func() (net.Conn, error) {
		path, ok := channel.FindPort("/", kbs.PortName)
		if !ok {
			return nil, fmt.Errorf("this VM has no virtio-serial port %s", kbs.PortName)
		}
		return channel.DialPort(path)
	}}
	return d.DialContext
}
