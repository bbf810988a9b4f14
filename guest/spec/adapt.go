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
// does not have are refused with a clear message).
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
}

// Plan is an adapted spec and the files it needs.
type Plan struct {
	Spec  *specs.Spec
	Files []GuestFile
	// Origins says where the source of each of Spec.Mounts comes from,
	// for the pod's policy (guest/policy).
	Origins []MountOrigin
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
)

// sandboxShared are the namespaces a pod's containers join from the sandbox
// container when the host spec joins them by path.
var sandboxShared = []specs.LinuxNamespaceType{
	specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.PIDNamespace,
}

// Adapt parses raw (the host's config.json) and adapts it to the guest.
func Adapt(raw []byte, o Options) (*Plan, error) {
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
	s.Linux.Namespaces = adaptNamespaces(s.Linux.Namespaces, o.SandboxPid)
	// The shim gives a container that shares the node's UTS namespace
	// (hostNetwork) the pod's, named as the node, and refuses a hostname
	// without a UTS namespace as runc does (shim/task/criview.go). A spec
	// that still sets one without it gets its own rather than renaming the
	// guest.
	if s.Hostname != "" && !slices.ContainsFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.UTSNamespace }) {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UTSNamespace})
	}
	if err := adaptDeviceAccess(s.Linux, o); err != nil {
		return nil, fmt.Errorf("container %q: %w", o.ContainerID, err)
	}
	if err := checkResourcesCPUSet(s.Linux.Resources, o); err != nil {
		return nil, fmt.Errorf("container %q: %w", o.ContainerID, err)
	}

	mounts, origins, files := adaptMounts(s.Mounts, o, warn)
	s.Mounts = mounts
	return &Plan{Spec: &s, Files: files, Origins: origins}, nil
}

// AdaptProcess parses an exec's process spec and adapts it to the guest.
func AdaptProcess(raw []byte, terminal bool) (*specs.Process, error) {
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
	return &p, nil
}

// CgroupsPath is the guest cgroup of a container.
func cgroupsPath(parent, id string) string {
	if parent == "" {
		parent = "/"
	}
	return filepath.Join("/", parent, id)
}

func adaptNamespaces(in []specs.LinuxNamespace, sandboxPid int) []specs.LinuxNamespace {
	out := make([]specs.LinuxNamespace, 0, len(in))
	for _, ns := range in {
		if ns.Path != "" {
			ns.Path = ""
			if sandboxPid > 0 && slices.Contains(sandboxShared, ns.Type) {
				ns.Path = "/proc/" + strconv.Itoa(sandboxPid) + "/ns/" + nsFile(ns.Type)
			}
		}
		out = append(out, ns)
	}
	return out
}

// nsFile is the /proc/<pid>/ns entry of a namespace type.
func nsFile(t specs.LinuxNamespaceType) string {
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

func adaptMounts(in []specs.Mount, o Options, warn func(string)) ([]specs.Mount, []MountOrigin, []GuestFile) {
	byPath := map[string]File{}
	for _, f := range o.Files {
		byPath[f.Source] = f
	}
	var (
		out     []specs.Mount
		origins []MountOrigin
		files   []GuestFile
		made    = map[string]string{}
	)
	for _, m := range in {
		if !isBind(m) {
			out, origins = append(out, m), append(origins, OriginFS)
			continue
		}
		if f, ok := byPath[m.Source]; ok {
			guest, done := made[m.Source]
			if !done {
				guest = filepath.Join(o.FilesDir, fmt.Sprintf("%d-%s", len(files), safeName(m.Source)))
				made[m.Source] = guest
				files = append(files, GuestFile{Path: guest, Content: f.Content, Mode: f.Mode})
			}
			m.Source = guest
			out, origins = append(out, m), append(origins, OriginHostFile)
			continue
		}
		if guest, ok := o.Shared[m.Source]; ok {
			m.Source = guest
			out, origins = append(out, m), append(origins, OriginShared)
			continue
		}
		if !o.Exists(m.Source) {
			warn(fmt.Sprintf("dropping bind mount of %s on %s: the source does not exist in the guest", m.Source, m.Destination))
			continue
		}
		out, origins = append(out, m), append(origins, OriginGuest)
	}
	return out, origins, files
}

// safeName turns a host path into one file name component.
func safeName(p string) string {
	name := strings.Trim(strings.ReplaceAll(filepath.Clean(p), "/", "_"), "_.")
	if name == "" {
		return "file"
	}
	return name
}
