package policy

import (
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// app creates container "app" of podPolicy (with the rule edited by
// replace's pairs) and returns the evaluator and the container.
func app(t *testing.T, replace ...string) (*Evaluator, *Container) {
	t.Helper()
	doc := podPolicy
	for i := 0; i+1 < len(replace); i += 2 {
		doc = strings.Replace(doc, replace[i], replace[i+1], 1)
	}
	e := evaluator(t, doc)
	c, err := create(t, e, appSpec())
	if err != nil {
		t.Fatal(err)
	}
	return e, c
}

// execOf is an exec of argv as containerd's CRI makes it: the container's
// process with other args.
func execOf(argv ...string) *Exec {
	p := *appSpec().Process
	p.Args = argv
	return &Exec{ExecID: "e1", Process: &p}
}

// Exec is refused unless its argv is on the container's list; the exec's
// process is held to the container's rule.
func TestMaliciousHostExec(t *testing.T) {
	e, c := app(t)
	d := denied(t, e.Exec(c, execOf("sh", "-c", "cat /run/secrets/*")), "process.args", "policy.containers.app.exec")
	if !strings.Contains(d.Expected, `["/app", "healthcheck"]`) || d.ExecID != "e1" {
		t.Errorf("denial %v does not list the allowed commands", d)
	}
	if err := e.Exec(c, execOf("/app", "healthcheck")); err != nil {
		t.Fatal(err)
	}
	if err := e.Exec(c, execOf("cat", "/tmp/status")); err != nil {
		t.Fatalf("an argv matching the list's pattern: %v", err)
	}
	denied(t, e.Exec(c, execOf("cat", "/etc/app/db")), "process.args", "policy.containers.app.exec")
	denied(t, e.Exec(c, execOf("/app")), "process.args", "policy.containers.app.exec")

	// Allowed argv, but more power than the container has.
	x := execOf("/app", "healthcheck")
	x.Process.Capabilities = caps(append(policyapi.DefaultCapabilities, "CAP_SYS_ADMIN")...)
	denied(t, e.Exec(c, x), "process.capabilities.bounding", "policy.containers.app.capabilities")
	x = execOf("/app", "healthcheck")
	x.Process.Env = append(x.Process.Env, "LD_PRELOAD=/tmp/x.so")
	denied(t, e.Exec(c, x), "process.env[4]", "policy.containers.app.env")
	x = execOf("/app", "healthcheck")
	x.Process.User.UID = 0
	denied(t, e.Exec(c, x), "process.user.uid", "policy.containers.app.exec_uid")

	// Stdin or a terminal only under exec_stdin; a terminal's TERM passes.
	x = execOf("/app", "healthcheck")
	x.Stdin = true
	denied(t, e.Exec(c, x), "stdio.stdin", "policy.containers.app.exec_stdin")
	e, c = app(t, "logs = true", "logs = true\nexec_stdin = true")
	x.Terminal = true
	x.Process.Env = append(x.Process.Env, "TERM=xterm")
	if err := e.Exec(c, x); err != nil {
		t.Fatal(err)
	}

	// A sandbox has no exec list.
	sb := sandbox(t, e)
	denied(t, e.Exec(sb, &Exec{Process: &specs.Process{Args: []string{"/pause"}}}), "process.args", "policy.sandbox.exec")
}

// An exec runs where the container runs, as its user: the host cannot
// point an allowed argv's relative paths (python app.py) at a directory
// it writes, nor run it as root, unless the rule says so.
func TestMaliciousHostExecCwdUser(t *testing.T) {
	e, c := app(t)
	x := execOf("/app", "healthcheck")
	x.Process.Cwd = "/var/run/secrets/kubernetes.io/serviceaccount" // a share the host writes
	d := denied(t, e.Exec(c, x), "process.cwd", "policy.containers.app.exec_working_dir")
	if !strings.Contains(d.Error(), `(allowed: "/" (the container's working directory; the rule has no exec_working_dir))`) {
		t.Errorf("denial %v: want the container's cwd named", d)
	}
	x = execOf("/app", "healthcheck")
	x.Process.User.GID = 0
	denied(t, e.Exec(c, x), "process.user.gid", "policy.containers.app.exec_gid")

	// What the host leaves out is the container's: then allowed.
	x = execOf("/app", "healthcheck")
	x.Process.Cwd, x.Process.User = "", specs.User{}
	c.ExecDefaults(x.Process, false)
	if x.Process.Cwd != "/" || x.Process.User.UID != 1000 || x.Process.User.GID != 1000 {
		t.Fatalf("ExecDefaults gave cwd %q, user %+v: want the container's", x.Process.Cwd, x.Process.User)
	}
	if err := e.Exec(c, x); err != nil {
		t.Fatal(err)
	}
	// A user the host gave, root, is not replaced.
	x.Process.User = specs.User{}
	c.ExecDefaults(x.Process, true)
	denied(t, e.Exec(c, x), "process.user.uid", "policy.containers.app.exec_uid")

	// The rule may allow others.
	e, c = app(t, "logs = true", "logs = true\nexec_working_dir = \"re:/|/tmp\"\nexec_uid = 0\nexec_gid = 0")
	x = execOf("/app", "healthcheck")
	x.Process.Cwd, x.Process.User = "/tmp", specs.User{}
	if err := e.Exec(c, x); err != nil {
		t.Fatal(err)
	}
	x.Process.Cwd = "/cache"
	d = denied(t, e.Exec(c, x), "process.cwd", "policy.containers.app.exec_working_dir")
	if d.Expected != `"re:/|/tmp"` {
		t.Errorf("denial %v: want the rule's pattern", d)
	}
	x.Process.Cwd, x.Process.User.UID = "/", 1000
	denied(t, e.Exec(c, x), "process.user.uid", "policy.containers.app.exec_uid")
}

// A no-logs container's output does not reach the host; an allowed
// exec's does. Stdin is under the rule.
func TestMaliciousHostReadsNoLogsContainer(t *testing.T) {
	e, c := app(t, "logs = true", "logs = false")
	if c.OutputAllowed() {
		t.Fatal("the guest would keep a no-logs container's output for the host")
	}
	denied(t, e.ReadOutput(c, "", false), "stdout", "policy.containers.app.logs")
	d := denied(t, e.ReadOutput(c, "", true), "stderr", "policy.containers.app.logs")
	if d.Request != "ReadStderr" {
		t.Errorf("denial %v", d)
	}
	if err := e.ReadOutput(c, "e1", false); err != nil {
		t.Errorf("an exec's output: %v", err)
	}
	e, c = app(t)
	if err := e.ReadOutput(c, "", false); err != nil || !c.OutputAllowed() {
		t.Fatalf("logs = true: %v", err)
	}

	denied(t, e.WriteStdin(c, ""), "stdin", "policy.containers.app.stdin")
	denied(t, e.WriteStdin(c, "e1"), "stdin", "policy.containers.app.exec_stdin")
	e, c = app(t, "logs = true", "logs = true\nstdin = true\nexec_stdin = true")
	if e.WriteStdin(c, "") != nil || e.WriteStdin(c, "e1") != nil {
		t.Fatal("stdin refused under stdin = true, exec_stdin = true")
	}
}

// Signals beyond those that stop a container are refused; a rule can list
// its own.
func TestSignals(t *testing.T) {
	e, c := app(t)
	for _, sig := range []int{15, 9, 2} {
		if err := e.Signal(c, "", sig, false); err != nil {
			t.Errorf("signal %d: %v", sig, err)
		}
	}
	d := denied(t, e.Signal(c, "", 10, true), "signal (to all of the container's processes)", "policy.containers.app.signals")
	if d.Actual != "SIGUSR1 (10)" || !strings.Contains(d.Expected, "SIGTERM (15)") {
		t.Errorf("denial %v", d)
	}
	e, c = app(t, "logs = true", "logs = true\nsignals = [\"SIGHUP\", \"15\"]")
	if e.Signal(c, "", 1, false) != nil || e.Signal(c, "", 15, false) != nil {
		t.Fatal("a listed signal refused")
	}
	denied(t, e.Signal(c, "", 9, false), "signal", "policy.containers.app.signals")
}

// Stats and updates are allowed unless the policy turns them off.
func TestStatsAndUpdate(t *testing.T) {
	e, c := app(t)
	if e.Stats(c) != nil || e.ListPids(c) != nil || e.Update(c) != nil {
		t.Fatal("stats, pids or update refused by default")
	}
	e, c = app(t, "[policy]\n", "[policy]\nstats = false\nupdate_resources = false\n")
	denied(t, e.Stats(c), "stats", "policy.stats")
	denied(t, e.ListPids(c), "stats", "policy.stats")
	denied(t, e.Update(c), "resources", "policy.update_resources")
}

// A container that no rule governed at create (none can be, in a VM whose
// policy is in force from the start) is refused everything.
func TestUngovernedContainerUnderPolicy(t *testing.T) {
	e := evaluator(t, podPolicy)
	old, err := (*Evaluator)(nil).CreateContainer(&CreateContainer{ID: "old", Spec: appSpec()})
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{e.Exec(old, execOf("/app", "healthcheck")), e.ReadOutput(old, "", false), e.Signal(old, "", 15, false), e.Stats(old)} {
		denied(t, err, "container", "")
	}
}

// In audit mode every denial is reported and nothing refused; a container
// no rule names still gets no secret.
func TestAuditLogsInsteadOfEnforcing(t *testing.T) {
	p := parse(t, strings.Replace(podPolicy, "[policy]\n", "[policy]\naudit = true\n", 1))
	var got []*Denial
	e := New(p, func(d *Denial, enforced bool) {
		if enforced {
			t.Errorf("denial %v enforced in audit mode", d)
		}
		got = append(got, d)
	})
	s := appSpec()
	s.Process.Capabilities = caps(policyapi.AllCapabilities...)
	c, err := create(t, e, s)
	if err != nil || c == nil {
		t.Fatalf("audit: CreateContainer = %v", err)
	}
	if len(got) == 0 || got[0].Field != "process.capabilities.bounding" || !got[0].Audit {
		t.Fatalf("audit reported %v", got)
	}
	if err := e.Exec(c, execOf("sh")); err != nil {
		t.Fatal(err)
	}
	s = appSpec()
	s.Annotations[AnnotationContainerName] = "unnamed"
	c, err = create(t, e, s)
	if err != nil {
		t.Fatal(err)
	}
	if named, all := c.Secrets(); all || len(named) > 0 {
		t.Fatalf("an unnamed container got secrets in audit mode: %v %v", named, all)
	}
	if !c.OutputAllowed() {
		t.Error("audit mode must keep output readable")
	}
	if !strings.Contains(got[len(got)-1].Error(), "unnamed") {
		t.Errorf("last audit denial %v", got[len(got)-1])
	}
}
