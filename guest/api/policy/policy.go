// Package policy is the schema of a pod's measured agent policy: the
// [policy] section of its init data (guest/api/initdata), whose digest is
// the VM's HOST_DATA or MRCONFIGID. The guest's agent evaluates every
// request of the untrusted host against it (guest/policy); `c8s-measure
// policy` writes it from a pod's YAML (measurements/policygen). Both sides read this package,
// so that they agree on what a document means.
//
// Init data without a [policy] section keeps the agent's earlier
// behaviour (agent_policy.allow_exec and allow_devices only). A [policy]
// section is default-deny for everything it governs: a container that no
// rule names is refused, and so is any mount, capability, namespace,
// sysctl, exec, signal, log read or stdin write that its rule does not
// allow.
//
//	[policy]
//	audit = false              # true: log each denial, enforce nothing (bring-up)
//	stats = true               # cgroup metrics to the host (default true)
//	update_resources = true    # cgroup limit changes from the host (default true)
//
//	[policy.sandbox]           # the pod's sandbox (pause) container
//	image = "registry.k8s.io/pause:3.10"
//	args = ["/pause"]
//	env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
//	working_dir = "/"
//	uid = 65535                # the pause image's user
//	gid = 65535
//
//	[policy.containers.app]    # by CRI container name
//	image = "ghcr.io/example/app@sha256:0f6e…"
//	args = ["/app", "--listen=:8080"]
//	env = [
//	  "PATH=/usr/local/bin:/usr/bin:/bin",
//	  "re:HOSTNAME=app-[a-z0-9]+-[a-z0-9]{5}",
//	  "re:[A-Z0-9_]+_(SERVICE|PORT)[A-Z0-9_]*=[a-z0-9.:/]*",
//	]
//	working_dir = "/"
//	uid = 1000
//	gid = 1000
//	no_new_privileges = true
//	read_only_root = true
//	capabilities = ["CAP_NET_BIND_SERVICE"]
//	logs = true
//	exec = [["/app", "healthcheck"]]
//	secrets = [{ resource = "kbs:///default/key/db-password", path = "/etc/app/db-password" }]
//	mounts = [
//	  { destination = "/var/run/secrets/kubernetes.io/serviceaccount", kind = "shared", read_only = true },
//	  { destination = "/cache", kind = "tmpfs" },
//	  { destination = "/scratch", kind = "emptydir", volume = "scratch" },  # the pod's emptyDir "scratch", in guest memory
//	]
//
// Every rule (the sandbox's too) must state image, args, working_dir, uid
// and gid: what the process is, where it starts and who it runs as.
//
// Values marked "pattern" below are exact strings, or, prefixed "re:", RE2
// regular expressions that must match the whole value (Pattern): for
// values Kubernetes fills in, such as HOSTNAME or the service links
// (FOO_SERVICE_HOST=10.96.0.12).
//
// How a container is named: containerd's CRI annotates each spec with
// io.kubernetes.cri.container-type; "sandbox" is matched by
// [policy.sandbox], "container" by [policy.containers.NAME] for its
// io.kubernetes.cri.container-name. A container without these annotations
// (ctr, containerd's Go client) is matched by its container id.
package policy

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Policy is the [policy] section.
type Policy struct {
	// Audit makes the agent log each denial and allow the request. It is
	// part of the measured document, so the owner's broker sees it.
	Audit bool `toml:"audit"`
	// Stats lets the host read containers' cgroup metrics and list their
	// processes (ListPids: VM-wide pids, whose turnover shows when
	// processes and threads start). Absent: true
	// (they tell the host what it sees of the VM from outside, and the
	// kubelet needs them).
	Stats *bool `toml:"stats"`
	// UpdateResources lets the host change containers' cgroup limits (CPU,
	// memory, pids; nothing else is ever accepted). Absent: true (the
	// host can starve the VM anyway).
	UpdateResources *bool `toml:"update_resources"`
	// Sandbox is the rule of the pod's sandbox (pause) container.
	Sandbox *Container `toml:"sandbox"`
	// Containers are the rules of the pod's other containers, by CRI
	// container name.
	Containers map[string]*Container `toml:"containers"`
	// Network bounds the pod network the host wires the VM to
	// (CreateContainerRequest.network) and the DNS servers it gives the
	// containers (network.go). Absent: DefaultNetwork.
	Network *Network `toml:"network"`

	// The fields below are for built-in policies (ZeroLaunchDefault),
	// which the agent enforces when no document says otherwise; an init
	// data document cannot set them.

	// Default, when set, is the rule of every container that neither
	// Sandbox nor Containers names (the sandbox included).
	Default *Container `toml:"-"`
	// Builtin names a built-in policy: the keys of its rules start with
	// it ("zero-launch-default.exec") instead of "policy.", since no
	// document holds them.
	Builtin string `toml:"-"`
	// Explain, when set, ends every denial under the policy: why it is in
	// force and how to have another.
	Explain string `toml:"-"`
}

// StatsAllowed reports whether the host may read cgroup metrics.
func (p *Policy) StatsAllowed() bool { return p.Stats == nil || *p.Stats }

// UpdateAllowed reports whether the host may change cgroup limits.
func (p *Policy) UpdateAllowed() bool { return p.UpdateResources == nil || *p.UpdateResources }

// Container is the rule of one container: what its spec, after the guest
// adapted it, may hold, and what the host may do with it afterwards.
type Container struct {
	// Image (pattern, required) is the image reference containerd
	// annotates the spec with (io.kubernetes.cri.image-name, or
	// io.kubernetes.cri.podsandbox.image-name for the sandbox): the image
	// as the pod names it.
	Image Pattern `toml:"image"`
	// Args (patterns, required) is process.args, element by element.
	Args []Pattern `toml:"args"`
	// AnyArgs lets process.args be anything; Args is then not used.
	// Built-in policies only (a document pins its args).
	AnyArgs bool `toml:"-"`
	// Env (patterns) are the environment entries "NAME=VALUE" the process
	// may have. Each entry of the spec must match one; each exact entry
	// here must be in the spec (the host can neither add nor drop one).
	// Absent: none.
	Env []Pattern `toml:"env"`
	// WorkingDir (pattern, required) is process.cwd: the directory the
	// process starts in, and so where a relative path in its args is
	// resolved (python app.py): left to the host, it could be a share
	// the host writes.
	WorkingDir *Pattern `toml:"working_dir"`
	// UID and GID (required) pin process.user.uid and gid: 0 for root.
	UID *uint32 `toml:"uid"`
	GID *uint32 `toml:"gid"`
	// AnyUser lets process.user.uid and gid be anything; UID and GID are
	// then not used. Built-in policies only (a document pins the user).
	AnyUser bool `toml:"-"`
	// AdditionalGIDs pins process.user.additionalGids. Absent: not
	// pinned for the container; an exec's are the container's.
	AdditionalGIDs *[]uint32 `toml:"additional_gids"`
	// Capabilities bounds the process's bounding, effective and
	// permitted capability sets: each must be a subset. The inheritable
	// and ambient sets must be empty whatever the rule.
	// Names as in OCI specs ("CAP_NET_BIND_SERVICE"). Absent: containerd's
	// default set (DefaultCapabilities).
	Capabilities *[]string `toml:"capabilities"`
	// Privileged allows what a privileged container has: every
	// capability, no masked or read-only paths, read-write sysfs and
	// cgroupfs. Devices stay under agent_policy.allow_devices.
	Privileged bool `toml:"privileged"`
	// NoNewPrivileges, if true, requires process.noNewPrivileges.
	NoNewPrivileges bool `toml:"no_new_privileges"`
	// ReadOnlyRoot, if true, requires root.readonly.
	ReadOnlyRoot bool `toml:"read_only_root"`
	// VMNamespaces names the namespaces (pid, network, ipc, uts, mount)
	// the container may share with the VM, that is, leave out of its spec
	// (hostPID, hostNetwork, hostIPC). Absent: none; each must be the
	// container's own or the pod sandbox's. The cgroup and user
	// namespaces are not governed: containerd gives the sandbox no cgroup
	// namespace, nor any container on a cgroup v1 node, and the cgroup
	// filesystem is read-only unless the container is privileged.
	VMNamespaces []string `toml:"vm_namespaces"`
	// SharePIDNamespace lets the container join the pod sandbox's PID
	// namespace (the pod's shareProcessNamespace). Without it the
	// container's PID namespace must be its own: in the sandbox's it would
	// see the pod's other processes, and their environment and root
	// through /proc, as far as their users allow.
	SharePIDNamespace bool `toml:"share_pid_namespace"`
	// MaskedPaths and ReadonlyPaths are paths linux.maskedPaths and
	// linux.readonlyPaths must include. Absent: DefaultMaskedPaths and
	// DefaultReadonlyPaths; ignored when Privileged.
	MaskedPaths   *[]string `toml:"masked_paths"`
	ReadonlyPaths *[]string `toml:"readonly_paths"`
	// Mounts are the mounts the container may have beyond the standard
	// ones (StandardMounts). Absent: none.
	Mounts []Mount `toml:"mounts"`
	// Sysctls (patterns) are the linux.sysctl entries "KEY=VALUE" it may
	// set. Absent: none.
	Sysctls []Pattern `toml:"sysctls"`
	// Exec lists the argv (patterns, element by element) the host may
	// exec in the container. Absent: no exec. An exec runs in the
	// container's working directory, as its user and group (those it was
	// created with; the guest fills them in when the host leaves them
	// out), unless ExecWorkingDir, ExecUID or ExecGID say otherwise; its
	// capabilities within the container's, no_new_privileges if the
	// container's had it, the container's supplementary groups unless
	// additional_gids pins them; the rest of its process (env with the
	// required entries, limits) is held to the container's rule.
	Exec [][]Pattern `toml:"exec"`
	// ExecWorkingDir (pattern) is the process.cwd an exec may have.
	// Absent: the container's own.
	ExecWorkingDir *Pattern `toml:"exec_working_dir"`
	// ExecUID and ExecGID are the user and group an exec may run as.
	// Absent: the container's own.
	ExecUID *uint32 `toml:"exec_uid"`
	ExecGID *uint32 `toml:"exec_gid"`
	// ExecStdin lets an exec have stdin or a terminal (kubectl exec -i,
	// -t): with a shell on the list that is any command.
	ExecStdin bool `toml:"exec_stdin"`
	// Logs lets the host read the container's stdout and stderr. Without
	// it the guest discards them.
	Logs bool `toml:"logs"`
	// Stdin lets the host write to the container's stdin.
	Stdin bool `toml:"stdin"`
	// TTY lets the container's stdio be a terminal (the pod spec's tty).
	// Without it a create that asks for one is refused: on a terminal,
	// what the host writes to stdin is a line discipline's input, where
	// ^C, ^\ and ^Z are signals that signals does not list.
	TTY bool `toml:"tty"`
	// Signals the host may send the container's processes, by name
	// ("SIGTERM") or number. Absent: DefaultSignals.
	Signals *[]string `toml:"signals"`
	// Secrets are the pod's broker secrets ([kbs] secrets) mounted into
	// the container. Absent: none.
	Secrets []Secret `toml:"secrets"`
	// Umask, Rlimits and UserNamespace govern more of the process
	// (process.go): absent, the umask is at least 022, only the
	// DefaultRlimits, and no user namespace.
	Umask         *uint32  `toml:"umask"`
	Rlimits       []Rlimit `toml:"rlimits"`
	UserNamespace bool     `toml:"user_namespace"`
	// Layers pins the image's file system: its layers, bottom first, each
	// by diff ID and dm-verity root (Layer). The guest then builds the
	// container's root only from these layers, each opened through
	// dm-verity with the root written here, and refuses a host-built root
	// disk. Absent: the root is not pinned (what the host attaches).
	Layers []Layer `toml:"layers"`
	// Pull (exact) is the image the guest pulls itself when the host
	// offers no layer disks: REGISTRY/REPOSITORY@sha256:<digest>, never
	// a tag. PullAuth is the key broker resource (kbs:///REPO/TYPE/TAG)
	// with the registry's credentials; PullPlainHTTP talks plain HTTP to
	// the registry (never with PullAuth). PullCA (exact) is the PEM CA
	// certificates the registry's TLS certificate must chain to, the only
	// roots then trusted (absent: the guest image's public bundle). See
	// pull.go. Absent: the guest pulls nothing.
	Pull          string `toml:"pull"`
	PullAuth      string `toml:"pull_auth"`
	PullPlainHTTP bool   `toml:"pull_plain_http"`
	PullCA        string `toml:"pull_ca"`
}

// Mount allows one mount of a container.
type Mount struct {
	// Destination (pattern) is the path in the container.
	Destination Pattern `toml:"destination"`
	// Kind is where the source comes from (Kinds).
	Kind MountKind `toml:"kind"`
	// Source is the guest path of a "guest" bind (exact); other kinds have
	// none.
	Source string `toml:"source"`
	// ReadOnly, if true, requires the mount to be read-only.
	ReadOnly bool `toml:"read_only"`
	// Volume (pattern) names the pod's emptyDir volume an "emptydir"
	// mount is, as the pod spec names it: the host can then neither give
	// the container another container's volume nor share a volume the
	// pod spec does not share. Absent: any of the pod's emptyDirs. Only
	// for kind "emptydir".
	Volume Pattern `toml:"volume"`
}

// Secret mounts one [kbs] secret into a container.
type Secret struct {
	// Resource names the secret as a [[kbs.secrets]] entry does.
	Resource string `toml:"resource"`
	// Path is where the container sees it. Absent: the entry's path.
	Path string `toml:"path"`
}

// MountKind says what a mount's source is, as the guest sees it once it
// has adapted the host's spec (guest/spec).
type MountKind string

// Mount kinds.
const (
	// KindFile is a bind of a small host file the host passes by value
	// (/etc/hosts, /etc/resolv.conf, /etc/hostname,
	// /dev/termination-log): host content, copied into the guest.
	KindFile MountKind = "file"
	// KindShared is a bind of a host path shared over virtio-fs
	// (configMap, secret, emptyDir, projected volumes, when the node
	// shares them): host content, read and written by the host live.
	KindShared MountKind = "shared"
	// KindGuest is a bind of a path of the guest's own filesystem. Only
	// the source a rule names passes: never /run/c8s (the pod's secrets,
	// the other containers' roots), /, /dev, unless named.
	KindGuest MountKind = "guest"
	// KindEmptyDir is a kubelet emptyDir volume
	// (<kubelet root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>)
	// held in guest memory: in a guest started as a TEE (c8s.tee = sim,
	// snp or tdx) each emptyDir of the pod is a directory of a guest tmpfs,
	// shared by the pod's containers that mount it and gone with the pod
	// VM, never a host path or a virtio-fs share. A guest started without
	// a TEE gives an emptyDir as the host shares it (shared), or drops it.
	KindEmptyDir MountKind = "emptydir"
	// KindPodShm is the pod's /dev/shm held in guest memory: in a guest
	// started as a TEE, containerd's shm directory of the pod's sandbox
	// (<its state dir>/sandboxes/<id>/shm, a tmpfs of the host's) is
	// replaced by one directory of the guest's emptyDir tmpfs, shared by
	// the pod's containers, so that their POSIX shared memory and
	// semaphores never reach the host. A guest started without a TEE
	// gives it as the host shares it (shared).
	KindPodShm MountKind = "podshm"
	// Filesystems the container's runtime creates.
	KindProc   MountKind = "proc"
	KindSysfs  MountKind = "sysfs"
	KindTmpfs  MountKind = "tmpfs"
	KindDevpts MountKind = "devpts"
	KindMqueue MountKind = "mqueue"
	KindCgroup MountKind = "cgroup"
)

// Kinds are the mount kinds a rule may name.
var Kinds = []MountKind{KindFile, KindShared, KindGuest, KindEmptyDir, KindPodShm, KindProc, KindSysfs, KindTmpfs, KindDevpts, KindMqueue, KindCgroup}

// FSKind is the kind of a mount of filesystem type fstype that is not a
// bind, or "" for a type no rule may allow (a disk's filesystem, virtiofs,
// overlay, 9p, ...: the pod VM's disks and the host's shares are given
// only the guest's way).
func FSKind(fstype string) MountKind {
	switch fstype {
	case "proc", "sysfs", "tmpfs", "devpts", "mqueue":
		return MountKind(fstype)
	case "cgroup", "cgroup2":
		return KindCgroup
	}
	return ""
}

// StandardMount is a mount every container may have.
type StandardMount struct {
	Destination string
	Kind        MountKind
	// ReadOnly: required unless the rule allows a privileged container.
	ReadOnly bool
}

// StandardMounts are allowed without a rule: the filesystems containerd
// gives every container, the pod's /dev/shm in guest memory (CRI's), and
// the host files CRI binds in. Those files come from the host, which
// controls the pod's network and names anyway.
var StandardMounts = []StandardMount{
	{"/proc", KindProc, false},
	{"/dev", KindTmpfs, false},
	{"/dev/pts", KindDevpts, false},
	{"/dev/shm", KindTmpfs, false},
	{"/dev/shm", KindPodShm, false},
	{"/dev/mqueue", KindMqueue, false},
	{"/sys", KindSysfs, true},
	{"/sys/fs/cgroup", KindCgroup, true},
	{"/etc/hosts", KindFile, false},
	{"/etc/hostname", KindFile, false},
	{"/etc/resolv.conf", KindFile, false},
	{"/dev/termination-log", KindFile, false},
}

// DefaultCapabilities are containerd's default capabilities, which a
// container may have when its rule lists none.
var DefaultCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

// AllCapabilities are Linux's capabilities (6.x), as a privileged
// container has them.
var AllCapabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND",
	"CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// DefaultMaskedPaths and DefaultReadonlyPaths are the paths runc,
// containerd and the kubelet mask or make read-only in every container
// that is not privileged. Unmasked, /proc/sys would let a root process of
// the container set the VM's core_pattern or modprobe path and run code
// as the guest's root, outside every container.
var (
	DefaultMaskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
		"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
	}
	DefaultReadonlyPaths = []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}
)

// RuntimeMaskedPath reports whether the kubelet or containerd masks path
// p in a container by default, on some node: the defaults above, the
// kubelet's /proc/interrupts and each of the node's
// /sys/devices/system/cpu/cpuN/thermal_throttle, containerd's
// /sys/devices/virtual/powercap. A spec may mask these beyond what a rule
// requires; any other path it masks hides a file of the container.
func RuntimeMaskedPath(p string) bool {
	if slices.Contains(DefaultMaskedPaths, p) || p == "/proc/interrupts" || p == "/sys/devices/virtual/powercap" {
		return true
	}
	n, ok := strings.CutPrefix(p, "/sys/devices/system/cpu/cpu")
	n, ok2 := strings.CutSuffix(n, "/thermal_throttle")
	if !ok || !ok2 || n == "" {
		return false
	}
	for _, c := range n {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// DefaultSignals are the signals the host may send when a rule lists
// none: those that stop a container (SIGTERM, SIGKILL, and SIGINT, a
// STOPSIGNAL images commonly declare). Not SIGQUIT: its default action
// dumps core (the guest writes no core files: guest/spec, guest/initsys),
// and a rule that needs it (an image whose STOPSIGNAL it is) lists it.
var DefaultSignals = []string{"SIGTERM", "SIGKILL", "SIGINT"}

// Namespaces are the namespace types VMNamespaces may name (OCI names):
// those a container may share with the VM only where its rule says so.
var Namespaces = []string{"pid", "network", "ipc", "uts", "mount"}

// AllowedCapabilities returns the capabilities the rule allows.
func (c *Container) AllowedCapabilities() []string {
	switch {
	case c.Privileged:
		return AllCapabilities
	case c.Capabilities == nil:
		return DefaultCapabilities
	}
	return *c.Capabilities
}

// RequiredMaskedPaths returns the paths that must be masked.
func (c *Container) RequiredMaskedPaths() []string {
	switch {
	case c.Privileged:
		return nil
	case c.MaskedPaths == nil:
		return DefaultMaskedPaths
	}
	return *c.MaskedPaths
}

// RequiredReadonlyPaths returns the paths that must be read-only.
func (c *Container) RequiredReadonlyPaths() []string {
	switch {
	case c.Privileged:
		return nil
	case c.ReadonlyPaths == nil:
		return DefaultReadonlyPaths
	}
	return *c.ReadonlyPaths
}

// AllowedSignals returns the signal numbers the host may send.
func (c *Container) AllowedSignals() []int {
	names := DefaultSignals
	if c.Signals != nil {
		names = *c.Signals
	}
	out := make([]int, 0, len(names))
	for _, n := range names {
		if sig, err := ParseSignal(n); err == nil {
			out = append(out, sig)
		}
	}
	return out
}

// ParseSignal reads a signal name ("SIGTERM", "TERM") or number.
func ParseSignal(s string) (int, error) {
	var n int
	if _, err := fmt.Sscanf(s, "%d", &n); err == nil && fmt.Sprint(n) == s {
		if n < 1 || n > 64 {
			return 0, fmt.Errorf("signal %s is not a signal number (1 to 64)", s)
		}
		return n, nil
	}
	name := strings.ToUpper(s)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	if sig := unix.SignalNum(name); sig != 0 {
		return int(sig), nil
	}
	return 0, fmt.Errorf("signal %q is not a signal name (SIGTERM, SIGHUP, ...) or number", s)
}

// Validate checks the section; secrets names the resources of the init
// data's [kbs] secrets, which containers' secrets must refer to. Errors
// name the key, from policy.
func (p *Policy) Validate(secrets []string) error {
	var errs []error
	if p.Sandbox != nil {
		errs = append(errs, p.Sandbox.validate("policy.sandbox", secrets))
	}
	names := make([]string, 0, len(p.Containers))
	for name := range p.Containers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c := p.Containers[name]
		key := "policy.containers." + quoteKey(name)
		if c == nil {
			errs = append(errs, fmt.Errorf("%s: empty rule", key))
			continue
		}
		errs = append(errs, c.validate(key, secrets))
	}
	if p.Network != nil {
		errs = append(errs, p.Network.validate("policy.network"))
	}
	return errors.Join(errs...)
}

// quoteKey writes a TOML key as a document would.
func quoteKey(k string) string {
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Sprintf("%q", k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}

func (c *Container) validate(key string, secrets []string) error {
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", key, field, fmt.Sprintf(format, a...)))
	}
	if c.Image == "" {
		bad("image", `required: the image the container runs (write "re:.*" to allow any image)`)
	} else if err := c.Image.Validate(); err != nil {
		bad("image", "%v", err)
	}
	if len(c.Args) == 0 {
		bad("args", "required: the container's process.args")
	}
	errs = append(errs, validateLayers(key, c.Layers), validateProcess(key, c), validatePull(key, c))
	checkPatterns := func(field string, ps []Pattern) {
		for i, p := range ps {
			if err := p.Validate(); err != nil {
				bad(fmt.Sprintf("%s[%d]", field, i), "%v", err)
			}
		}
	}
	checkPatterns("args", c.Args)
	checkPatterns("env", c.Env)
	checkPatterns("sysctls", c.Sysctls)
	switch {
	case c.WorkingDir == nil || *c.WorkingDir == "":
		bad("working_dir", `required: the container's process.cwd (the image's WorkingDir, or "/"), so that the host cannot start it where a relative path in its args finds files of the host's`)
	default:
		if err := c.WorkingDir.Validate(); err != nil {
			bad("working_dir", "%v", err)
		}
	}
	if c.UID == nil {
		bad("uid", "required: the user the container runs as (process.user.uid; 0 for root)")
	}
	if c.GID == nil {
		bad("gid", "required: the group the container runs as (process.user.gid; 0 for root)")
	}
	if c.ExecWorkingDir != nil {
		if err := c.ExecWorkingDir.Validate(); err != nil {
			bad("exec_working_dir", "%v", err)
		}
	}
	for i, argv := range c.Exec {
		if len(argv) == 0 {
			bad(fmt.Sprintf("exec[%d]", i), "an empty argv")
		}
		checkPatterns(fmt.Sprintf("exec[%d]", i), argv)
	}
	if c.Capabilities != nil {
		for _, capName := range *c.Capabilities {
			if !slices.Contains(AllCapabilities, capName) {
				bad("capabilities", "%q is not a capability (write CAP_NET_BIND_SERVICE, ...)", capName)
			}
		}
	}
	for _, ns := range c.VMNamespaces {
		if !slices.Contains(Namespaces, ns) {
			bad("vm_namespaces", "%q is not one of %s", ns, strings.Join(Namespaces, ", "))
		}
	}
	for field, paths := range map[string]*[]string{"masked_paths": c.MaskedPaths, "readonly_paths": c.ReadonlyPaths} {
		if paths == nil {
			continue
		}
		for _, p := range *paths {
			if !path.IsAbs(p) || path.Clean(p) != p {
				bad(field, "%q is not a clean absolute path", p)
			}
		}
	}
	if c.Signals != nil {
		for _, s := range *c.Signals {
			if _, err := ParseSignal(s); err != nil {
				bad("signals", "%v", err)
			}
		}
	}
	for i, m := range c.Mounts {
		if err := m.validate(); err != nil {
			bad(fmt.Sprintf("mounts[%d]", i), "%v", err)
		}
	}
	for i, s := range c.Secrets {
		if !slices.Contains(secrets, s.Resource) {
			bad(fmt.Sprintf("secrets[%d].resource", i), "%q is not a [[kbs.secrets]] resource of this init data (%s)", s.Resource, strings.Join(secrets, ", "))
		}
		if s.Path != "" && (!path.IsAbs(s.Path) || path.Clean(s.Path) != s.Path || s.Path == "/") {
			bad(fmt.Sprintf("secrets[%d].path", i), "%q must be a clean absolute file path", s.Path)
		}
	}
	return errors.Join(errs...)
}

func (m Mount) validate() error {
	if m.Destination == "" {
		return errors.New("destination is required")
	}
	if err := m.Destination.Validate(); err != nil {
		return fmt.Errorf("destination: %w", err)
	}
	if !slices.Contains(Kinds, m.Kind) {
		kinds := make([]string, len(Kinds))
		for i, k := range Kinds {
			kinds[i] = string(k)
		}
		return fmt.Errorf("kind %q is not one of %s", m.Kind, strings.Join(kinds, ", "))
	}
	if m.Kind == KindGuest {
		if !path.IsAbs(m.Source) || path.Clean(m.Source) != m.Source {
			return fmt.Errorf("source %q: a guest bind needs the clean absolute guest path it binds", m.Source)
		}
	} else if m.Source != "" {
		return fmt.Errorf("source: only a guest bind names its source (the host chooses the others' host paths)")
	}
	return m.validateVolume()
}
