// Package policy evaluates the requests of the untrusted host to the
// guest agent against the pod's measured policy (the [policy] section of
// its init data, schema in guest/api/policy). It is pure: typed requests
// in, a typed decision out, no I/O; the agent (guest/agent) builds the
// requests and acts on the decisions.
//
// A denial is a *Denial naming the request, the container, the offending
// field with what the host asked for, the rule and what it allows, for
// example
//
//	policy: CreateContainer "app": mounts[3].source "/run/c8s/secrets": not allowed by policy.containers.app.mounts (allowed: /cache (tmpfs); the standard mounts)
//
// It wraps errdefs.ErrPermissionDenied, so that it reaches the host as
// PermissionDenied. A CreateContainer that breaks several rules gets them
// all (Denials), so that a policy can be fixed in one round.
//
// CreateContainer is checked on the spec the guest will run: the host's
// spec after guest/spec adapted it (namespace paths replaced by the
// sandbox's, hooks and LSM labels dropped, host files replaced by guest
// copies, host paths by their virtio-fs shares, missing sources dropped).
// The host writes the input, so a check of it would judge a document the
// guest then changes; the adapted spec is what runc is given.
//
// A nil *Evaluator, or one without a policy, allows everything: a pod
// whose init data has no [policy] section keeps the agent's earlier
// behaviour. In audit mode (policy.audit) denials are reported to the
// evaluator's OnDenial and the requests allowed. A built-in policy
// (policyapi.ZeroLaunchDefault) has a default rule for the containers no
// other rule names, and its denials say why it is in force.
//
// Every field of the OCI spec (runtime-spec v1.2.1) the host writes is
// either pinned or bounded by the rule, or fixed by the guest whatever
// the host asks (guest/spec), or refused:
//
//	field                              decision
//	process.args, env, cwd             pinned (args, env, working_dir)
//	process.user.uid, gid              pinned (uid, gid)
//	process.user.additionalGids        pinned by additional_gids (policygen writes it
//	                                   from the image's /etc/group, supplementalGroups
//	                                   and fsGroup); absent: an exec's the container's
//	process.user.umask                 pinned by umask; absent: 022 or stricter
//	process.capabilities               bounded (capabilities, privileged); inheritable
//	                                   and ambient refused; an exec's within the
//	                                   container's
//	process.noNewPrivileges            required by no_new_privileges; an exec's if
//	                                   the container's
//	process.rlimits                    bounded: each type the rule's rlimits (absent:
//	                                   RLIMIT_NOFILE ≤ 1048576) name, hard ≤ max;
//	                                   RLIMIT_CORE fixed to 0 (guest/spec)
//	process.oomScoreAdj                bounded: -998 (the kubelet's lowest) to 1000
//	process.scheduler                  bounded: SCHED_OTHER, BATCH or IDLE, nice ≥ 0
//	process.ioPriority                 bounded: IOPRIO_CLASS_BE or IDLE
//	process.execCPUAffinity            the host's (it schedules the VM's CPUs anyway)
//	process.apparmorProfile,           stripped (guest/spec): the guest kernel loads
//	  selinuxLabel, linux.mountLabel   no LSM policy; capabilities, namespaces and
//	                                   seccomp confine the container
//	process.terminal, consoleSize      the agent's (the stdio request); a
//	                                   terminal only under tty
//	process.commandLine                refused (Windows)
//	root.readonly                      required by read_only_root
//	root.path, linux.cgroupsPath       fixed by the guest
//	mounts                             bounded by source kind (mounts, StandardMounts);
//	                                   an emptyDir by its volume name (volume) and to
//	                                   the VM's one pod; uid/gid mappings as below
//	hooks, annotations (non-CRI)       stripped (guest/spec)
//	linux.namespaces pid, network,     the container's own or the sandbox's, the VM's
//	  ipc, uts, mount                  only by vm_namespaces
//	linux.namespaces cgroup            the runtime's (cgroupfs is read-only unless
//	                                   privileged)
//	linux.namespaces user,             refused unless user_namespace; then no mapping
//	  uid/gidMappings                  of the guest's root (id 0)
//	linux.namespaces time              allowed fresh; linux.timeOffsets refused
//	linux.maskedPaths, readonlyPaths   required (masked_paths, readonly_paths)
//	linux.sysctl                       bounded (sysctls)
//	linux.devices, resources.devices   the agent's device policy (agent_policy)
//	linux.resources (other)            the host's (policy.update_resources): it sizes
//	                                   the VM anyway; cpusets within online CPUs
//	linux.seccomp                      normalized (NOTIFY, TRACE, ERRNO(0) refused);
//	                                   the profile itself is the host's: not pinned
//	linux.rootfsPropagation            fixed to rprivate (guest/spec)
//	linux.personality                  refused but LINUX without flags
//	linux.intelRdt                     refused
//	linux.memoryPolicy, netDevices     not in v1.2.1: dropped when the agent rewrites
//	                                   the spec it parsed
//	hostname, domainname               the host's (it names the pod anyway)
//
// The pod network the host sends with the sandbox's create is checked by
// PodNetwork against [policy.network] (policyapi.Network), and the
// nameservers of each container's /etc/resolv.conf by its dns.
package policy

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// The CRI annotations (containerd 2.x, internal/cri/annotations) by which
// a container is matched to its rule.
const (
	AnnotationContainerType    = "io.kubernetes.cri.container-type"
	AnnotationContainerName    = "io.kubernetes.cri.container-name"
	AnnotationImageName        = "io.kubernetes.cri.image-name"
	AnnotationSandboxImageName = "io.kubernetes.cri.podsandbox.image-name"

	ContainerTypeSandbox   = "sandbox"
	ContainerTypeContainer = "container"
)

// Evaluator decides host requests under one pod's policy.
type Evaluator struct {
	p        *policyapi.Policy
	onDenial func(d *Denial, enforced bool)

	// reported are the denials passed to onDenial, so that one the host
	// repeats (a read loop, the kubelet's stats polling) is reported
	// once.
	mu       sync.Mutex
	reported map[string]bool
	// sandbox is the id of the container the policy admitted as the
	// pod's sandbox: a VM runs one pod, so one sandbox (CreateContainer).
	sandbox string
	// podUID is the pod whose emptyDir volumes the VM holds (volumes.go).
	podUID string
	// podHostname and podAddrs are the hostname and interface addresses
	// the claimed sandbox was wired with (PodWired), where /etc/hosts may
	// name the pod's hostname (dns.go).
	podHostname string
	podAddrs    []netip.Addr
}

// maxReported bounds reported: past it, repeats are reported again.
const maxReported = 4096

// New returns the evaluator of p (nil: allow everything). onDenial, if
// set, is called with every denial, enforced or, in audit mode, not.
func New(p *policyapi.Policy, onDenial func(d *Denial, enforced bool)) *Evaluator {
	return &Evaluator{p: p, onDenial: onDenial}
}

// Governs reports whether a policy is in force.
func (e *Evaluator) Governs() bool { return e != nil && e.p != nil }

// Audit reports whether denials are only logged.
func (e *Evaluator) Audit() bool { return e.Governs() && e.p.Audit }

// decide reports denials and returns them as an error unless in audit
// mode.
func (e *Evaluator) decide(ds []*Denial) error {
	if len(ds) == 0 {
		return nil
	}
	audit := e.Audit()
	for _, d := range ds {
		d.Audit = audit
		if e.p != nil && e.p.Explain != "" && !strings.HasSuffix(d.Hint, e.p.Explain) {
			d.Hint = strings.TrimPrefix(d.Hint+"; "+e.p.Explain, "; ")
		}
		if e.onDenial != nil && e.firstReport(d) {
			e.onDenial(d, !audit)
		}
	}
	if audit {
		return nil
	}
	if len(ds) == 1 {
		return ds[0]
	}
	return Denials(ds)
}

// firstReport reports whether d is new: not a repeat of one reported.
func (e *Evaluator) firstReport(d *Denial) bool {
	key := strings.Join([]string{d.Request, d.ContainerID, d.ExecID, d.Field, d.Actual, d.Rule}, "\x00")
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.reported[key] {
		return false
	}
	if e.reported == nil || len(e.reported) >= maxReported {
		e.reported = map[string]bool{}
	}
	e.reported[key] = true
	return true
}

// Identity is how the host names a container: by its spec's CRI
// annotations.
type Identity struct {
	// Type is the io.kubernetes.cri.container-type annotation: "sandbox",
	// "container", or "" for a container created outside CRI.
	Type string
	// Name is the CRI container name; for a container outside CRI, its id.
	Name string
	// Image is the image the annotations name.
	Image string
}

// IdentityOf returns the identity of container id with the spec
// annotations ann.
func IdentityOf(id string, ann map[string]string) Identity {
	switch t := ann[AnnotationContainerType]; t {
	case ContainerTypeSandbox:
		return Identity{Type: t, Name: ContainerTypeSandbox, Image: ann[AnnotationSandboxImageName]}
	case "":
		return Identity{Name: id, Image: ann[AnnotationImageName]}
	default:
		return Identity{Type: t, Name: ann[AnnotationContainerName], Image: ann[AnnotationImageName]}
	}
}

// Sandbox reports whether the container is the pod's sandbox.
func (i Identity) Sandbox() bool { return i.Type == ContainerTypeSandbox }

// Container is a container the evaluator let the host create: the rule it
// runs under, which later requests on it are checked against.
type Container struct {
	ID       string
	Identity Identity
	// rule is nil when no policy governs the container.
	rule  *policyapi.Container
	key   string
	audit bool
	// cwd and user are the container's process's, as created: what an
	// exec defaults to and is held to (ExecDefaults, Exec), as it is to
	// its capabilities (nil: the runtime's, which the rule bounded) and
	// no_new_privileges.
	cwd             string
	user            specs.User
	caps            *specs.LinuxCapabilities
	noNewPrivileges bool
}

// Governed reports whether a policy rule governs the container.
func (c *Container) Governed() bool { return c != nil && c.rule != nil }

// Rule is the key of the container's rule ("policy.containers.app"), or
// "" without one.
func (c *Container) Rule() string {
	if !c.Governed() {
		return ""
	}
	return c.key
}

// Secrets returns the [kbs] secrets to mount into the container: all of
// them (all) when no policy governs it, else those its rule names.
func (c *Container) Secrets() (named []policyapi.Secret, all bool) {
	if !c.Governed() {
		return nil, true
	}
	return c.rule.Secrets, false
}

// PodSandbox reports whether the container is the pod's sandbox as the
// policy admitted it: a sandbox container under a rule (policy.sandbox,
// or the default rule), not one audit mode let through without. Under a
// policy, the VM has at most one (Evaluator.CreateContainer).
func (c *Container) PodSandbox() bool {
	return c.Governed() && c.rule != noRule && c.Identity.Sandbox()
}

// OutputAllowed reports whether the container's stdout and stderr may
// reach the host, so that the guest buffers them; when not, it discards
// them, and ReadOutput refuses the host.
func (c *Container) OutputAllowed() bool { return !c.Governed() || c.rule.Logs || c.audit }

// Denial is one refused part of a host request.
type Denial struct {
	// Request is the agent call: "CreateContainer", "ExecProcess",
	// "ReadStdout", ...
	Request string
	// Container is the container's name under the policy ("app",
	// "sandbox"), ContainerID containerd's id for it; ExecID names an
	// exec process.
	Container, ContainerID, ExecID string
	// Field is what the host asked for: "mounts[3].source", "image",
	// "process.capabilities.bounding", "signal", ...
	Field string
	// Actual is the value the host asked for, as written in messages
	// (quoted strings); empty when the field has none.
	Actual string
	// Reason says why: "not allowed" unless set.
	Reason string
	// Rule is the policy key that decided: "policy.containers.app.mounts".
	Rule string
	// Expected is what the rule allows; empty when it allows nothing.
	Expected string
	// Hint suggests the likely cause or the fix.
	Hint string
	// Audit is set when the denial was only logged (policy.audit).
	Audit bool
}

func (d *Denial) Error() string {
	var b strings.Builder
	b.WriteString("policy: ")
	b.WriteString(d.Request)
	if d.Container != "" {
		fmt.Fprintf(&b, " %q", d.Container)
	}
	if d.ContainerID != "" && d.ContainerID != d.Container {
		fmt.Fprintf(&b, " (container %s)", shortID(d.ContainerID))
	}
	if d.ExecID != "" {
		fmt.Fprintf(&b, " exec %q", d.ExecID)
	}
	b.WriteString(": ")
	b.WriteString(d.Field)
	if d.Actual != "" {
		b.WriteString(" ")
		b.WriteString(d.Actual)
	}
	reason := d.Reason
	if reason == "" {
		reason = "not allowed"
	}
	fmt.Fprintf(&b, ": %s", reason)
	if d.Rule != "" {
		fmt.Fprintf(&b, " by %s", d.Rule)
	}
	if d.Expected != "" {
		fmt.Fprintf(&b, " (allowed: %s)", d.Expected)
	} else if d.Rule != "" && d.Reason == "" {
		b.WriteString(" (allowed: none)")
	}
	if d.Hint != "" {
		fmt.Fprintf(&b, "; %s", d.Hint)
	}
	return b.String()
}

// Unwrap makes a denial an errdefs.ErrPermissionDenied.
func (d *Denial) Unwrap() error { return errdefs.ErrPermissionDenied }

// Denials are the denials of one request.
type Denials []*Denial

func (ds Denials) Error() string {
	msgs := make([]string, len(ds))
	for i, d := range ds {
		msgs[i] = d.Error()
		if i > 0 {
			msgs[i] = strings.TrimPrefix(msgs[i], "policy: ")
		}
	}
	return fmt.Sprintf("%s (%d denials)", strings.Join(msgs, "; "), len(ds))
}

// Unwrap returns each denial.
func (ds Denials) Unwrap() []error {
	out := make([]error, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// quoted writes values as messages show them.
func quoted(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = fmt.Sprintf("%q", v)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// maxListed bounds the allowed values a message lists.
const maxListed = 12

// listed writes a list of allowed values, cut after maxListed.
func listed(vs []string) string {
	if len(vs) == 0 {
		return ""
	}
	if len(vs) > maxListed {
		return strings.Join(vs[:maxListed], ", ") + fmt.Sprintf(", … (%d more)", len(vs)-maxListed)
	}
	return strings.Join(vs, ", ")
}

// ruleFor returns the rule and its key for a container identity, or a
// denial.
func (e *Evaluator) ruleFor(req, id string, who Identity) (*policyapi.Container, string, *Denial) {
	d := &Denial{Request: req, Container: who.Name, ContainerID: id}
	switch who.Type {
	case ContainerTypeSandbox:
		if e.p.Sandbox == nil && e.p.Default != nil {
			return e.p.Default, e.defaultKey(), nil
		}
		if e.p.Sandbox == nil {
			d.Field, d.Actual, d.Rule = AnnotationContainerType, `"sandbox"`, "policy.sandbox"
			d.Reason, d.Hint = "no rule", "the policy has no [policy.sandbox] for the pod's sandbox container"
			return nil, "", d
		}
		return e.p.Sandbox, "policy.sandbox", nil
	case "", ContainerTypeContainer:
		if r := e.p.Containers[who.Name]; r != nil {
			return r, "policy.containers." + tomlKey(who.Name), nil
		}
		if e.p.Default != nil {
			return e.p.Default, e.defaultKey(), nil
		}
		names := make([]string, 0, len(e.p.Containers))
		for n := range e.p.Containers {
			names = append(names, fmt.Sprintf("%q", n))
		}
		sort.Strings(names)
		d.Field = AnnotationContainerName
		if who.Type == "" {
			d.Field = "container id (no CRI annotations)"
		}
		d.Actual, d.Rule, d.Expected = fmt.Sprintf("%q", who.Name), "policy.containers", listed(names)
		d.Reason = "no rule names this container"
		return nil, "", d
	default:
		d.Field, d.Actual = AnnotationContainerType, fmt.Sprintf("%q", who.Type)
		d.Reason, d.Expected = "not a CRI container type", `"sandbox", "container"`
		return nil, "", d
	}
}

// defaultKey is the key of the policy's default rule: the built-in
// policy's name.
func (e *Evaluator) defaultKey() string {
	if e.p.Builtin != "" {
		return e.p.Builtin
	}
	return "policy.default"
}

// tomlKey writes a container name as a key of policy.containers.
func tomlKey(k string) string {
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return fmt.Sprintf("%q", k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}
