package policy

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// The process fields beyond user, args and capabilities: each attack is
// refused by name, and the spec containerd writes (no umask, RLIMIT_NOFILE
// 1024, the kubelet's OOM score) is allowed.
func TestMaliciousHostProcessFields(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	adj := -997
	s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 1024}, {Type: "RLIMIT_CORE"}}
	s.Process.OOMScoreAdj = &adj
	if _, err := create(t, e, s); err != nil {
		t.Fatalf("containerd's spec: %v", err)
	}
	umask := uint32(0)
	nice := -5
	for field, change := range map[string]func(p *specs.Process){
		"process.user.umask": func(p *specs.Process) { p.User.Umask = &umask },
		"process.rlimits[0]": func(p *specs.Process) {
			p.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_MEMLOCK", Soft: 1 << 40, Hard: 1 << 40}}
		},
		"process.rlimits[1]": func(p *specs.Process) {
			p.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_CORE"}, {Type: "RLIMIT_STACK", Soft: ^uint64(0), Hard: ^uint64(0)}}
		},
		"process.oomScoreAdj":      func(p *specs.Process) { v := -1000; p.OOMScoreAdj = &v },
		"process.scheduler":        func(p *specs.Process) { p.Scheduler = &specs.Scheduler{Policy: specs.SchedFIFO, Priority: 99} },
		"process.ioPriority.class": func(p *specs.Process) { p.IOPriority = &specs.LinuxIOPriority{Class: specs.IOPRIO_CLASS_RT} },
	} {
		s := appSpec()
		change(s.Process)
		denied(t, second(create(t, e, s)), field, "")
	}
	s = appSpec()
	s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 1 << 21, Hard: 1 << 21}}
	if d := denied(t, second(create(t, e, s)), "process.rlimits[0]", "policy.containers.app.rlimits"); d.Reason != "above the bound" {
		t.Errorf("RLIMIT_NOFILE above the default bound: %v", d)
	}
	s = appSpec()
	s.Process.Scheduler = &specs.Scheduler{Policy: specs.SchedOther, Nice: int32(nice)}
	denied(t, second(create(t, e, s)), "process.scheduler", "")

	// An exec is held to the same.
	app, err := create(t, e, appSpec())
	if err != nil {
		t.Fatal(err)
	}
	p := appSpec().Process
	p.Args = []string{"/app", "healthcheck"}
	p.User.Umask = &umask
	denied(t, e.Exec(app, &Exec{ExecID: "probe", Process: p}), "process.user.umask", "")
}

// A rule pins the umask and bounds the limits it names; others stay
// refused.
func TestProcessFieldsPinnedByRule(t *testing.T) {
	e := evaluator(t, podPolicy+`umask = 0o027
rlimits = [{ type = "RLIMIT_NOFILE", max = 4096 }, { type = "RLIMIT_NPROC", max = 512 }]
`)
	sidecar := func() *specs.Spec {
		s := appSpec()
		s.Annotations = map[string]string{AnnotationContainerType: "container", AnnotationContainerName: "sidecar", AnnotationImageName: "ghcr.io/example/sidecar@sha256:" + "0f6e4b9a3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f"}
		s.Process.Args, s.Process.Env, s.Process.User = []string{"/sidecar"}, nil, specs.User{}
		s.Mounts = standardMounts()
		return s
	}
	s := sidecar()
	um := uint32(0o027)
	s.Process.User.Umask = &um
	s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 4096, Hard: 4096}, {Type: "RLIMIT_NPROC", Soft: 100, Hard: 512}}
	if _, err := create(t, e, s); err != nil {
		t.Fatalf("as the rule says: %v", err)
	}
	s.Process.User.Umask = nil // 022, not the rule's
	denied(t, second(create(t, e, s)), "process.user.umask", "policy.containers.sidecar.umask")
	s = sidecar()
	s.Process.User.Umask = &um
	s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NPROC", Soft: 513, Hard: 513}}
	denied(t, second(create(t, e, s)), "process.rlimits[0]", "policy.containers.sidecar.rlimits")
}

// The linux fields no rule allows, and the user namespace only where the
// rule does, never mapping the guest's root.
func TestMaliciousHostLinuxFields(t *testing.T) {
	e := evaluator(t, podPolicy)
	for field, change := range map[string]func(s *specs.Spec){
		"linux.timeOffsets": func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.TimeNamespace})
			s.Linux.TimeOffsets = map[string]specs.LinuxTimeOffset{"monotonic": {Secs: 86400 * 365}}
		},
		"linux.personality": func(s *specs.Spec) { s.Linux.Personality = &specs.LinuxPersonality{Domain: specs.PerLinux32} },
		"linux.intelRdt":    func(s *specs.Spec) { s.Linux.IntelRdt = &specs.LinuxIntelRdt{ClosID: "guaranteed"} },
		"linux.namespaces.user": func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
			s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 1000, HostID: 0, Size: 1}}
		},
	} {
		s := appSpec()
		change(s)
		denied(t, second(create(t, e, s)), field, "")
	}
	// A fresh time namespace without offsets is the container's own.
	s := appSpec()
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.TimeNamespace})
	if _, err := create(t, e, s); err != nil {
		t.Errorf("a time namespace without offsets: %v", err)
	}

	e = evaluator(t, podPolicy+"user_namespace = true\n")
	sidecar := func(hostID uint32) *specs.Spec {
		s := appSpec()
		s.Annotations = map[string]string{AnnotationContainerType: "container", AnnotationContainerName: "sidecar", AnnotationImageName: "ghcr.io/example/sidecar@sha256:" + "0f6e4b9a3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f"}
		s.Process.Args, s.Process.Env, s.Process.User = []string{"/sidecar"}, nil, specs.User{}
		s.Mounts = standardMounts()
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		s.Linux.UIDMappings = []specs.LinuxIDMapping{{ContainerID: 0, HostID: hostID, Size: 65536}}
		s.Linux.GIDMappings = s.Linux.UIDMappings
		return s
	}
	if _, err := create(t, e, sidecar(65536)); err != nil {
		t.Fatalf("hostUsers: false, as containerd maps it: %v", err)
	}
	denied(t, second(create(t, e, sidecar(0))), "linux.uidMappings[0]", "policy.containers.sidecar.user_namespace")
}
