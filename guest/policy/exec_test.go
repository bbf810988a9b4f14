package policy

import (
	"strings"
	"testing"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// An ambient or inheritable capability set is refused, on a create and
// on an exec: with it a process that is not root keeps capabilities the
// rule's uid would not have (crun raises the ambient set at exec).
func TestMaliciousHostAmbientCapabilities(t *testing.T) {
	d := policyapi.DefaultCapabilities
	for _, set := range []string{"ambient", "inheritable"} {
		e, c := app(t)
		x := execOf("/app", "healthcheck")
		x.Process.Capabilities = caps(d...)
		s := appSpec()
		switch set {
		case "ambient":
			x.Process.Capabilities.Ambient = d
			s.Process.Capabilities.Ambient = d
		case "inheritable":
			x.Process.Capabilities.Inheritable = d
			s.Process.Capabilities.Inheritable = d
		}
		got := denied(t, e.Exec(c, x), "process.capabilities."+set, "")
		if got.Reason != "never allowed" {
			t.Errorf("%s: denial %v, want never allowed", set, got)
		}
		_, err := create(t, evaluator(t, podPolicy), s)
		denied(t, err, "process.capabilities."+set, "")
	}
	// Even one capability the rule allows, and even to a privileged rule.
	e := evaluator(t, strings.Replace(podPolicy, "no_new_privileges = true", "privileged = true", 1))
	s := appSpec()
	s.Process.Capabilities.Ambient = []string{"CAP_NET_BIND_SERVICE"}
	_, err := create(t, e, s)
	denied(t, err, "process.capabilities.ambient", "")
}

// An exec is no more than another process of its container: the
// capabilities, no_new_privileges and supplementary groups containerd's
// CRI copies from the container's process, the host cannot raise for an
// exec alone, even within what the rule would allow a container.
func TestMaliciousHostExecBeyondContainer(t *testing.T) {
	// The container was created with fewer capabilities than its rule
	// allows (securityContext drop: ALL).
	e := evaluator(t, podPolicy)
	s := appSpec()
	s.Process.Capabilities = caps("CAP_NET_BIND_SERVICE")
	c, err := create(t, e, s)
	if err != nil {
		t.Fatal(err)
	}
	x := execOf("/app", "healthcheck")
	x.Process.Capabilities = caps("CAP_NET_BIND_SERVICE")
	if err := e.Exec(c, x); err != nil {
		t.Fatalf("an exec with the container's capabilities: %v", err)
	}
	x.Process.Capabilities = caps(policyapi.DefaultCapabilities...)
	got := denied(t, e.Exec(c, x), "process.capabilities.bounding", "")
	if !strings.Contains(got.Expected, "CAP_NET_BIND_SERVICE") || strings.Contains(got.Actual, "CAP_NET_BIND_SERVICE") {
		t.Errorf("denial %v: want the container's set expected and only the extra ones named", got)
	}
	denied(t, e.Exec(c, x), "process.capabilities.effective", "")
	// Created with none (no capabilities at all): an exec gets none.
	s = appSpec()
	s.Process.Capabilities = nil
	if c, err = create(t, e, s); err != nil {
		t.Fatal(err)
	}
	x.Process.Capabilities = caps("CAP_CHOWN")
	denied(t, e.Exec(c, x), "process.capabilities.permitted", "")
	x.Process.Capabilities = nil // crun: the container's
	if err := e.Exec(c, x); err != nil {
		t.Fatalf("an exec naming no capabilities: %v", err)
	}

	// no_new_privileges the container had, though the rule does not
	// require it.
	e = evaluator(t, strings.Replace(podPolicy, "no_new_privileges = true\n", "", 1))
	if c, err = create(t, e, appSpec()); err != nil {
		t.Fatal(err)
	}
	x = execOf("/app", "healthcheck")
	x.Process.NoNewPrivileges = false
	denied(t, e.Exec(c, x), "process.noNewPrivileges", "")

	// Supplementary groups: the container's when the rule pins none.
	e, c = app(t)
	x = execOf("/app", "healthcheck")
	x.Process.User.AdditionalGids = []uint32{0, 42}
	got = denied(t, e.Exec(c, x), "process.user.additionalGids", "policy.containers.app.additional_gids")
	if !strings.Contains(got.Expected, "the container's") {
		t.Errorf("denial %v: want the container's groups named", got)
	}
	s = appSpec()
	s.Process.User.AdditionalGids = []uint32{2000}
	if c, err = create(t, e, s); err != nil {
		t.Fatal(err)
	}
	x.Process.User.AdditionalGids = []uint32{2000}
	if err := e.Exec(c, x); err != nil {
		t.Fatalf("an exec with the container's groups: %v", err)
	}
	s.Process.User.AdditionalGids[0] = 0 // the container's copy is its own
	if err := e.Exec(c, x); err != nil {
		t.Fatalf("the container's groups changed after its create: %v", err)
	}
	x.Process.User.AdditionalGids = nil
	denied(t, e.Exec(c, x), "process.user.additionalGids", "")
}

// An exec carries the rule's required env entries too: a process left
// without APP_TLS_VERIFY=1 or SSL_CERT_FILE would run on its defaults
// (crun gives the container's env only to an exec with none).
func TestMaliciousHostExecDropsRequiredEnv(t *testing.T) {
	e, c := app(t)
	x := execOf("/app", "healthcheck")
	x.Process.Env = []string{"HOSTNAME=app-7d9f8c6b5-x2k4q"} // no PATH=/usr/bin:/bin
	got := denied(t, e.Exec(c, x), "process.env", "policy.containers.app.env")
	if got.Reason != "missing, required" || got.Actual != `"PATH=/usr/bin:/bin"` {
		t.Errorf("denial %v: want the missing entry named", got)
	}
	x.Process.Env = nil
	denied(t, e.Exec(c, x), "process.env", "policy.containers.app.env")

	// kubectl exec -it: containerd's CRI replaces the container's TERM
	// (the image's TERM=linux) with TERM=xterm; only a terminal's.
	e = evaluator(t, strings.Replace(strings.Replace(podPolicy, `"PATH=/usr/bin:/bin",`, `"PATH=/usr/bin:/bin", "TERM=linux",`, 1), "logs = true", "logs = true\nexec_stdin = true", 1))
	s := appSpec()
	s.Process.Env = append(s.Process.Env, "TERM=linux")
	c, err := create(t, e, s)
	if err != nil {
		t.Fatal(err)
	}
	x = execOf("/app", "healthcheck")
	x.Process.Env = []string{"PATH=/usr/bin:/bin", "HOSTNAME=app-7d9f8c6b5-x2k4q", "TERM=xterm"}
	x.Terminal = true
	if err := e.Exec(c, x); err != nil {
		t.Fatalf("a terminal exec with CRI's TERM: %v", err)
	}
	x.Terminal = false
	denied(t, e.Exec(c, x), "process.env", "policy.containers.app.env")
}

// A resize sends SIGWINCH to the terminal's foreground processes: the
// container's own only when it takes the host's input or its rule lists
// SIGWINCH; an exec's terminal was allowed with it.
func TestMaliciousHostResizesTerminal(t *testing.T) {
	e, c := app(t, "logs = true", "logs = true\ntty = true")
	denied(t, e.Resize(c, ""), "terminal size", "policy.containers.app.stdin")
	if err := e.Resize(c, "e1"); err != nil {
		t.Fatalf("an exec's terminal: %v", err)
	}
	for _, extra := range []string{"stdin = true", `signals = ["SIGTERM", "SIGWINCH"]`} {
		e, c = app(t, "logs = true", "logs = true\ntty = true\n"+extra)
		if err := e.Resize(c, ""); err != nil {
			t.Errorf("%s: %v", extra, err)
		}
	}
}
