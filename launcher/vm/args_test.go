package vm

import (
	"net"
	"os"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm/tee"

	"github.com/c8s-dev/c8s/guest/api/verity"
	"github.com/c8s-dev/c8s/internal/golden"
)

// goldenSpec is a fixed spec; paths need not exist since Args is pure.
func goldenSpec(teeName, accel string) Spec {
	h := config.Default().Hypervisor
	h.Kernel = "/usr/share/c8s/vmlinuz"
	h.Initrd = "/usr/share/c8s/initrd.img"
	h.KernelParams = "c8s.debug=1"
	h.DefaultVCPUs = 2
	h.DefaultMemoryMiB = 1024
	h.TEE = teeName
	if teeName != "sim" {
		h.Firmware = "/usr/share/ovmf/OVMF.fd"
	}
	h.SNP.HostData = strings.Repeat("ab", 32)
	h.TDX.MRConfigID = strings.Repeat("cd", 48)
	return Spec{
		ID:         "pod-1",
		StateDir:   "/run/c8s/pod-1",
		Hypervisor: h,
		Accel:      accel,
		Disks: []Disk{
			{ID: "rootfs", Path: "/var/lib/c8s/rootfs.erofs", ReadOnly: true},
			{ID: "scratch", Path: "/var/lib/c8s/scratch,1.img"},
		},
	}
}

// sealed gives s the root disk of a sealed image.
func sealed(s Spec) Spec {
	p := verity.Params{Device: "/dev/vda", FSType: "erofs", RootHash: strings.Repeat("5e", 32),
		Salt: strings.Repeat("a1", 32), DataBlocks: 6886, HashStartBlock: 6887}
	s.Root = &RootDisk{Path: "/usr/share/c8s/rootfs.img", KernelParams: p.KernelParams()}
	return s
}

func TestArgsGolden(t *testing.T) {
	cases := []struct {
		name string
		spec Spec
	}{
		{"sim", goldenSpec("sim", "tcg")},
		{"sim-vsock", func() Spec { s := goldenSpec("sim", "kvm"); s.VsockCID = 7; s.Disks = nil; return s }()},
		{"snp", goldenSpec("snp", "kvm")},
		{"tdx", goldenSpec("tdx", "kvm")},
		{"sim-virtiofs", func() Spec {
			s := goldenSpec("sim", "tcg")
			s.SharedFS = &SharedFS{Socket: "/run/c8s/fs/pod-1/virtiofsd.sock", Tag: "c8s-shared"}
			return s
		}()},
		{"snp-virtiofs", func() Spec {
			s := goldenSpec("snp", "kvm")
			s.SharedFS = &SharedFS{Socket: "/run/c8s/fs/pod-1/virtiofsd.sock", Tag: "c8s-shared"}
			return s
		}()},
		{"sim-netdev", func() Spec {
			s := goldenSpec("sim", "tcg")
			s.NICs = []NetDevice{{MAC: net.HardwareAddr{0x02, 0x42, 0x0a, 0x58, 0x00, 0x07}, Tap: os.NewFile(100, "tap0_c8s")}}
			return s
		}()},
		{"sim-sealed", sealed(goldenSpec("sim", "tcg"))},
		// Room to grow: only -smp and -m change.
		{"sim-hotplug", func() Spec {
			s := sealed(goldenSpec("sim", "tcg"))
			s.Hypervisor.DefaultMaxVCPUs, s.Hypervisor.DefaultMaxMemoryMiB = 4, 4096
			return s
		}()},
		{"snp-sealed", sealed(goldenSpec("snp", "kvm"))},
		{"tdx-sealed", sealed(goldenSpec("tdx", "kvm"))},
		{"snp-igvm", func() Spec {
			s := sealed(goldenSpec("snp", "kvm"))
			s.Hypervisor.Firmware, s.Hypervisor.IGVM = "", "/usr/share/c8s/snp.igvm"
			return s
		}()},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b, err := tee.Lookup(c.spec.Hypervisor.TEE)
			if err != nil {
				t.Fatal(err)
			}
			argv, err := Args(c.spec, b)
			if err != nil {
				t.Fatalf("Args: %v", err)
			}
			got := strings.Join(argv, "\n") + "\n"
			golden.Check(t, c.name, []byte(got))
		})
	}
}

func TestArgsErrors(t *testing.T) {
	sim, _ := tee.Lookup("sim")
	snp, _ := tee.Lookup("snp")
	cases := []struct {
		name    string
		mutate  func(*Spec)
		backend tee.Backend
		want    string
	}{
		{"snp-under-tcg", func(s *Spec) { s.Hypervisor.TEE = "snp"; s.Hypervisor.Firmware = "/fw"; s.Accel = "tcg" }, snp, "needs KVM"},
		{"auto-accel", func(s *Spec) { s.Accel = "auto" }, sim, "resolve \"auto\""},
		{"bad-id", func(s *Spec) { s.ID = "a/b" }, sim, "ID \"a/b\""},
		{"relative-state-dir", func(s *Spec) { s.StateDir = "run/x" }, sim, "absolute path"},
		{"long-state-dir", func(s *Spec) { s.StateDir = "/" + strings.Repeat("x", 100) }, sim, "too long for unix sockets"},
		// agent.sock fits, the sim TEE's c8s.attest.sock does not.
		{"long-for-port-socket", func(s *Spec) { s.StateDir = "/" + strings.Repeat("x", 95) }, sim, "too long for unix sockets (c8s.attest.sock: 112 > 107 bytes)"},
		{"duplicate-disk", func(s *Spec) { s.Disks = append(s.Disks, s.Disks[0]) }, sim, "used twice"},
		{"relative-disk", func(s *Spec) { s.Disks[0].Path = "disk.img" }, sim, "must be absolute"},
		{"no-kernel", func(s *Spec) { s.Hypervisor.Kernel = "" }, sim, "make image"},
		{"kernel-params-set-tee", func(s *Spec) { s.Hypervisor.KernelParams = "debug c8s.tee=snp" }, sim, "sets c8s.tee"},
		{"kernel-params-set-root", func(s *Spec) { s.Hypervisor.KernelParams = "debug c8s.verity.roothash=ee" }, sim, "sets c8s.verity.roothash"},
		{"no-backend", func(*Spec) {}, nil, "no TEE backend"},
		{"nic-without-tap", func(s *Spec) { s.NICs = []NetDevice{{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}} }, sim, "no open tap"},
		{"fs-bad-tag", func(s *Spec) { s.SharedFS = &SharedFS{Socket: "/run/fs.sock", Tag: "a,b"} }, sim, "shared fs tag"},
		{"fs-relative-socket", func(s *Spec) { s.SharedFS = &SharedFS{Socket: "fs.sock", Tag: "t"} }, sim, "shared fs socket"},
		{"snp-hotplug", func(s *Spec) {
			s.Hypervisor.TEE, s.Hypervisor.Firmware, s.Accel, s.Hypervisor.DefaultMaxVCPUs = "snp", "/fw", "kvm", 4
		}, snp, "tee snp cannot grow"},
		{"nic-bad-mac", func(s *Spec) { s.NICs = []NetDevice{{MAC: net.HardwareAddr{2, 0}, Tap: os.Stdin}} }, sim, "6-byte"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := goldenSpec("sim", "tcg")
			c.mutate(&s)
			_, err := Args(s, c.backend)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Args error = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// Every TEE's VM boots with the initcall blacklist (hardware-safe boot
// work trims, see BaseKernelParams) and the free page reporting order
// (inert without a reporting device), and only a sim VM gets the free page
// reporting balloon: an SNP or TDX guest's private memory cannot be handed
// back that way.
func TestArgsBootTrimsAndFreePageReporting(t *testing.T) {
	for _, name := range []string{"sim", "snp", "tdx"} {
		t.Run(name, func(t *testing.T) {
			accel := "kvm"
			if name == "sim" {
				accel = "tcg"
			}
			spec := sealed(goldenSpec(name, accel))
			b, err := tee.Lookup(name)
			if err != nil {
				t.Fatal(err)
			}
			argv, err := Args(spec, b)
			if err != nil {
				t.Fatal(err)
			}
			var appendArg string
			for i, a := range argv {
				if a == "-append" && i+1 < len(argv) {
					appendArg = argv[i+1]
				}
			}
			if !strings.HasPrefix(appendArg, BaseKernelParams+" ") || !strings.Contains(BaseKernelParams, " "+InitcallBlacklist) {
				t.Errorf("-append %q does not start with the base parameters and their %s", appendArg, InitcallBlacklist)
			}
			for _, fn := range []string{"trace_eval_init", "init_kprobe_trace", "latency_fsnotify_init", "bpf_dummy_struct_ops_init", "bpf_tcp_ca_kfunc_init", "ftrace_check_for_weak_functions"} {
				if !strings.Contains(appendArg, fn) {
					t.Errorf("-append %q does not blacklist %s", appendArg, fn)
				}
			}
			if !strings.Contains(appendArg, " rootfstype=ramfs ") {
				t.Errorf("-append %q does not make the initramfs a ramfs (guest/stage1 refuses the runtime tree on tmpfs)", appendArg)
			}
			if !strings.Contains(appendArg, " page_reporting.page_reporting_order=5") {
				t.Errorf("-append %q does not lower the free page reporting order", appendArg)
			}
			balloon := strings.Contains(strings.Join(argv, " "), "virtio-balloon-pci,id=balloon0,free-page-reporting=on")
			if balloon != (name == "sim") {
				t.Errorf("%s argv has the free page reporting balloon: %v, want %v", name, balloon, name == "sim")
			}
		})
	}
}
