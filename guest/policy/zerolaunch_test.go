package policy

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/pelletier/go-toml/v2"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// zeroLaunchSpec is a spec as containerd's CRI writes it for a container
// the host chose: any image, args, user and env.
func zeroLaunchSpec(typ string, mounts ...specs.Mount) *specs.Spec {
	return &specs.Spec{
		Annotations: map[string]string{AnnotationContainerType: typ, AnnotationContainerName: "whatever", AnnotationImageName: "evil.example/miner:latest"},
		Root:        &specs.Root{Path: "/rootfs"},
		Process: &specs.Process{
			Args: []string{"/miner", "--pool", "x"}, Env: []string{"PATH=/bin", "FOO=bar"}, Cwd: "/work",
			User:         specs.User{UID: 4242, GID: 4242},
			Capabilities: &specs.LinuxCapabilities{Bounding: []string{"CAP_CHOWN"}, Effective: []string{"CAP_CHOWN"}, Permitted: []string{"CAP_CHOWN"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			MaskedPaths:   policyapi.DefaultMaskedPaths,
			ReadonlyPaths: policyapi.DefaultReadonlyPaths,
			Sysctl:        map[string]string{"net.ipv4.ip_unprivileged_port_start": "0"},
		},
		Mounts: append([]specs.Mount{{Destination: "/proc", Type: "proc", Source: "proc"}}, mounts...),
	}
}

// The built-in policy of an snp or tdx VM launched without init data lets
// the host create the containers it chooses, but refuses every channel
// into or out of them, and says why in each denial.
func TestZeroLaunchDefault(t *testing.T) {
	p := policyapi.ZeroLaunchDefault()
	p.Explain = "launched without init data"
	var denials []*Denial
	e := New(p, func(d *Denial, enforced bool) { denials = append(denials, d) })

	kinds := func(ks ...policyapi.MountKind) []policyapi.MountKind {
		return append([]policyapi.MountKind{policyapi.KindProc}, ks...)
	}
	// A container of the host's choosing, and the sandbox, with emptyDir,
	// tmpfs and host files passed by value.
	for _, typ := range []string{ContainerTypeSandbox, ContainerTypeContainer, ""} {
		s := zeroLaunchSpec(typ,
			specs.Mount{Destination: "/cache", Type: "bind", Source: "/run/c8s/emptydir/uid/cache", Options: []string{"rbind"}},
			specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs"},
			specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/run/c8s/containers/c/files/0-hosts", Options: []string{"rbind"}},
		)
		c, err := e.CreateContainer(&CreateContainer{ID: "c-" + typ, Spec: s, MountKinds: kinds(policyapi.KindEmptyDir, policyapi.KindTmpfs, policyapi.KindFile)})
		if err != nil {
			t.Fatalf("type %q: a container the host chose: %v", typ, err)
		}
		if !c.Governed() || c.Rule() != policyapi.ZeroLaunchName || c.OutputAllowed() {
			t.Errorf("type %q: governed %v by %q, output allowed %v; want governed by %s, output discarded", typ, c.Governed(), c.Rule(), c.OutputAllowed(), policyapi.ZeroLaunchName)
		}
	}
	c, _ := e.CreateContainer(&CreateContainer{ID: "app", Spec: zeroLaunchSpec(ContainerTypeContainer), MountKinds: kinds()})

	// Each refusal names its rule and says why the default is in force.
	refused := func(what string, err error, rule string) {
		t.Helper()
		if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), rule) || !strings.Contains(err.Error(), "launched without init data") {
			t.Errorf("%s: %v, want a denial by %s that explains the default", what, err, rule)
		}
	}
	refused("exec", e.Exec(c, &Exec{ExecID: "e", Process: &specs.Process{Args: []string{"sh"}, Cwd: "/work", User: specs.User{UID: 4242, GID: 4242}}}), policyapi.ZeroLaunchName+".exec")
	refused("stdout", e.ReadOutput(c, "", false), policyapi.ZeroLaunchName+".logs")
	refused("stderr", e.ReadOutput(c, "", true), policyapi.ZeroLaunchName+".logs")
	refused("stdin", e.WriteStdin(c, ""), policyapi.ZeroLaunchName+".stdin")
	for name, m := range map[string]struct {
		mount specs.Mount
		kind  policyapi.MountKind
	}{
		"a bind of the pod's secrets": {specs.Mount{Destination: "/s", Type: "bind", Source: "/run/c8s/secrets", Options: []string{"rbind"}}, policyapi.KindGuest},
		"a bind of /":                 {specs.Mount{Destination: "/host", Type: "bind", Source: "/", Options: []string{"rbind"}}, policyapi.KindGuest},
		"a virtio-fs share":           {specs.Mount{Destination: "/data", Type: "bind", Source: "/run/c8s/containers/c/shares/c-0", Options: []string{"rbind"}}, policyapi.KindShared},
		"the VM's /sys read-write":    {specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs"}, policyapi.KindSysfs},
	} {
		_, err := e.CreateContainer(&CreateContainer{ID: "evil", Spec: zeroLaunchSpec(ContainerTypeContainer, m.mount), MountKinds: kinds(m.kind)})
		refused(name, err, policyapi.ZeroLaunchName)
	}
	// Unprivileged, in its own namespaces.
	s := zeroLaunchSpec(ContainerTypeContainer)
	s.Process.Capabilities.Bounding = append(s.Process.Capabilities.Bounding, "CAP_SYS_ADMIN")
	_, err := e.CreateContainer(&CreateContainer{ID: "evil", Spec: s, MountKinds: kinds()})
	refused("CAP_SYS_ADMIN", err, policyapi.ZeroLaunchName+".capabilities")
	s = zeroLaunchSpec(ContainerTypeContainer)
	s.Linux.Namespaces = s.Linux.Namespaces[1:] // the VM's pid namespace
	_, err = e.CreateContainer(&CreateContainer{ID: "evil", Spec: s, MountKinds: kinds()})
	refused("hostPID", err, policyapi.ZeroLaunchName+".vm_namespaces")
	// What is allowed.
	if err := e.Signal(c, "", 15, false); err != nil {
		t.Errorf("SIGTERM: %v", err)
	}
	if err := e.Stats(c); err != nil {
		t.Errorf("stats: %v", err)
	}
	if len(denials) == 0 {
		t.Error("no denial was reported")
	}
}

// No document can set what only built-in policies have: a rule that
// leaves args or the user open, or a default rule.
func TestBuiltinFieldsAreNotInDocuments(t *testing.T) {
	for _, doc := range []string{
		"[policy.default]\nimage = \"re:.*\"\n",
		"[policy.containers.app]\nany_args = true\n",
		"[policy.containers.app]\nany_user = true\n",
		"builtin = \"x\"\n",
	} {
		var d policyapi.Policy
		dec := toml.NewDecoder(strings.NewReader(doc))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&d); err == nil {
			t.Errorf("%q was read: %+v", doc, d)
		}
	}
}
