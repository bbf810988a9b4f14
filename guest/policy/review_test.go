package policy

import (
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// withData is podPolicy with a shared volume allowed anywhere below /data
// and a guest bind of /srv/data on /srv.
func withData(t *testing.T) *Evaluator {
	return evaluator(t, strings.Replace(podPolicy, `{ destination = "/cache", kind = "tmpfs" },`,
		`{ destination = "/cache", kind = "tmpfs" },
  { destination = "re:/data(/.*)?", kind = "shared" },
  { destination = "/srv", kind = "guest", source = "/srv/data" },`, 1))
}

// A destination with "..": "/data/../usr/bin" matches re:/data(/.*)?,
// and the runtime mounts it on /usr/bin, over the image's binaries. Every
// destination must be clean and absolute, and so must a guest bind's
// source, before any rule is matched.
func TestMaliciousHostDotDotMountDestination(t *testing.T) {
	e := withData(t)
	for _, dest := range []string{"/data/../usr/bin", "/data/./x", "/data/", "data/x", "/data//x", "../../etc"} {
		s := appSpec()
		s.Mounts = append(s.Mounts, specs.Mount{Destination: dest, Type: "bind", Source: "/run/c8s/shared/abc-9", Options: []string{"rbind"}})
		d := denied(t, second(create(t, e, s)), "mounts["+itoa(len(s.Mounts)-1)+"].destination", "")
		if d.Reason != "not a clean absolute path" || !strings.Contains(d.Actual, dest) {
			t.Errorf("%s: denial %v", dest, d)
		}
	}
	s := appSpec()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/data/sub", Type: "bind", Source: "/run/c8s/shared/abc-9", Options: []string{"rbind"}})
	if _, err := create(t, e, s); err != nil {
		t.Fatalf("a clean destination below /data: %v", err)
	}

	// A guest bind's source: exact, and clean.
	s = appSpec()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/srv", Type: "bind", Source: "/srv/data/../../run/c8s/secrets", Options: []string{"rbind"}})
	if d := denied(t, second(create(t, e, s)), "mounts["+itoa(len(s.Mounts)-1)+"].source", ""); d.Reason != "not a clean absolute path" {
		t.Errorf("denial %v", d)
	}
	s.Mounts[len(s.Mounts)-1].Source = "/srv/data"
	if _, err := create(t, e, s); err != nil {
		t.Fatalf("the named guest bind: %v", err)
	}
}

// ["ro", "rw"] is read-write under runc and crun: the last of ro and rw
// wins, and the recursive rrw or rro over both. A read-only rule or a
// standard read-only mount counts the effective flag, not "ro" anywhere.
func TestMaliciousHostReadOnlyOverridden(t *testing.T) {
	e := evaluator(t, podPolicy)
	token := len(appSpec().Mounts) - 1 // the read-only service account share
	for _, c := range []struct {
		opts []string
		ro   bool
	}{
		{[]string{"rbind", "ro", "rw"}, false},
		{[]string{"rbind", "ro", "rrw"}, false},
		{[]string{"rbind", "rro", "rw", "rrw"}, false},
		{[]string{"rbind", "rw", "ro"}, true},
		{[]string{"rbind", "rw", "rro"}, true},
		{[]string{"rbind", "ro"}, true},
	} {
		s := appSpec()
		s.Mounts[token].Options = c.opts
		_, err := create(t, e, s)
		if c.ro && err != nil {
			t.Errorf("options %q (read-only): %v", c.opts, err)
		}
		if !c.ro {
			if err == nil {
				t.Errorf("options %q (read-write): allowed on a read_only mount", c.opts)
				continue
			}
			denied(t, err, "mounts["+itoa(token)+"]", "policy.containers.app.mounts")
		}
	}
	// /sys, read-only unless privileged.
	s := appSpec()
	sys := 4
	if s.Mounts[sys].Destination != "/sys" {
		t.Fatalf("mount %d is %s", sys, s.Mounts[sys].Destination)
	}
	s.Mounts[sys].Options = append(s.Mounts[sys].Options, "rw")
	denied(t, second(create(t, e, s)), "mounts["+itoa(sys)+"].options", "policy.containers.app.privileged")
}

// A second entry for a name the policy pins: glibc's getenv and Go's
// os.Getenv take the first, other readers the last, so the policy cannot
// tell which value the process uses. Refused, at create and exec, even
// when each entry matches a pattern of the rule.
func TestMaliciousHostDuplicateEnv(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Process.Env = append(s.Process.Env, "KUBERNETES_SERVICE_HOST=10.6.6.6") // matches re:KUBERNETES_…
	d := denied(t, second(create(t, e, s)), "process.env[4]", "")
	if !strings.Contains(d.Reason, "process.env[2]") || !strings.Contains(d.Reason, "KUBERNETES_SERVICE_HOST") {
		t.Errorf("denial %v does not name the first entry", d)
	}
	s = appSpec()
	s.Process.Env = append([]string{"PATH=/tmp/evil"}, s.Process.Env...)
	denied(t, second(create(t, e, s)), "process.env[1]", "")

	e, c := app(t)
	x := execOf("/app", "healthcheck")
	x.Process.Env = append(x.Process.Env, "HOSTNAME=app-7d9f8c6b5-evil1")
	denied(t, e.Exec(c, x), "process.env[4]", "")
	if err := e.Exec(c, execOf("/app", "healthcheck")); err != nil {
		t.Fatal(err)
	}
}

// SIGQUIT makes most processes dump core: it is not among the signals a
// rule allows by default; those that stop a container are.
func TestMaliciousHostSIGQUITByDefault(t *testing.T) {
	e, c := app(t)
	denied(t, e.Signal(c, "", int(syscall.SIGQUIT), false), "signal", "policy.containers.app.signals")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL, syscall.SIGINT} {
		if err := e.Signal(c, "", int(sig), false); err != nil {
			t.Errorf("%v: %v", sig, err)
		}
	}
	e, c = app(t, "logs = true", `logs = true
signals = ["SIGTERM", "SIGQUIT"]`)
	if err := e.Signal(c, "", int(syscall.SIGQUIT), false); err != nil {
		t.Errorf("SIGQUIT where the rule lists it: %v", err)
	}
}

// A working directory is matched only when clean: "/app/../tmp" would
// match a pattern such as re:/app(/.*)? and run the container elsewhere.
func TestMaliciousHostDotDotWorkingDir(t *testing.T) {
	e := withData(t)
	for _, cwd := range []string{"/./", "//", "/tmp/..", "relative"} {
		s := appSpec()
		s.Process.Cwd = cwd
		d := denied(t, second(create(t, e, s)), "process.cwd", "")
		if d.Reason != "not a clean absolute path" {
			t.Errorf("cwd %q: denial %v, want one saying it is not a clean absolute path", cwd, d)
		}
	}
}
