package policy

import (
	"strings"
	"testing"
)

func TestPattern(t *testing.T) {
	for _, c := range []struct {
		p     Pattern
		s     string
		match bool
	}{
		{"PATH=/bin", "PATH=/bin", true},
		{"PATH=/bin", "PATH=/bin:/tmp", false},
		{"re:HOSTNAME=app-[a-z0-9]{5}", "HOSTNAME=app-x2k4q", true},
		// Anchored: a prefix or suffix does not match.
		{"re:HOSTNAME=app-[a-z0-9]{5}", "HOSTNAME=app-x2k4q\nLD_PRELOAD=/x", false},
		{"re:a|b", "ab", false},
		{"re:a|b", "b", true},
		{"re:[", "[", false}, // does not compile: matches nothing
		{"re:re:\\.x", "re:.x", true},
	} {
		if got := c.p.Match(c.s); got != c.match {
			t.Errorf("%q.Match(%q) = %v, want %v", c.p, c.s, got, c.match)
		}
	}
	if Pattern("re:[").Validate() == nil || Pattern("[").Validate() != nil {
		t.Error("Validate: a bad regular expression must be refused, a literal never")
	}
	if !MatchList([]Pattern{"cat", "re:/tmp/.*"}, []string{"cat", "/tmp/x"}) || MatchList([]Pattern{"cat"}, []string{"cat", "x"}) {
		t.Error("MatchList")
	}
}

func TestParseSignal(t *testing.T) {
	for s, want := range map[string]int{"SIGTERM": 15, "TERM": 15, "sigkill": 9, "10": 10} {
		if got, err := ParseSignal(s); err != nil || got != want {
			t.Errorf("ParseSignal(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"SIGNOPE", "0", "65", "-1"} {
		if _, err := ParseSignal(s); err == nil {
			t.Errorf("ParseSignal(%q) accepted", s)
		}
	}
}

// Validate names the key of each mistake.
func TestValidate(t *testing.T) {
	ro := []string{"CAP_SYS_ADMN"}
	sig := []string{"SIGNOPE"}
	p := &Policy{Containers: map[string]*Container{
		"app": {
			Args:         []Pattern{"re:("},
			Capabilities: &ro,
			VMNamespaces: []string{"net"},
			Signals:      &sig,
			Exec:         [][]Pattern{{}},
			Mounts: []Mount{
				{Destination: "/x", Kind: "volume"},
				{Destination: "/y", Kind: KindGuest, Source: "/a/../b"},
				{Destination: "/z", Kind: KindShared, Source: "/var/lib/kubelet"},
				{Kind: KindTmpfs},
			},
			Secrets: []Secret{{Resource: "kbs:///other/key/x"}, {Resource: "kbs:///default/key/db", Path: "rel"}},
		},
		"weird name": nil,
	}}
	err := p.Validate([]string{"kbs:///default/key/db"})
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{
		"policy.containers.app.image: required", "policy.containers.app.args[0]",
		`policy.containers.app.capabilities: "CAP_SYS_ADMN"`, `policy.containers.app.vm_namespaces: "net"`,
		"policy.containers.app.signals", "policy.containers.app.exec[0]: an empty argv",
		`policy.containers.app.mounts[0]: kind "volume"`, "policy.containers.app.mounts[1]: source",
		"policy.containers.app.mounts[2]: source: only a guest bind", "policy.containers.app.mounts[3]: destination is required",
		"policy.containers.app.secrets[0].resource", "policy.containers.app.secrets[1].path",
		`policy.containers."weird name": empty rule`,
		// What the process is, where it starts, who it runs as.
		"policy.containers.app.working_dir: required", "policy.containers.app.uid: required", "policy.containers.app.gid: required",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

// Every rule, the sandbox's too, pins working_dir, uid and gid; an empty
// working_dir is no pin.
func TestValidateRequiredKeys(t *testing.T) {
	root, dir, empty := uint32(0), Pattern("/"), Pattern("")
	full := func() *Container {
		return &Container{Image: "x", Args: []Pattern{"y"}, WorkingDir: &dir, UID: &root, GID: &root}
	}
	if err := (&Policy{Sandbox: full(), Containers: map[string]*Container{"app": full()}}).Validate(nil); err != nil {
		t.Fatalf("a complete policy: %v", err)
	}
	for key, mod := range map[string]func(*Container){
		"working_dir": func(c *Container) { c.WorkingDir = nil },
		"uid":         func(c *Container) { c.UID = nil },
		"gid":         func(c *Container) { c.GID = nil },
	} {
		sb := full()
		mod(sb)
		err := (&Policy{Sandbox: sb}).Validate(nil)
		if want := "policy.sandbox." + key + ": required"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("without %s: err = %v, want %q", key, err, want)
		}
	}
	c := full()
	c.WorkingDir = &empty
	if err := (&Policy{Containers: map[string]*Container{"app": c}}).Validate(nil); err == nil || !strings.Contains(err.Error(), "policy.containers.app.working_dir: required") {
		t.Errorf("an empty working_dir: err = %v", err)
	}
	bad := Pattern("re:(")
	c = full()
	c.ExecWorkingDir = &bad
	if err := (&Policy{Containers: map[string]*Container{"app": c}}).Validate(nil); err == nil || !strings.Contains(err.Error(), "policy.containers.app.exec_working_dir") {
		t.Errorf("a bad exec_working_dir: err = %v", err)
	}
}

func TestDefaults(t *testing.T) {
	c := &Container{}
	if len(c.AllowedCapabilities()) != 14 || len(c.RequiredMaskedPaths()) == 0 || len(c.AllowedSignals()) != 3 {
		t.Fatal("defaults")
	}
	c.Privileged = true
	if len(c.AllowedCapabilities()) != len(AllCapabilities) || c.RequiredMaskedPaths() != nil || c.RequiredReadonlyPaths() != nil {
		t.Fatal("privileged")
	}
	if (&Policy{}).StatsAllowed() != true || (&Policy{}).UpdateAllowed() != true {
		t.Fatal("stats and updates are allowed by default")
	}
	for _, k := range []string{"proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2"} {
		if FSKind(k) == "" {
			t.Errorf("FSKind(%s) = none", k)
		}
	}
	for _, k := range []string{"ext4", "virtiofs", "overlay", "9p", "bind", ""} {
		if FSKind(k) != "" {
			t.Errorf("FSKind(%s) = %s, want none", k, FSKind(k))
		}
	}
}
