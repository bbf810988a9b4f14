package manager

import (
	"github.com/opencontainers/runtime-spec/specs-go/features"
)

// What containerd learns from `containerd-shim-c8s-v2 -info`: the OCI
// features of the runtime that runs the containers, which is crun inside
// the pod VM, not anything on the host. The shim cannot run `crun features`
// (crun is in the VM, and Debian 12's crun 1.8.1 has no `features` command
// anyway), so the document is built here from what that crun does, checked
// against it, and adjusted for the VM boundary:
//
//   - the host's spec goes through the agent's adapter (guest/spec) first:
//     it drops hooks, AppArmor profiles and SELinux labels, puts the
//     container in a cgroupfs cgroup under the guest's cgroup v2 root, and
//     rewrites ociVersion to one crun accepts;
//   - only what works in the guest (Debian's 6.12 kernel, cgroup v2 only,
//     no systemd, no resctrl, no RDMA) is claimed;
//   - what needs a peer on the host (a seccomp notify listener) is not.
//
// testdata/golden/features.json is the resulting document; the tests hold
// it there and check the crun facts against images/crun.sh, which builds
// the image's crun.
const (
	// guestCrunVersion and guestCrunCommit are `crun --version` of the
	// image's crun: Debian 12's crun 1.8.1-1+deb12u1, built static
	// (images/crun.sh).
	guestCrunVersion = "1.8.1"
	guestCrunCommit  = "f8a096be060b22ccd3d5f3ebe44108517fbf6c30"
	// guestLibseccompVersion is Debian 12's libseccomp, which
	// images/crun.sh links into crun.
	guestLibseccompVersion = "2.5.4"
	// guestKernelSeries is the guest kernel (images/build.sh KERNEL_PKG).
	// rro needs 5.12 (mount_setattr), idmapped tmpfs 6.3.
	guestKernelSeries = "6.12"
)

// ociVersionMax is the runtime-spec crun 1.8.1 parses: its libocispec pins
// runtime-spec v1.0.2-114-g494a5a6 (version.go says 1.0.2-dev), the same
// level runc 1.1 reports. The agent writes ociVersion 1.1.0 into bundles
// because crun's version check is a substring match on "1.0"; fields of
// later spec versions are ignored.
const ociVersionMax = "1.0.2-dev"

// guestMountOptions are the mount options crun 1.8.1 implements correctly
// on the guest kernel: its whole option table except the recursive ones it
// gets wrong. crun 1.8.1 hands the MS_* value of a recursive option to
// mount_setattr as if it were a MOUNT_ATTR_* value, which is right only for
// rro/rrw, rnosuid/rsuid, rnodev/rdev and rnoexec/rexec; the others fail
// with EINVAL (rsync, rasync, rmand, rnomand, ratime, rnoatime, rdiratime,
// rnodiratime, rstrictatime, rnostrictatime) or set another attribute
// (rdirsync sets nodiratime, rrelatime sets nosymfollow; rnorelatime does
// nothing), so they are left out. idmap is crun's idmapped mount (the
// mount's uidMappings/gidMappings, else the container's); ridmap is not in
// crun 1.8.1's table (it would be passed to mount(2) as data and ignored).
var guestMountOptions = []string{
	"async", "atime", "bind", "defaults", "dev", "diratime", "dirsync",
	"exec", "idmap", "mand", "noatime", "nodev", "nodiratime", "noexec",
	"nomand", "norelatime", "nostrictatime", "nosuid", "private", "rbind",
	"rdev", "relatime", "remount", "rexec", "rnodev", "rnoexec", "rnosuid",
	"ro", "rprivate", "rro", "rrw", "rshared", "rslave", "rsuid",
	"runbindable", "rw", "shared", "slave", "strictatime", "suid", "sync",
	"tmpcopyup", "unbindable",
}

// guestNamespaces are the namespaces crun creates in the guest. Not "time":
// crun 1.8.1 knows it but a container with a time and a pid namespace dies
// at creation (its init ends up pid 2). A namespace the host spec joins by
// path is replaced by a new one, except network, IPC, UTS and PID, which a
// pod's containers join from the pod's sandbox container (guest/spec).
var guestNamespaces = []string{"cgroup", "ipc", "mount", "network", "pid", "user", "uts"}

// guestCapabilities are the capabilities of the guest kernel (6.12:
// 0..CAP_CHECKPOINT_RESTORE), in kernel order, all of which crun (libcap
// 2.66) knows by name.
var guestCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER",
	"CAP_FSETID", "CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP",
	"CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST",
	"CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
	"CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE",
	"CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD",
	"CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP",
	"CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
	"CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF",
	"CAP_CHECKPOINT_RESTORE",
}

// Seccomp as crun 1.8.1 with libseccomp 2.5.4 does it. SCMP_ACT_NOTIFY is
// left out: its listener (linux.seccomp.listenerPath) would be a host
// socket, which a process in the VM cannot reach.
var (
	guestSeccompActions = []string{
		"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL",
		"SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL_THREAD", "SCMP_ACT_LOG",
		"SCMP_ACT_TRACE", "SCMP_ACT_TRAP",
	}
	guestSeccompOperators = []string{
		"SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_LE",
		"SCMP_CMP_LT", "SCMP_CMP_MASKED_EQ", "SCMP_CMP_NE",
	}
	// guestSeccompArchs are the names libseccomp 2.5.4 resolves. A filter
	// may only combine architectures of one byte order (x86_64 with the
	// little-endian ones).
	guestSeccompArchs = []string{
		"SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM", "SCMP_ARCH_MIPS",
		"SCMP_ARCH_MIPS64", "SCMP_ARCH_MIPS64N32", "SCMP_ARCH_MIPSEL",
		"SCMP_ARCH_MIPSEL64", "SCMP_ARCH_MIPSEL64N32", "SCMP_ARCH_PARISC",
		"SCMP_ARCH_PARISC64", "SCMP_ARCH_PPC", "SCMP_ARCH_PPC64",
		"SCMP_ARCH_PPC64LE", "SCMP_ARCH_RISCV64", "SCMP_ARCH_S390",
		"SCMP_ARCH_S390X", "SCMP_ARCH_X32", "SCMP_ARCH_X86", "SCMP_ARCH_X86_64",
	}
	// guestSeccompFlags are the filter flags crun 1.8.1 knows; the 6.12
	// kernel supports them all.
	guestSeccompFlags = []string{
		"SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_SPEC_ALLOW",
		"SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV",
	}
)

// unsafeConfigAnnotations are the config.json annotations (a trailing "."
// makes a prefix) that change how the container or its pod VM is run, and
// that an engine should not pass on from untrusted sources: c8s's shim
// grouping, the Kata-compatible VM settings (honoured only when the node's
// hypervisor.enable_annotations lists them), and those crun 1.8.1 reads.
var unsafeConfigAnnotations = []string{
	groupAnnotations[0],
	"io.katacontainers.config.hypervisor.",
	"io.kubernetes.cri.container-type",
	"module.wasm.image/variant",
	"run.oci.",
}

// Features returns the OCI runtime features of c8s's containers (a new
// document on each call).
func Features() *features.Features {
	yes, no := true, false
	clone := func(s []string) []string { return append([]string(nil), s...) }
	return &features.Features{
		OCIVersionMin: "1.0.0",
		OCIVersionMax: ociVersionMax,
		// The agent drops every hook (they are host programs), so none is
		// supported; the field's omitempty cannot say "none", so it is
		// left out ("unknown").
		Hooks:        nil,
		MountOptions: clone(guestMountOptions),
		Linux: &features.Linux{
			Namespaces:   clone(guestNamespaces),
			Capabilities: clone(guestCapabilities),
			// The guest mounts only cgroup2 and has no systemd: the agent
			// puts containers in cgroupfs cgroups, whatever cgroupsPath
			// the host asked for. The rdma controller is not enabled.
			Cgroup: &features.Cgroup{V1: &no, V2: &yes, Systemd: &no, SystemdUser: &no, Rdma: &no},
			Seccomp: &features.Seccomp{
				Enabled:        &yes,
				Actions:        clone(guestSeccompActions),
				Operators:      clone(guestSeccompOperators),
				Archs:          clone(guestSeccompArchs),
				KnownFlags:     clone(guestSeccompFlags),
				SupportedFlags: clone(guestSeccompFlags),
			},
			// The agent drops AppArmor profiles and SELinux labels: the
			// guest loads no LSM policy, and host labels mean nothing
			// there.
			Apparmor: &features.Apparmor{Enabled: &no},
			Selinux:  &features.Selinux{Enabled: &no},
			// No resctrl in the VM.
			IntelRdt: &features.IntelRdt{Enabled: &no},
			// crun 1.8.1 makes idmapped mounts (mount_setattr
			// MOUNT_ATTR_IDMAP) where the guest filesystem allows it, and
			// fails the container where it does not.
			MountExtensions: &features.MountExtensions{IDMap: &features.IDMap{Enabled: &yes}},
		},
		// crun's own annotations, as newer crun reports them. Debian's
		// crun is built without CRIU and without Wasm handlers, and the
		// shim does not checkpoint.
		Annotations: map[string]string{
			"io.github.seccomp.libseccomp.version":       guestLibseccompVersion,
			"org.opencontainers.runc.checkpoint.enabled": "false",
			"run.oci.crun.checkpoint.enabled":            "false",
			"run.oci.crun.commit":                        guestCrunCommit,
			"run.oci.crun.version":                       guestCrunVersion,
			"run.oci.crun.wasm":                          "false",
		},
		PotentiallyUnsafeConfigAnnotations: clone(unsafeConfigAnnotations),
	}
}
