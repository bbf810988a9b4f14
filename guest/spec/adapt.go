// Package spec adapts the OCI runtime spec that containerd wrote on the host
// to the guest VM: the rootfs and cgroup live at guest paths, host namespaces
// and host files do not exist, and hooks and LSM labels are host business.
//
// What the host asks of the guest is checked, since in an snp or tdx pod
// the host is the adversary: devices (devices.go: the guest's own devices,
// TEE, disks, memory, channels to the host, are never given; a pod with
// measured init data gets only the standard ones and those its
// agent_policy.allow_devices lists; without init data any other device is
// created as asked) and cpusets (cpuset.go: CPUs or memory nodes the pod VM
// does not have are refused with a clear message). What only ever serves
// an attack from the host is forced or refused in every spec (harden.go:
// core dumps, annotations the runtime acts on, seccomp notify and no-op
// syscalls, rootfs propagation, host files' modes).
package spec

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// File is the content of a host file that a bind mount uses as its source.
type File struct {
	Source  string
	Content []byte
	Mode    uint32
}

// GuestFile is a file the caller must write before creating the container.
type GuestFile struct {
	Path    string
	Content []byte
	Mode    uint32
}

// Options say how to adapt a spec.
type Options struct {
	// ContainerID names the container.
	ContainerID string
	// Rootfs is the guest path of the mounted root filesystem.
	Rootfs string
	// CgroupsParent is the guest cgroup under which the container's cgroup
	// is created, for example "/c8s".
	CgroupsParent string
	// FilesDir is where guest copies of host files are written.
	FilesDir string
	// Files are host files passed by value, keyed by their host path.
	Files []File
	// SandboxPid, when not zero, is the guest pid of the pod's sandbox
	// container; namespaces the host spec joins by path are joined from it.
	SandboxPid int
	// SandboxNS, when set, are the paths of the sandbox's
	// namespaces (files the agent holds open), joined in place of
	// SandboxPid's /proc/<pid>/ns entries.
	SandboxNS map[specs.LinuxNamespaceType]string
	// Terminal says whether the process gets a terminal.
	Terminal bool
	// Exists reports whether a path exists in the guest.
	Exists func(path string) bool
	// Warn receives a message for each part of the spec that was dropped.
	Warn func(msg string)
	// OCIVersion, when set, replaces the spec's ociVersion: the guest's OCI
	// runtime may accept only an older version string than the host wrote.
	OCIVersion string
	// Shared maps host paths of bind mounts shared over virtio-fs to their
	// guest paths.
	Shared map[string]string
	// Devices is the device policy of the pod's measured init data (the
	// zero value: no init data).
	Devices DevicePolicy
	// DriverMajors are the guest's character majors by driver name (its
	// /proc/devices, DriverMajors), to find the guest's own devices whose
	// majors are dynamic.
	DriverMajors map[string]int64
	// OnlineCPUs and OnlineMems are the guest's online CPUs and memory
	// nodes (ReadOnline); a cpuset outside them is refused. Empty: not
	// checked.
	OnlineCPUs, OnlineMems string
	// EmptyDirs, when set, is the guest directory (a tmpfs) that holds the
	// pod's emptyDir volumes: a bind of a kubelet emptyDir
	// (EmptyDirVolume) becomes a bind of EmptyDirs/<pod uid>/<name>, and
	// a bind of the sandbox's shm directory (SandboxShm) one of
	// EmptyDirs/PodShm, whatever the host shares or passes for them.
	// Empty: both are host paths like any other.
	EmptyDirs string
}

// Plan is an adapted spec and the files it needs.
type Plan struct {
	Spec  *specs.Spec
	Files []GuestFile
	// Origins says where the source of each of Spec.Mounts comes from,
	// for the pod's policy (guest/policy).
	Origins []MountOrigin
	// EmptyDirs are the guest directories of the emptyDir volumes the
	// spec binds (Options.EmptyDirs), which the caller must create.
	EmptyDirs []string
}

// MountOrigin is where an adapted mount's source comes from.
type MountOrigin int

const (
	// OriginFS: not a bind mount; a filesystem of the type the spec
	// names (proc, tmpfs, ...), created by the runtime.
	OriginFS MountOrigin = iota
	// OriginHostFile: a bind of the guest copy of a host file passed by
	// value (Options.Files).
	OriginHostFile
	// OriginShared: a bind of a host path shared over virtio-fs
	// (Options.Shared).
	OriginShared
	// OriginGuest: a bind of a path of the guest's own filesystem, as the
	// host's spec names it.
	OriginGuest
	// OriginEmptyDir: a bind of a kubelet emptyDir volume, replaced by
	// its directory in guest memory (Options.EmptyDirs).
	OriginEmptyDir
	// OriginPodShm: a bind of containerd's shm directory of the pod's
	// sandbox (SandboxShm), replaced by the pod's /dev/shm in guest
	// memory (PodShm below Options.EmptyDirs).
	OriginPodShm
)

// sandboxShared are the namespaces a pod's containers join from the sandbox
// container when the host spec joins them by path.
var sandboxShared = []specs.LinuxNamespaceType{
	specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.PIDNamespace,
}

// Adapt parses raw (the host's config.json) and adapts it to the guest.
func Adapt(raw []byte, o Options) (*Plan, error) {
	if hasNUL(raw) {
		return nil, &ForbiddenError{fmt.Sprintf("the OCI spec of container %q has a NUL character in a string: crun reads a string only up to it, so it would act on another value than the one checked", o.ContainerID)}
	}
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, fmt.Errorf("parse the OCI spec of container %q: %w", o.ContainerID, err)
	}
	if s.Process == nil {
		return nil, fmt.Errorf("the OCI spec of container %q has no process", o.ContainerID)
	}
	if o.Exists == nil {
		return nil, fmt.Errorf("spec.Adapt: Options.Exists is required")
	}
	warn := o.Warn
	if warn == nil {
		warn = func(string) {}
	}

	readonly := s.Root != nil && s.Root.Readonly
	s.Root = &specs.Root{Path: o.Rootfs, Readonly: readonly}
	s.Hooks = nil
	s.Annotations = criAnnotations(s.Annotations, warn)
	s.Process.Rlimits = forceNoCore(s.Process.Rlimits, warn)
	if o.OCIVersion != "" {
		s.Version = o.OCIVersion
	}
	s.Process.Terminal = o.Terminal
	s.Process.ApparmorProfile = ""
	s.Process.SelinuxLabel = ""
	if s.Linux == nil {
		s.Linux = &specs.Linux{}
	}
	s.Linux.MountLabel = ""
	s.Linux.CgroupsPath = cgroupsPath(o.CgroupsParent, o.ContainerID)
	if err := uniqueNamespaces(s.Linux.Namespaces); err != nil {
		return nil, fmt.Errorf("container %q: %w", o.ContainerID, err)
	}
	s.Linux.Namespaces = adaptNamespaces(s.Linux.Namespaces, o.SandboxPid, o.SandboxNS)
	// The shim gives a container that shares the node's UTS namespace
	// (hostNetwork) the pod's, named as the node, and refuses a hostname
	// without a UTS namespace as runc does (shim/task/criview.go). A spec
	// that still sets one without it gets its own rather than renaming the
	// guest.
	if s.Hostname != "" && !slices.ContainsFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.UTSNamespace }) {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UTSNamespace})
	}
	adaptPropagation(s.Linux, warn)
	if err := adaptSeccomp(s.Linux.Seccomp, warn); err != nil {
		return nil, fmt.Errorf("container %q: %w", o.ContainerID, err)
	}
	if err := adaptDeviceAccess(s.Linux, o); err != nil {
		return nil, fmt.Errorf("container %q: %w", o.ContainerID, err)
	}
	if err := checkResourcesCPUSet(s.Linux.Resources, o); err != nil {
		return nil, fmt.Errorf("container %q: %w", o.ContainerID, err)
	}

	mounts, origins, files, emptyDirs := adaptMounts(s.Mounts, o, warn)
	s.Mounts = mounts
	return &Plan{Spec: &s, Files: files, Origins: origins, EmptyDirs: emptyDirs}, nil
}

// AdaptProcess parses an exec's process spec and adapts it to the guest.
func AdaptProcess(raw []byte, terminal bool) (*specs.Process, error) {
	if hasNUL(raw) {
		return nil, &ForbiddenError{"the OCI process spec has a NUL character in a string: crun reads a string only up to it, so it would act on another value than the one checked"}
	}
	var p specs.Process
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("parse the OCI process spec: %w", err)
	}
	if len(p.Args) == 0 && p.CommandLine == "" {
		return nil, fmt.Errorf("the OCI process spec has no args")
	}
	p.Terminal = terminal
	p.ApparmorProfile = ""
	p.SelinuxLabel = ""
	p.Rlimits = forceNoCore(p.Rlimits, nil)
	return &p, nil
}

// hasNUL reports whether a string of the JSON document raw holds a NUL
// character (the escape \u0000: JSON has no other way to write one).
func hasNUL(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i+5 < len(raw) && raw[i+1] == 'u' && string(raw[i+2:i+6]) == "0000" {
			return true
		}
		i++ // the escaped character: "\\" is one backslash
	}
	return false
}

// CgroupsPath is the guest cgroup of a container.
func cgroupsPath(parent, id string) string {
	if parent == "" {
		parent = "/"
	}
	return filepath.Join("/", parent, id)
}

// uniqueNamespaces refuses a namespace type named twice. The policy judges
// the first entry of a type, and crun may act on another: with a user
// namespace, a pid entry with a path is joined at once and a fresh one
// dropped, so {pid}, {pid, the sandbox's} put the container in the
// sandbox's PID namespace past share_pid_namespace. runc refuses these
// specs too.
func uniqueNamespaces(nss []specs.LinuxNamespace) error {
	seen := map[specs.LinuxNamespaceType]bool{}
	for _, ns := range nss {
		if seen[ns.Type] {
			return &ForbiddenError{fmt.Sprintf("linux.namespaces names the %s namespace twice: one entry per type", ns.Type)}
		}
		seen[ns.Type] = true
	}
	return nil
}

func adaptNamespaces(in []specs.LinuxNamespace, sandboxPid int, sandboxNS map[specs.LinuxNamespaceType]string) []specs.LinuxNamespace {
	out := make([]specs.LinuxNamespace, 0, len(in))
	for _, ns := range in {
		if ns.Path != "" {
			ns.Path = ""
			switch {
			case !slices.Contains(sandboxShared, ns.Type):
			case sandboxNS != nil:
				ns.Path = sandboxNS[ns.Type]
			case sandboxPid > 0:
				ns.Path = "/proc/" + strconv.Itoa(sandboxPid) + "/ns/" + NSFile(ns.Type)
			}
		}
		out = append(out, ns)
	}
	return out
}

// NSFile is the /proc/<pid>/ns entry of a namespace type.
func NSFile(t specs.LinuxNamespaceType) string {
	switch t {
	case specs.NetworkNamespace:
		return "net"
	case specs.MountNamespace:
		return "mnt"
	default:
		return string(t)
	}
}

func isBind(m specs.Mount) bool {
	if m.Type == "bind" {
		return true
	}
	return slices.ContainsFunc(m.Options, func(o string) bool { return o == "bind" || o == "rbind" })
}

func adaptMounts(in []specs.Mount, o Options, warn func(string)) ([]specs.Mount, []MountOrigin, []GuestFile, []string) {
	byPath := map[string]File{}
	for _, f := range o.Files {
		byPath[f.Source] = f
	}
	var (
		out     []specs.Mount
		origins []MountOrigin
		files   []GuestFile
		made    = map[string]string{}
		dirs    []string
	)
	for _, m := range in {
		if !isBind(m) {
			out, origins = append(out, m), append(origins, OriginFS)
			continue
		}
		// Before the host's copies and shares: an emptyDir in guest
		// memory never takes host content.
		if uid, name, ok := EmptyDirVolume(m.Source); ok && o.EmptyDirs != "" {
			m.Source = filepath.Join(o.EmptyDirs, uid, name)
			if !slices.Contains(dirs, m.Source) {
				dirs = append(dirs, m.Source)
			}
			out, origins = append(out, m), append(origins, OriginEmptyDir)
			continue
		}
		// The pod's POSIX shared memory and semaphores: never on the host.
		if SandboxShm(m.Source) && o.EmptyDirs != "" {
			m.Source = filepath.Join(o.EmptyDirs, PodShm)
			m.Options = hostFileOptions(m.Options) // nosuid, nodev, noexec, as containerd's shm
			if !slices.Contains(dirs, m.Source) {
				dirs = append(dirs, m.Source)
			}
			out, origins = append(out, m), append(origins, OriginPodShm)
			continue
		}
		if f, ok := byPath[m.Source]; ok {
			guest, done := made[m.Source]
			if !done {
				guest = filepath.Join(o.FilesDir, fmt.Sprintf("%d-%s", len(files), safeName(m.Source)))
				made[m.Source] = guest
				files = append(files, GuestFile{Path: guest, Content: f.Content, Mode: f.Mode & hostFilePerm})
			}
			m.Source = guest
			m.Options = hostFileOptions(m.Options)
			out, origins = append(out, m), append(origins, OriginHostFile)
			continue
		}
		if guest, ok := o.Shared[m.Source]; ok {
			m.Source = guest
			m.Options = sharedOptions(m.Options)
			out, origins = append(out, m), append(origins, OriginShared)
			continue
		}
		if !o.Exists(m.Source) {
			warn(fmt.Sprintf("dropping bind mount of %s on %s: the source does not exist in the guest", m.Source, m.Destination))
			continue
		}
		out, origins = append(out, m), append(origins, OriginGuest)
	}
	return out, origins, files, dirs
}

// emptyDirPlugin is the kubelet's directory of emptyDir volumes in a pod's
// volumes directory.
const emptyDirPlugin = "kubernetes.io~empty-dir"

// EmptyDirVolume reports whether host path p is a kubelet emptyDir
// volume, <kubelet root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<name>
// (any kubelet root: --root-dir may move it), and returns the pod's uid
// and the volume's name. A subPath of an emptyDir reaches the runtime as a
// path under the kubelet's volume-subpaths and is not one. The host
// decides what it labels so; a host that labels another path an emptyDir
// only gives its container an empty guest directory instead.
func EmptyDirVolume(p string) (podUID, name string, ok bool) {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return "", "", false
	}
	parts := strings.Split(p, "/")
	n := len(parts)
	if n < 6 || parts[n-5] != "pods" || parts[n-3] != "volumes" || parts[n-2] != emptyDirPlugin {
		return "", "", false
	}
	podUID, name = parts[n-4], parts[n-1]
	for _, c := range []string{podUID, name} {
		if c == "" || c == "." || c == ".." || strings.ContainsRune(c, 0) {
			return "", "", false
		}
	}
	if strings.HasPrefix(podUID, ".") { // PodShm's; no pod uid (a UUID) is
		return "", "", false
	}
	return podUID, name, true
}

// PodShm is the pod's /dev/shm below Options.EmptyDirs: a directory no
// emptyDir can name (EmptyDirVolume refuses a pod uid starting with ".").
const PodShm = ".pod/shm"

// SandboxShm reports whether host path p is the shm directory containerd's
// CRI makes for a pod sandbox (<its state dir>/sandboxes/<id>/shm), which
// it binds on /dev/shm in the pod's containers: a tmpfs of the host's.
func SandboxShm(p string) bool {
	if !filepath.IsAbs(p) || filepath.Clean(p) != p {
		return false
	}
	parts := strings.Split(p, "/")
	n := len(parts)
	if n < 4 || parts[n-1] != "shm" || parts[n-3] != "sandboxes" {
		return false
	}
	id := parts[n-2]
	return id != "" && id != "." && id != ".."
}

// safeName turns a host path into one file name component.
func safeName(p string) string {
	name := strings.Trim(strings.ReplaceAll(filepath.Clean(p), "/", "_"), "_.")
	if name == "" {
		return "file"
	}
	return name
}
