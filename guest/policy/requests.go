package policy

import (
	"fmt"
	"slices"
	"strings"
	"syscall"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// The requests on a created container. Each takes the *Container that
// CreateContainer returned; one created while no policy was in force is
// allowed everything only if no policy is in force now.

// governed returns the container's rule and key, or a denial for a
// container that no rule governs under a policy in force (created before
// it, which requirePolicy in the agent does not let happen).
func (e *Evaluator) governed(req string, c *Container, execID string) (*policyapi.Container, *checker, error) {
	if !e.Governs() {
		return nil, nil, nil
	}
	k := &checker{req: req, exec: execID}
	if c == nil || c.rule == nil {
		id := ""
		if c != nil {
			id, k.name = c.ID, c.Identity.Name
		}
		k.id = id
		k.deny("container", "", "", "").Reason = "was created before the pod's policy was in force"
		return nil, nil, e.decide(k.ds)
	}
	k.name, k.id, k.key = c.Identity.Name, c.ID, c.key
	return c.rule, k, nil
}

// Exec is an ExecProcess request.
type Exec struct {
	ExecID string
	// Process is the exec's process as the guest will run it (after
	// guest/spec's AdaptProcess).
	Process *specs.Process
	// Stdin and Terminal are the stdio the host asks for.
	Stdin, Terminal bool
}

// ExecDefaults fills in what the host left out of an exec's process in a
// container a rule governs: the container's working directory for an
// empty cwd, and its user when the host's process has none (hasUser
// false). Exec then holds the process to them.
func (c *Container) ExecDefaults(p *specs.Process, hasUser bool) {
	if !c.Governed() || p == nil {
		return
	}
	if p.Cwd == "" {
		p.Cwd = c.cwd
	}
	if !hasUser {
		p.User = c.user
		p.User.AdditionalGids = slices.Clone(c.user.AdditionalGids)
	}
}

// Exec decides whether the host may run the process in container c: its
// argv must be on the rule's exec list; its cwd, uid and gid must be the
// container's (what it was created with), unless the rule's
// exec_working_dir, exec_uid or exec_gid allow others; its capabilities,
// no-new-privileges and (unless the rule pins them) supplementary groups
// the container's (execHeld); the rest of it (env, limits) as the
// container's rule allows.
func (e *Evaluator) Exec(c *Container, r *Exec) error {
	rule, k, err := e.governed("ExecProcess", c, r.ExecID)
	if rule == nil {
		return err
	}
	if r.Process == nil {
		k.deny("process", "", "", "").Reason = "missing"
		return e.decide(k.ds)
	}
	if !slices.ContainsFunc(rule.Exec, func(argv []policyapi.Pattern) bool { return policyapi.MatchList(argv, r.Process.Args) }) {
		allowed := make([]string, len(rule.Exec))
		for i, argv := range rule.Exec {
			allowed[i] = quoted(policyapi.Strings(argv))
		}
		d := k.deny("process.args", quoted(r.Process.Args), k.key+".exec", listed(allowed))
		if len(rule.Exec) == 0 {
			d.Hint = "the container's rule lists no command the host may exec"
		}
	}
	k.process(rule, r.Process, true, r.Terminal)
	k.execHeld(c, r.Process) // process.go
	uid, gid := c.user.UID, c.user.GID
	k.workingDir(r.Process.Cwd, rule.ExecWorkingDir, "exec_working_dir", c.cwd)
	k.id32("process.user.uid", r.Process.User.UID, rule.ExecUID, "exec_uid", &uid)
	k.id32("process.user.gid", r.Process.User.GID, rule.ExecGID, "exec_gid", &gid)
	if (r.Stdin || r.Terminal) && !rule.ExecStdin {
		field := "stdio.stdin"
		if r.Terminal {
			field = "stdio.terminal"
		}
		d := k.deny(field, "true", k.key+".exec_stdin", "")
		d.Reason, d.Hint = "not allowed", "stdin lets the host type commands into what it execs"
	}
	return e.decide(k.ds)
}

// ReadOutput decides whether the host may read a process's stdout (or
// stderr): a container's own only under logs = true; an exec's, since the
// exec was allowed, always.
func (e *Evaluator) ReadOutput(c *Container, execID string, stderr bool) error {
	req, field := "ReadStdout", "stdout"
	if stderr {
		req, field = "ReadStderr", "stderr"
	}
	rule, k, err := e.governed(req, c, execID)
	if rule == nil || execID != "" || rule.Logs {
		return err
	}
	d := k.deny(field, "", k.key+".logs", "")
	d.Reason, d.Hint = "not allowed", "the container's output does not leave the guest; the guest discards it"
	return e.decide(k.ds)
}

// WriteStdin decides whether the host may write to a process's stdin: a
// container's under stdin = true, an exec's under exec_stdin = true.
func (e *Evaluator) WriteStdin(c *Container, execID string) error {
	rule, k, err := e.governed("WriteStdin", c, execID)
	if rule == nil {
		return err
	}
	if execID == "" && !rule.Stdin {
		k.deny("stdin", "", k.key+".stdin", "").Reason = "not allowed"
	} else if execID != "" && !rule.ExecStdin {
		k.deny("stdin", "", k.key+".exec_stdin", "").Reason = "not allowed"
	}
	return e.decide(k.ds)
}

// Signal decides whether the host may send sig to a process of container
// c (with all, to each of its processes).
func (e *Evaluator) Signal(c *Container, execID string, sig int, all bool) error {
	rule, k, err := e.governed("SignalProcess", c, execID)
	if rule == nil {
		return err
	}
	allowed := rule.AllowedSignals()
	if slices.Contains(allowed, sig) {
		return nil
	}
	names := make([]string, len(allowed))
	for i, s := range allowed {
		names[i] = signalName(s)
	}
	field := "signal"
	if all {
		field = "signal (to all of the container's processes)"
	}
	d := k.deny(field, signalName(sig), k.key+".signals", strings.Join(names, ", "))
	if rule.Signals == nil {
		d.Expected += " (the defaults: the rule lists none)"
	}
	return e.decide(k.ds)
}

// Resize decides whether the host may resize a process's terminal, which
// sends SIGWINCH to the terminal's foreground processes (httpd stops
// gracefully on it, nginx stops its workers): an exec's, whose terminal
// exec_stdin allowed, always; the container's own only when it takes
// the host's input (stdin: kubectl attach, kubectl run -it) or its rule
// allows SIGWINCH.
func (e *Evaluator) Resize(c *Container, execID string) error {
	rule, k, err := e.governed("ResizePty", c, execID)
	if rule == nil || execID != "" || rule.Stdin || slices.Contains(rule.AllowedSignals(), int(unix.SIGWINCH)) {
		return err
	}
	d := k.deny("terminal size", "", k.key+".stdin", "")
	d.Reason = "not allowed"
	d.Hint = "a resize sends SIGWINCH to the container's foreground processes; the rule takes no input from the host (stdin) and lists no SIGWINCH (signals)"
	return e.decide(k.ds)
}

func signalName(sig int) string {
	if n := unix.SignalName(syscall.Signal(sig)); n != "" {
		return fmt.Sprintf("%s (%d)", n, sig)
	}
	return fmt.Sprint(sig)
}

// Stats decides whether the host may read container c's cgroup metrics.
func (e *Evaluator) Stats(c *Container) error { return e.stats("Stats", c) }

// ListPids decides whether the host may list container c's processes. It
// is policy.stats's: pids are allocated across the VM, so their numbers and
// their turnover tell the host when processes and threads start, in the
// container and around it, as the cgroup metrics would.
func (e *Evaluator) ListPids(c *Container) error { return e.stats("ListPids", c) }

// stats decides request req by policy.stats.
func (e *Evaluator) stats(req string, c *Container) error {
	rule, k, err := e.governed(req, c, "")
	if rule == nil || e.p.StatsAllowed() {
		return err
	}
	k.deny("stats", "", "policy.stats", "").Reason = "not allowed"
	return e.decide(k.ds)
}

// Update decides whether the host may change container c's cgroup limits.
func (e *Evaluator) Update(c *Container) error {
	rule, k, err := e.governed("UpdateContainer", c, "")
	if rule == nil || e.p.UpdateAllowed() {
		return err
	}
	k.deny("resources", "", "policy.update_resources", "").Reason = "not allowed"
	return e.decide(k.ds)
}
