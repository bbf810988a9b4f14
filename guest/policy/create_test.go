package policy

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// The pod the policy describes is created, and its rule recorded: secrets
// where it names them, logs.
func TestPolicysPodIsAllowed(t *testing.T) {
	e := evaluator(t, podPolicy)
	sb := sandbox(t, e)
	if sb.Rule() != "policy.sandbox" || !sb.Identity.Sandbox() {
		t.Fatalf("sandbox = %+v", sb)
	}
	app, err := create(t, e, appSpec())
	if err != nil {
		t.Fatal(err)
	}
	if app.Rule() != "policy.containers.app" || !app.OutputAllowed() {
		t.Fatalf("app = %+v", app)
	}
	named, all := app.Secrets()
	if all || len(named) != 1 || named[0].Path != "/etc/app/db" {
		t.Fatalf("app's secrets = %+v, %v", named, all)
	}
	if named, all := sb.Secrets(); all || len(named) != 0 || sb.OutputAllowed() {
		t.Fatalf("the sandbox gets secrets %+v (all %v) or logs", named, all)
	}
}

// Without a policy, everything is allowed and every container gets every
// secret: the agent's behaviour for init data without [policy].
func TestNoPolicyAllowsAll(t *testing.T) {
	for _, e := range []*Evaluator{nil, New(nil, nil)} {
		s := appSpec()
		s.Process.Capabilities = caps(policyapi.AllCapabilities...)
		c, err := e.CreateContainer(&CreateContainer{ID: "x", Spec: s, MountKinds: kindsOf(s.Mounts)})
		if err != nil || c.Governed() {
			t.Fatalf("CreateContainer = %+v, %v", c, err)
		}
		if _, all := c.Secrets(); !all || !c.OutputAllowed() {
			t.Fatal("an ungoverned container must get every secret and its logs read")
		}
		if err := e.Exec(c, &Exec{Process: &specs.Process{Args: []string{"sh"}}, Stdin: true}); err != nil {
			t.Fatal(err)
		}
		if e.ReadOutput(c, "", false) != nil || e.WriteStdin(c, "") != nil || e.Signal(c, "", 10, true) != nil || e.Stats(c) != nil || e.Update(c) != nil {
			t.Fatal("a request refused without a policy")
		}
	}
}

// A container no rule names is refused: by CRI name, by type, and the
// sandbox when the policy has no sandbox rule.
func TestUnknownContainerRefused(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Annotations[AnnotationContainerName] = "debugger"
	d := denied(t, second(create(t, e, s)), AnnotationContainerName, "policy.containers")
	if !strings.Contains(d.Expected, `"app"`) || d.Container != "debugger" {
		t.Errorf("denial %v does not list the named containers", d)
	}
	s.Annotations[AnnotationContainerType] = "evil"
	denied(t, second(create(t, e, s)), AnnotationContainerType, "")
	// No CRI annotations: matched by the container id, which names no rule.
	s.Annotations = nil
	denied(t, second(create(t, e, s)), "container id (no CRI annotations)", "policy.containers")

	noSandbox := evaluator(t, "[policy]\n[policy.containers.app]\nimage = \"x\"\nargs = [\"y\"]\nworking_dir = \"/\"\nuid = 0\ngid = 0\n")
	_, err := noSandbox.CreateContainer(&CreateContainer{ID: "pod", Spec: sandboxSpec()})
	denied(t, err, AnnotationContainerType, "policy.sandbox")
}

func second[A, B any](_ A, b B) B { return b }

// An image other than the policy's.
func TestMaliciousHostOtherImage(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Annotations[AnnotationImageName] = "ghcr.io/attacker/app:1.0"
	d := denied(t, second(create(t, e, s)), "image", "policy.containers.app.image")
	if d.Actual != `"ghcr.io/attacker/app:1.0"` || d.Expected != `"ghcr.io/example/app:1.0"` {
		t.Errorf("denial %v: want expected vs got", d)
	}
	// A pattern pins the digest form.
	s = appSpec()
	s.Annotations[AnnotationContainerName] = "sidecar"
	s.Process.Args = []string{"/sidecar"}
	s.Process.Env, s.Process.User, s.Process.NoNewPrivileges = nil, specs.User{}, false
	s.Mounts = standardMounts()
	s.Annotations[AnnotationImageName] = "ghcr.io/example/sidecar:latest"
	denied(t, second(create(t, e, s)), "image", "policy.containers.sidecar.image")
	s.Annotations[AnnotationImageName] = "ghcr.io/example/sidecar@sha256:" + strings.Repeat("ab", 32)
	if _, err := create(t, e, s); err != nil {
		t.Fatal(err)
	}
}

// Args or env changed: an argument, a variable added, a value changed, a
// required variable dropped. Values Kubernetes fills in match patterns.
func TestMaliciousHostArgsEnvChanged(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Process.Args = append(s.Process.Args, "--debug-dump-keys")
	denied(t, second(create(t, e, s)), "process.args", "policy.containers.app.args")

	s = appSpec()
	s.Process.Env = append(s.Process.Env, "LD_PRELOAD=/tmp/evil.so")
	d := denied(t, second(create(t, e, s)), "process.env[4]", "policy.containers.app.env")
	if d.Actual != `"LD_PRELOAD=/tmp/evil.so"` {
		t.Errorf("denial %v", d)
	}
	s = appSpec()
	s.Process.Env[0] = "PATH=/tmp:/usr/bin:/bin"
	denied(t, second(create(t, e, s)), "process.env[0]", "policy.containers.app.env")
	s = appSpec()
	s.Process.Env = s.Process.Env[1:]
	if d := denied(t, second(create(t, e, s)), "process.env", "policy.containers.app.env"); d.Actual != `"PATH=/usr/bin:/bin"` || !strings.Contains(d.Error(), "missing") {
		t.Errorf("denial %v: want the missing variable", d)
	}
	s = appSpec()
	s.Process.Env[1] = "HOSTNAME=evil"
	denied(t, second(create(t, e, s)), "process.env[1]", "policy.containers.app.env")
}

// Working dir, user, no-new-privileges, read-only root.
func TestProcessPins(t *testing.T) {
	e := evaluator(t, podPolicy)
	for field, mod := range map[string]func(*specs.Spec){
		"process.cwd":                  func(s *specs.Spec) { s.Process.Cwd = "/tmp" },
		"process.user.uid":             func(s *specs.Spec) { s.Process.User.UID = 0 },
		"process.user.gid":             func(s *specs.Spec) { s.Process.User.GID = 0 },
		"process.noNewPrivileges":      func(s *specs.Spec) { s.Process.NoNewPrivileges = false },
		"root.readonly":                func(s *specs.Spec) { s.Root.Readonly = false },
		"process.commandLine":          func(s *specs.Spec) { s.Process.CommandLine = "cmd /c x" },
		"linux.sysctl":                 func(s *specs.Spec) { s.Linux.Sysctl = map[string]string{"kernel.core_pattern": "|/evil"} },
		"process.capabilities.ambient": func(s *specs.Spec) { s.Process.Capabilities.Ambient = []string{"CAP_NET_ADMIN"} },
	} {
		s := appSpec()
		mod(s)
		denied(t, second(create(t, e, s)), field, "")
	}
	// Sysctls the rule lists pass.
	e = evaluator(t, strings.Replace(podPolicy, "logs = true", "logs = true\nsysctls = [\"re:net\\\\.ipv4\\\\.ping_group_range=.*\"]", 1))
	s := appSpec()
	s.Linux.Sysctl = map[string]string{"net.ipv4.ping_group_range": "0 2147483647"}
	if _, err := create(t, e, s); err != nil {
		t.Fatal(err)
	}
}

// A privileged container: every capability, no masked paths, read-write
// sysfs. Each is refused by name; privileged = true allows them.
func TestMaliciousHostPrivilegedContainer(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Process.Capabilities = caps(policyapi.AllCapabilities...)
	s.Linux.MaskedPaths, s.Linux.ReadonlyPaths = nil, nil
	for i := range s.Mounts {
		if s.Mounts[i].Type == "sysfs" {
			s.Mounts[i].Options = []string{"nosuid", "noexec", "nodev", "rw"}
		}
	}
	_, err := create(t, e, s)
	d := denied(t, err, "process.capabilities.bounding", "policy.containers.app.capabilities")
	if !strings.Contains(d.Actual, "CAP_SYS_ADMIN") || !strings.Contains(d.Hint, "CAP_SYS_ADMIN") {
		t.Errorf("denial %v does not name CAP_SYS_ADMIN", d)
	}
	denied(t, err, "linux.maskedPaths", "policy.containers.app.masked_paths")
	denied(t, err, "linux.readonlyPaths", "policy.containers.app.readonly_paths")
	denied(t, err, "mounts[4].options", "policy.containers.app.privileged")

	priv := evaluator(t, strings.Replace(podPolicy, "logs = true", "logs = true\nprivileged = true", 1))
	if _, err := create(t, priv, s); err != nil {
		t.Fatalf("privileged = true: %v", err)
	}
}

// CAP_SYS_PTRACE outside the rule's capabilities, and a container in the
// VM's pid namespace, where it would see the agent.
func TestMaliciousHostPtraceAndVMPidNamespace(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Process.Capabilities.Effective = append(s.Process.Capabilities.Effective, "CAP_SYS_PTRACE")
	d := denied(t, second(create(t, e, s)), "process.capabilities.effective", "policy.containers.app.capabilities")
	if d.Actual != `["CAP_SYS_PTRACE"]` || !strings.Contains(d.Expected, "containerd's defaults") {
		t.Errorf("denial %v", d)
	}

	s = appSpec()
	s.Linux.Namespaces = slices.DeleteFunc(s.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == "pid" })
	d = denied(t, second(create(t, e, s)), "linux.namespaces.pid", "policy.containers.app.vm_namespaces")
	if !strings.Contains(d.Hint, "agent") {
		t.Errorf("denial %v does not say what the VM's pid namespace exposes", d)
	}
	allowed := evaluator(t, strings.Replace(podPolicy, "logs = true", "logs = true\nvm_namespaces = [\"pid\"]", 1))
	if _, err := create(t, allowed, s); err != nil {
		t.Fatalf("vm_namespaces = [\"pid\"]: %v", err)
	}
}

// Namespaces may be joined only from the pod's sandbox.
func TestMaliciousHostJoinsNonSandbox(t *testing.T) {
	e := evaluator(t, podPolicy)
	app, err := create(t, e, appSpec())
	if err != nil {
		t.Fatal(err)
	}
	s := appSpec()
	_, err = e.CreateContainer(&CreateContainer{ID: "abc2", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: app})
	d := denied(t, err, "linux.namespaces[1].path", "")
	if !strings.Contains(d.Reason, `"app"`) {
		t.Errorf("denial %v does not name the joined container", d)
	}
	_, err = e.CreateContainer(&CreateContainer{ID: "abc3", Spec: s, MountKinds: kindsOf(s.Mounts)})
	denied(t, err, "linux.namespaces[1].path", "")
}

// Binds of the guest's own paths: the secrets, the root, another
// container's root, the TEE guest device. Named by source, they pass.
func TestMaliciousHostBindsGuestPaths(t *testing.T) {
	e := evaluator(t, podPolicy)
	for _, src := range []string{"/run/c8s/secrets", "/", "/run/c8s/containers/pod/rootfs", "/dev/sev-guest"} {
		s := appSpec()
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/loot", Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		i := len(s.Mounts) - 1
		d := denied(t, second(create(t, e, s)), "mounts["+itoa(i)+"].source", "policy.containers.app.mounts")
		if !strings.Contains(d.Error(), src) || !strings.Contains(d.Expected, "/cache (tmpfs)") {
			t.Errorf("denial %v does not name the source and the allowed mounts", d)
		}
	}
	// The brief's message, whole.
	s := appSpec()
	s.Mounts = append(s.Mounts[:3], specs.Mount{Destination: "/loot", Type: "bind", Source: "/run/c8s/secrets"})
	_, err := create(t, e, s)
	want := `policy: CreateContainer "app" (container abc): mounts[3].source "/run/c8s/secrets": not allowed by policy.containers.app.mounts (allowed: /var/run/secrets/kubernetes.io/serviceaccount (shared, ro), /cache (tmpfs), the standard mounts); a bind of the guest's own /run/c8s/secrets on /loot: guest-internal state (the pod's secrets, the containers' roots, devices, kernel interfaces)`
	if err == nil || err.Error() != want {
		t.Errorf("message:\n got %v\nwant %s", err, want)
	}

	named := evaluator(t, strings.Replace(podPolicy, `{ destination = "/cache", kind = "tmpfs" },`,
		`{ destination = "/cache", kind = "tmpfs" }, { destination = "/data", kind = "guest", source = "/srv/data" },`, 1))
	s = appSpec()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data", Type: "bind", Source: "/srv/data"})
	if _, err := create(t, named, s); err != nil {
		t.Fatal(err)
	}
	s.Mounts[len(s.Mounts)-1].Source = "/run/c8s/secrets"
	denied(t, second(create(t, named, s)), "mounts["+itoa(len(s.Mounts)-1)+"].source", "")
}

func itoa(i int) string { return strconv.Itoa(i) }

// Mounts of host content at paths the rule does not name (a tmpfs or a
// host file over the container's CA certificates), a shared volume made
// writable, a disk's filesystem: refused.
func TestMaliciousHostMounts(t *testing.T) {
	e := evaluator(t, podPolicy)
	for name, m := range map[string]specs.Mount{
		"tmpfs over certificates":   {Destination: "/etc/ssl/certs", Type: "tmpfs", Source: "tmpfs"},
		"host file over a CA store": {Destination: "/etc/ssl/certs/ca-certificates.crt", Type: "bind", Source: "/run/c8s/containers/abc/files/1-ca", Options: []string{"rbind"}},
		"a share not named":         {Destination: "/data", Type: "bind", Source: "/run/c8s/shared/abc-9", Options: []string{"rbind"}},
	} {
		s := appSpec()
		s.Mounts = append(s.Mounts, m)
		d := denied(t, second(create(t, e, s)), "mounts["+itoa(len(s.Mounts)-1)+"]", "policy.containers.app.mounts")
		if !strings.Contains(d.Actual, m.Destination) {
			t.Errorf("%s: denial %v does not name the destination", name, d)
		}
	}
	s := appSpec()
	s.Mounts[len(s.Mounts)-1].Options = []string{"rbind", "rw"} // the read-only token share
	denied(t, second(create(t, e, s)), "mounts["+itoa(len(s.Mounts)-1)+"]", "policy.containers.app.mounts")

	s = appSpec()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/disk", Type: "ext4", Source: "/dev/sdb"})
	s2 := kindsOf(s.Mounts)
	_, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: s2, Joined: sandbox(t, e)})
	if d := denied(t, err, "mounts["+itoa(len(s.Mounts)-1)+"].type", ""); d.Reason != "never allowed" {
		t.Errorf("denial %v", d)
	}
}

// Every broken rule of one request is reported, each with its field.
func TestAllDenialsReported(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Annotations[AnnotationImageName] = "evil"
	s.Process.Args = []string{"sh"}
	_, err := create(t, e, s)
	denied(t, err, "image", "")
	denied(t, err, "process.args", "")
	if !strings.Contains(err.Error(), "(2 denials)") {
		t.Errorf("err = %v", err)
	}
}

// TestMaliciousHostMasksAFile: the host adds paths of the container's own
// to linux.maskedPaths (or readonlyPaths). crun masks them after every
// mount, the pod's secrets included: a masked password file reads empty,
// which some servers take for "no password", and a masked configuration
// directory drops its access rules. Only the rule's paths and what the
// kubelet and containerd mask by default (the node's per-CPU
// thermal_throttle among them) pass.
func TestMaliciousHostMasksAFile(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, "/etc/app/db", "/etc/nginx/conf.d")
	_, err := create(t, e, s)
	d := denied(t, err, "linux.maskedPaths", "policy.containers.app.masked_paths")
	if !strings.Contains(d.Actual, "/etc/app/db") || !strings.Contains(d.Actual, "/etc/nginx/conf.d") {
		t.Errorf("denial %v does not name the masked paths", d)
	}
	s = appSpec()
	s.Linux.ReadonlyPaths = append(s.Linux.ReadonlyPaths, "/var/lib/data")
	_, err = create(t, e, s)
	denied(t, err, "linux.readonlyPaths", "policy.containers.app.readonly_paths")

	s = appSpec()
	s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, "/proc/interrupts", "/sys/devices/virtual/powercap",
		"/sys/devices/system/cpu/cpu0/thermal_throttle", "/sys/devices/system/cpu/cpu13/thermal_throttle")
	if _, err := create(t, e, s); err != nil {
		t.Fatalf("the kubelet's and containerd's default masks: %v", err)
	}
	for _, p := range []string{"/sys/devices/system/cpu/cpu/thermal_throttle", "/sys/devices/system/cpu/cpu1/../../../../etc/thermal_throttle"} {
		if policyapi.RuntimeMaskedPath(p) {
			t.Errorf("%s counts as a runtime default", p)
		}
	}
}
