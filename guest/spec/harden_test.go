package spec

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// adaptSpec adapts s as the agent would, collecting the warnings.
func adaptSpec(t *testing.T, s *specs.Spec, o Options) (*Plan, []string, error) {
	t.Helper()
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var warnings []string
	o.ContainerID, o.Rootfs, o.FilesDir = "c1", "/r", "/f"
	o.Exists, o.Warn = guestHas(), func(m string) { warnings = append(warnings, m) }
	plan, err := Adapt(raw, o)
	return plan, warnings, err
}

func minimalSpec() *specs.Spec {
	return &specs.Spec{Version: specs.Version, Process: &specs.Process{Args: []string{"/app"}, Cwd: "/"}, Linux: &specs.Linux{}}
}

// coreLimit returns the RLIMIT_CORE entries of rl.
func coreLimit(rl []specs.POSIXRlimit) []specs.POSIXRlimit {
	var out []specs.POSIXRlimit
	for _, r := range rl {
		if strings.EqualFold(r.Type, "RLIMIT_CORE") {
			out = append(out, r)
		}
	}
	return out
}

// The host asks for unlimited core dumps (then sends SIGQUIT, or makes
// the process crash, with its cwd on a writable disk or share the host
// reads): the container's process and every exec get RLIMIT_CORE 0, soft
// and hard, in place of the host's, however it is spelled; the other
// limits stay.
func TestMaliciousHostCoreDump(t *testing.T) {
	for name, rl := range map[string][]specs.POSIXRlimit{
		"unlimited":  {{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}, {Type: "RLIMIT_CORE", Hard: ^uint64(0), Soft: ^uint64(0)}},
		"lower case": {{Type: "rlimit_core", Hard: ^uint64(0), Soft: ^uint64(0)}, {Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
		"none":       {{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
	} {
		s := minimalSpec()
		s.Process.Rlimits = rl
		plan, warnings, err := adaptSpec(t, s, Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := plan.Spec.Process.Rlimits
		if core := coreLimit(got); len(core) != 1 || core[0] != (specs.POSIXRlimit{Type: "RLIMIT_CORE"}) {
			t.Errorf("%s: container rlimits %+v, want one RLIMIT_CORE 0/0", name, got)
		}
		if !slices.Contains(got, specs.POSIXRlimit{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}) {
			t.Errorf("%s: container rlimits %+v lost RLIMIT_NOFILE", name, got)
		}
		if name != "none" && !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "RLIMIT_CORE") }) {
			t.Errorf("%s: no warning names RLIMIT_CORE: %v", name, warnings)
		}

		raw, _ := json.Marshal(&specs.Process{Args: []string{"sh"}, Cwd: "/data", Rlimits: rl})
		p, err := AdaptProcess(raw, false)
		if err != nil {
			t.Fatal(err)
		}
		if core := coreLimit(p.Rlimits); len(core) != 1 || core[0] != (specs.POSIXRlimit{Type: "RLIMIT_CORE"}) {
			t.Errorf("%s: exec rlimits %+v, want one RLIMIT_CORE 0/0", name, p.Rlimits)
		}
	}
	// An exec without rlimits gets the limit too: crun would give it its
	// own (the agent's), whose hard limit a process may raise its soft
	// one to.
	p, err := AdaptProcess([]byte(`{"args":["sh"],"cwd":"/"}`), false)
	if err != nil || len(coreLimit(p.Rlimits)) != 1 {
		t.Errorf("exec without rlimits: %+v, %v", p, err)
	}
}

// Annotations the guest's runtime acts on (crun's run.oci.*: a socket
// that receives the seccomp notify fd or the init's pidfd, the runtime's
// own groups kept) never reach it; the CRI's, by which the policy names
// containers, do.
func TestMaliciousHostRuntimeAnnotations(t *testing.T) {
	s := minimalSpec()
	s.Annotations = map[string]string{
		"io.kubernetes.cri.container-type":                              "container",
		"io.kubernetes.cri.container-name":                              "app",
		"io.kubernetes.cri.image-name":                                  "example/app:1",
		"run.oci.seccomp.receiver":                                      "/run/host.sock",
		"run.oci.pidfd_receiver":                                        "/run/host.sock",
		"run.oci.keep_original_groups":                                  "1",
		"org.opencontainers.runc.exec.isolated-cpu-affinity-transition": "temporary",
	}
	plan, warnings, err := adaptSpec(t, s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"io.kubernetes.cri.container-type": "container",
		"io.kubernetes.cri.container-name": "app",
		"io.kubernetes.cri.image-name":     "example/app:1",
	}
	if len(plan.Spec.Annotations) != len(want) {
		t.Errorf("annotations %v, want only the CRI ones %v", plan.Spec.Annotations, want)
	}
	for k, v := range want {
		if plan.Spec.Annotations[k] != v {
			t.Errorf("annotation %s = %q, want %q", k, plan.Spec.Annotations[k], v)
		}
	}
	if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "run.oci.seccomp.receiver") }) {
		t.Errorf("no warning names the dropped annotations: %v", warnings)
	}
}

// Seccomp that hands the container's syscalls to someone outside it, or
// turns them into silent successes, is refused by field whatever the
// policy; the notify listener is dropped.
func TestMaliciousHostSeccomp(t *testing.T) {
	zero, eperm := uint(0), uint(1)
	for name, c := range map[string]struct {
		sc    specs.LinuxSeccomp
		field string
	}{
		"notify":          {specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"openat"}, Action: specs.ActNotify}}}, "linux.seccomp.syscalls[0].action SCMP_ACT_NOTIFY"},
		"trace":           {specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}, {Names: []string{"execve"}, Action: specs.ActTrace}}}, "linux.seccomp.syscalls[1].action SCMP_ACT_TRACE"},
		"default notify":  {specs.LinuxSeccomp{DefaultAction: specs.ActNotify}, "linux.seccomp.defaultAction SCMP_ACT_NOTIFY"},
		"errno 0":         {specs.LinuxSeccomp{DefaultAction: specs.ActAllow, Syscalls: []specs.LinuxSyscall{{Names: []string{"setuid", "setgroups"}, Action: specs.ActErrno, ErrnoRet: &zero}}}, "linux.seccomp.syscalls[0].errnoRet 0"},
		"default errno 0": {specs.LinuxSeccomp{DefaultAction: specs.ActErrno, DefaultErrnoRet: &zero}, "linux.seccomp.defaultErrnoRet 0"},
	} {
		s := minimalSpec()
		s.Linux.Seccomp = &c.sc
		_, _, err := adaptSpec(t, s, Options{})
		var fe *ForbiddenError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: err = %v, want a ForbiddenError naming %q", name, err, c.field)
		}
	}
	// containerd's default profile passes: ERRNO with EPERM, or without
	// errnoRet (EPERM); the listener is dropped with a warning.
	s := minimalSpec()
	s.Linux.Seccomp = &specs.LinuxSeccomp{
		DefaultAction: specs.ActErrno, DefaultErrnoRet: &eperm,
		ListenerPath: "/run/host/seccomp.sock", ListenerMetadata: "x",
		Syscalls: []specs.LinuxSyscall{{Names: []string{"read"}, Action: specs.ActAllow}, {Names: []string{"clone3"}, Action: specs.ActErrno}},
	}
	plan, warnings, err := adaptSpec(t, s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sc := plan.Spec.Linux.Seccomp; sc.ListenerPath != "" || sc.ListenerMetadata != "" {
		t.Errorf("seccomp listener kept: %+v", sc)
	}
	if !slices.ContainsFunc(warnings, func(w string) bool { return strings.Contains(w, "listenerPath") }) {
		t.Errorf("no warning names the dropped listener: %v", warnings)
	}
}

// Whatever propagation the host asks for, the container's mounts and the
// guest's stay apart.
func TestMaliciousHostRootfsPropagation(t *testing.T) {
	for _, p := range []string{"", "shared", "rshared", "slave", "rslave", "private"} {
		s := minimalSpec()
		s.Linux.RootfsPropagation = p
		plan, _, err := adaptSpec(t, s, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if got := plan.Spec.Linux.RootfsPropagation; got != "rprivate" {
			t.Errorf("rootfsPropagation %q adapted to %q, want rprivate", p, got)
		}
	}
}

// A host file passed by value with a setuid bit, or executable, becomes
// a plain file, and its bind is nosuid, nodev, noexec even where the
// host's options said otherwise.
func TestMaliciousHostFileModes(t *testing.T) {
	s := minimalSpec()
	s.Mounts = []specs.Mount{
		{Destination: "/etc/hosts", Type: "bind", Source: "/host/hosts", Options: []string{"rbind", "suid", "exec", "dev", "rexec", "ro"}},
		{Destination: "/dev/termination-log", Type: "bind", Source: "/host/termination-log", Options: []string{"rbind"}},
		{Destination: "/etc/resolv.conf", Type: "bind", Source: "/host/resolv.conf", Options: []string{"rbind", "ro"}},
	}
	plan, _, err := adaptSpec(t, s, Options{Files: []File{
		{Source: "/host/hosts", Content: []byte("#!/bin/sh\n"), Mode: 0o4755},
		{Source: "/host/termination-log", Mode: 0o7666},
		{Source: "/host/resolv.conf", Mode: 0o600},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []uint32{0o644, 0o666, 0o600} {
		if got := plan.Files[i].Mode; got != want {
			t.Errorf("guest copy of %s: mode %#o, want %#o", s.Mounts[i].Source, got, want)
		}
	}
	for _, m := range plan.Spec.Mounts {
		for _, bad := range []string{"suid", "exec", "dev", "rexec"} {
			if slices.Contains(m.Options, bad) {
				t.Errorf("bind of %s keeps %q: %v", m.Destination, bad, m.Options)
			}
		}
		for _, want := range []string{"nosuid", "nodev", "noexec"} {
			if !slices.Contains(m.Options, want) {
				t.Errorf("bind of %s lacks %q: %v", m.Destination, want, m.Options)
			}
		}
	}
	if o := plan.Spec.Mounts[0].Options; !slices.Contains(o, "ro") || !slices.Contains(o, "rbind") {
		t.Errorf("the host's other options were not kept: %v", o)
	}
}

// With the sandbox's namespaces held by the agent, a pod container joins
// those paths, not the sandbox's pid's /proc entries; namespaces the pod
// does not share stay its own.
func TestAdaptJoinsHeldNamespaces(t *testing.T) {
	held := map[specs.LinuxNamespaceType]string{
		specs.NetworkNamespace: "/proc/1/fd/10", specs.IPCNamespace: "/proc/1/fd/11",
		specs.UTSNamespace: "/proc/1/fd/12", specs.PIDNamespace: "/proc/1/fd/13",
	}
	plan, err := Adapt(hostSpec(t), Options{ContainerID: "abc", Rootfs: "/r", SandboxPid: 77, SandboxNS: held, Exists: guestHas()})
	if err != nil {
		t.Fatal(err)
	}
	want := map[specs.LinuxNamespaceType]string{
		specs.PIDNamespace: "", specs.MountNamespace: "",
		specs.NetworkNamespace: "/proc/1/fd/10", specs.IPCNamespace: "/proc/1/fd/11", specs.UTSNamespace: "/proc/1/fd/12",
	}
	for _, ns := range plan.Spec.Linux.Namespaces {
		if ns.Path != want[ns.Type] {
			t.Errorf("namespace %s path = %q, want %q", ns.Type, ns.Path, want[ns.Type])
		}
	}
}
