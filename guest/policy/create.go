package policy

import (
	"fmt"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// CreateContainer is a CreateContainer request as the guest will carry it
// out.
type CreateContainer struct {
	// ID is containerd's container id.
	ID string
	// Spec is the spec the guest will run: the host's, adapted by
	// guest/spec, before the agent adds the pod's secrets.
	Spec *specs.Spec
	// MountKinds says what the source of each of Spec.Mounts is: file,
	// shared or guest for a bind, policyapi.FSKind of its type for
	// another mount ("" for a type no rule may allow).
	MountKinds []policyapi.MountKind
	// Joined is the container whose namespaces the spec joins (the one
	// the host named as the pod's sandbox), or nil.
	Joined *Container
	// SecretPaths are the pod's fetched secrets: the [[kbs.secrets]]
	// paths of each resource (one per entry: a document may list a
	// resource twice), where a rule that names the resource without a
	// path mounts it.
	SecretPaths map[string][]string
	// Terminal is the stdio the host asks for: a terminal.
	Terminal bool
	// MeshDir is where the agent binds the pod's mesh files (certificate,
	// key, trust bundle) in the containers MeshInto names; empty without
	// a mesh.
	MeshDir  string
	MeshInto []string
	// Root is the container's root file system as the host asks for it:
	// a disk the host built, or image layers (layers.go).
	Root Root
	// Files are the contents of the host files passed by value, by the
	// guest path the spec binds (for [policy.network] dns: the
	// container's /etc/resolv.conf).
	Files map[string][]byte
}

// noRule governs a container that no rule names but that audit mode let
// through: every later request on it is a denial, and it gets no secret.
var noRule = &policyapi.Container{}

// CreateContainer decides whether the host may create the container, and
// returns what later requests on it are checked against.
func (e *Evaluator) CreateContainer(r *CreateContainer) (*Container, error) {
	var ann map[string]string
	if r.Spec != nil {
		ann = r.Spec.Annotations
	}
	c := &Container{ID: r.ID, Identity: IdentityOf(r.ID, ann)}
	if !e.Governs() {
		return c, nil
	}
	c.audit = e.p.Audit
	rule, key, d := e.ruleFor("CreateContainer", r.ID, c.Identity)
	if d != nil {
		if err := e.decide([]*Denial{d}); err != nil {
			return nil, err
		}
		c.rule, c.key = noRule, "policy.containers."+tomlKey(c.Identity.Name)
		if c.Identity.Sandbox() {
			c.key = "policy.sandbox"
		}
		return c, nil
	}
	c.rule, c.key = rule, key
	if r.Spec != nil && r.Spec.Process != nil {
		p := r.Spec.Process
		c.cwd, c.user, c.noNewPrivileges = p.Cwd, p.User, p.NoNewPrivileges
		c.user.AdditionalGids = slices.Clone(p.User.AdditionalGids)
		if p.Capabilities != nil {
			caps := *p.Capabilities
			c.caps = &caps
		}
	}
	k := &checker{req: "CreateContainer", name: c.Identity.Name, id: r.ID, key: key}
	if !rule.Image.Match(c.Identity.Image) {
		annotation := AnnotationImageName
		if c.Identity.Sandbox() {
			annotation = AnnotationSandboxImageName
		}
		k.deny("image", fmt.Sprintf("%q", c.Identity.Image), key+".image", fmt.Sprintf("%q", rule.Image)).
			Hint = "the image is the spec's " + annotation + " annotation"
	}
	if r.Spec == nil || r.Spec.Process == nil {
		k.deny("process", "", "", "").Reason = "missing"
		return nil, e.decide(k.ds)
	}
	k.process(rule, r.Spec.Process, false, false)
	if r.Terminal && !rule.TTY {
		d := k.deny("stdio.terminal", "true", k.key+".tty", "")
		d.Reason = "not allowed"
		d.Hint = "the pod spec's container has no tty: on a terminal the host's stdin is typed input, whose ^C, ^\\ and ^Z signal the container's processes"
	}
	k.root(rule, r.Spec)
	k.paths(rule, r.Spec.Linux)
	k.namespaces(rule, r.Spec.Linux, r.Joined)
	k.linux(rule, r.Spec) // process.go
	k.mounts(rule, r.Spec.Mounts, r.MountKinds)
	meshDir := ""
	if slices.Contains(r.MeshInto, c.Identity.Name) {
		meshDir = r.MeshDir
	}
	k.belowShared(rule, r.Spec.Mounts, r.MountKinds, r.SecretPaths, meshDir, nil)
	k.sysctls(rule, r.Spec.Linux)
	if !k.pullRoot(rule, r.Root) {
		k.layers(rule, r.Root)
	}
	e.dns(k, r.Spec, r.MountKinds, r.Files)                        // dns.go
	e.emptyDirPod(k, c.Identity, ann, r.Spec.Mounts, r.MountKinds) // volumes.go
	if c.Identity.Sandbox() {
		e.claimSandbox(k, r.ID)
	}
	if err := e.decide(k.ds); err != nil {
		return nil, err
	}
	return c, nil
}

// claimSandbox makes container id the pod's one sandbox, unless another
// is: a VM runs one pod, whose containers join its sandbox's namespaces
// and whose ports port-forward reaches, so a second sandbox (in a network
// namespace of the host's choosing) is refused. A create the checks
// refused does not claim it; one that fails later gives it back
// (ReleaseSandbox).
func (e *Evaluator) claimSandbox(k *checker, id string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sandbox != "" && e.sandbox != id {
		d := k.deny(AnnotationContainerType, `"sandbox"`, "policy.sandbox", "")
		d.Reason = fmt.Sprintf("a second sandbox container: %q is the pod's sandbox already", e.sandbox)
		d.Hint = "a pod VM runs one pod, and one sandbox whose namespaces its containers join and port-forward reaches"
		return
	}
	if len(k.ds) == 0 || e.Audit() {
		e.sandbox = id
	}
}

// ReleaseSandbox gives back the pod's sandbox claim of c, whose create
// failed after the policy admitted it, so that the host may create the
// sandbox again.
func (e *Evaluator) ReleaseSandbox(c *Container) {
	if !e.Governs() || c == nil || !c.Identity.Sandbox() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sandbox == c.ID {
		e.sandbox = ""
		e.podHostname, e.podAddrs = "", nil
	}
}

// checker collects the denials of one request.
type checker struct {
	req, name, id, exec string
	// key is the rule's key, "policy.containers.app".
	key string
	ds  []*Denial
}

func (k *checker) deny(field, actual, rule, expected string) *Denial {
	d := &Denial{Request: k.req, Container: k.name, ContainerID: k.id, ExecID: k.exec,
		Field: field, Actual: actual, Rule: rule, Expected: expected}
	k.ds = append(k.ds, d)
	return d
}

// capHints say what a capability gives a container in the pod VM.
var capHints = map[string]string{
	"CAP_SYS_ADMIN":       "CAP_SYS_ADMIN is most of root: mounts, namespaces, leaving the device cgroup",
	"CAP_SYS_PTRACE":      "CAP_SYS_PTRACE lets a process read and write the memory of every process it sees",
	"CAP_SYS_MODULE":      "CAP_SYS_MODULE loads code into the guest kernel",
	"CAP_SYS_RAWIO":       "CAP_SYS_RAWIO opens raw memory and disks",
	"CAP_DAC_READ_SEARCH": "CAP_DAC_READ_SEARCH opens any file by handle, outside the container's root",
	"CAP_NET_ADMIN":       "CAP_NET_ADMIN reconfigures the pod's network",
	"CAP_BPF":             "CAP_BPF loads programs into the guest kernel",
}

// process checks a container's or an exec's process. An exec's argv is
// checked against the exec list by the caller, and what it must share
// with the container's process by Exec; its env may add TERM=xterm with
// a terminal (containerd's CRI gives an exec the container's env, and
// that).
func (k *checker) process(rule *policyapi.Container, p *specs.Process, exec, terminal bool) {
	if !exec && !rule.AnyArgs && !policyapi.MatchList(rule.Args, p.Args) {
		k.deny("process.args", quoted(p.Args), k.key+".args", quoted(policyapi.Strings(rule.Args)))
	}
	if p.CommandLine != "" {
		k.deny("process.commandLine", fmt.Sprintf("%q", p.CommandLine), "", "").Reason = "not allowed (Windows only)"
	}
	allowedEnv := listed(policyapi.Strings(rule.Env))
	first := map[string]int{} // the index of each name's first entry
	for i, env := range p.Env {
		name, _, _ := strings.Cut(env, "=")
		if j, dup := first[name]; dup {
			d := k.deny(fmt.Sprintf("process.env[%d]", i), fmt.Sprintf("%q", env), "", "")
			d.Reason = fmt.Sprintf("a second entry for %s (process.env[%d] is the first)", name, j)
			d.Hint = "the process would see only one of them (glibc and Go take the first, others the last), so the policy could not tell which"
			continue
		}
		first[name] = i
		if policyapi.MatchAny(rule.Env, env) || exec && terminal && env == "TERM=xterm" {
			continue
		}
		k.deny(fmt.Sprintf("process.env[%d]", i), fmt.Sprintf("%q", env), k.key+".env", allowedEnv)
	}
	// An exec too: containerd's CRI gives it the container's env, and
	// crun gives one with none the container's.
	for _, want := range rule.Env {
		if exec && terminal && strings.HasPrefix(string(want), "TERM=") && slices.Contains(p.Env, "TERM=xterm") {
			continue // containerd's CRI replaces a terminal exec's TERM
		}
		if !want.IsRegex() && !slices.Contains(p.Env, string(want)) {
			k.deny("process.env", fmt.Sprintf("%q", want), k.key+".env", "").Reason = "missing, required"
		}
	}
	// An exec's cwd, uid and gid are checked by Exec, against the
	// container's.
	if !exec {
		k.workingDir(p.Cwd, rule.WorkingDir, "working_dir", "")
		if !rule.AnyUser {
			k.id32("process.user.uid", p.User.UID, rule.UID, "uid", nil)
			k.id32("process.user.gid", p.User.GID, rule.GID, "gid", nil)
		}
	}
	if rule.AdditionalGIDs != nil && !sameSet(p.User.AdditionalGids, *rule.AdditionalGIDs) {
		k.deny("process.user.additionalGids", fmt.Sprint(p.User.AdditionalGids), k.key+".additional_gids", fmt.Sprint(*rule.AdditionalGIDs))
	}
	k.capabilities(rule, p.Capabilities) // process.go
	if rule.NoNewPrivileges && !p.NoNewPrivileges {
		k.deny("process.noNewPrivileges", "false", k.key+".no_new_privileges", "true")
	}
	k.limits(rule, p) // process.go
}

// workingDir checks process.cwd against want, the pattern of the rule's
// key; want nil (a rule Validate refused, or noRule) allows nothing, or
// what fallback says when it is set: the exec's default, the container's
// own cwd.
func (k *checker) workingDir(cwd string, want *policyapi.Pattern, key, fallback string) {
	if !cleanAbs(cwd) {
		// "/app/../tmp" would match re:/app(/.*)? and run elsewhere.
		d := k.deny("process.cwd", fmt.Sprintf("%q", cwd), k.key+"."+key, "a clean absolute path")
		d.Reason = "not a clean absolute path"
		return
	}
	if want != nil && want.Match(cwd) {
		return
	}
	if want == nil && fallback != "" {
		if cwd == fallback {
			return
		}
		d := k.deny("process.cwd", fmt.Sprintf("%q", cwd), k.key+"."+key, fmt.Sprintf("%q (the container's working directory; the rule has no %s)", fallback, key))
		d.Hint = "a process started elsewhere resolves the relative paths in its args there"
		return
	}
	expected := ""
	if want != nil {
		expected = fmt.Sprintf("%q", *want)
	}
	k.deny("process.cwd", fmt.Sprintf("%q", cwd), k.key+"."+key, expected)
}

// id32 checks a uid or gid against want, the value of the rule's key;
// want nil allows nothing, or fallback when set (an exec's default, the
// container's own).
func (k *checker) id32(field string, got uint32, want *uint32, key string, fallback *uint32) {
	switch {
	case want != nil && got == *want:
		return
	case want != nil:
		k.deny(field, strconv.FormatUint(uint64(got), 10), k.key+"."+key, strconv.FormatUint(uint64(*want), 10))
	case fallback != nil && got == *fallback:
		return
	case fallback != nil:
		k.deny(field, strconv.FormatUint(uint64(got), 10), k.key+"."+key, fmt.Sprintf("%d (the container's; the rule has no %s)", *fallback, key))
	default:
		k.deny(field, strconv.FormatUint(uint64(got), 10), k.key+"."+key, "")
	}
}

func sameSet(a, b []uint32) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	slices.Sort(x)
	slices.Sort(y)
	return slices.Equal(slices.Compact(x), slices.Compact(y))
}

func (k *checker) root(rule *policyapi.Container, s *specs.Spec) {
	if rule.ReadOnlyRoot && (s.Root == nil || !s.Root.Readonly) {
		k.deny("root.readonly", "false", k.key+".read_only_root", "true")
	}
}

// paths checks the masked and read-only paths.
func (k *checker) paths(rule *policyapi.Container, l *specs.Linux) {
	var masked, readonly []string
	if l != nil {
		masked, readonly = l.MaskedPaths, l.ReadonlyPaths
	}
	for _, p := range []struct {
		field, rule string
		have, want  []string
	}{
		{"linux.maskedPaths", "masked_paths", masked, rule.RequiredMaskedPaths()},
		{"linux.readonlyPaths", "readonly_paths", readonly, rule.RequiredReadonlyPaths()},
	} {
		var missing []string
		for _, w := range p.want {
			if !slices.Contains(p.have, w) {
				missing = append(missing, w)
			}
		}
		if len(missing) > 0 {
			d := k.deny(p.field, quoted(missing), k.key+"."+p.rule, "")
			d.Reason = "missing, required"
			d.Hint = "a container that is not privileged has them; a root process with /proc/sys writable runs code as the guest's root (core_pattern, modprobe)"
		}
		// More than the rule requires: only what runtimes add by
		// default. A masked secret or configuration reads as empty (an
		// empty password is no password to some servers), a read-only
		// data directory refuses writes.
		var extra []string
		for _, h := range p.have {
			known := slices.Contains(p.want, h)
			if p.field == "linux.maskedPaths" {
				known = known || policyapi.RuntimeMaskedPath(h)
			} else {
				known = known || slices.Contains(policyapi.DefaultReadonlyPaths, h)
			}
			if !known {
				extra = append(extra, h)
			}
		}
		if len(extra) > 0 {
			d := k.deny(p.field, quoted(extra), k.key+"."+p.rule, quoted(p.want))
			d.Reason = "beyond the rule's and the runtimes' defaults"
			d.Hint = "masking hides a file of the container (a secret or configuration reads as empty); list the path in the rule if the pod asks for it"
		}
	}
}

// nsHints say what sharing a namespace with the VM exposes.
var nsHints = map[string]string{
	"pid":     "in the VM's pid namespace a process sees the agent and every container's processes (hostPID)",
	"network": "the VM's network namespace (hostNetwork)",
	"ipc":     "the VM's IPC namespace (hostIPC)",
	"uts":     "the VM's UTS namespace: the container could rename the VM",
	"mount":   "the VM's mount namespace holds /run/c8s: the pod's secrets and every container's root",
}

// namespaces checks that each namespace is the container's own, or the
// pod sandbox's, or the VM's only where the rule allows it.
func (k *checker) namespaces(rule *policyapi.Container, l *specs.Linux, joined *Container) {
	var nss []specs.LinuxNamespace
	if l != nil {
		nss = l.Namespaces
	}
	for _, t := range policyapi.Namespaces {
		i := slices.IndexFunc(nss, func(ns specs.LinuxNamespace) bool { return string(ns.Type) == t })
		switch {
		case i < 0:
			if !slices.Contains(rule.VMNamespaces, t) {
				d := k.deny("linux.namespaces."+t, "the VM's (absent from the spec)", k.key+".vm_namespaces", quoted(rule.VMNamespaces))
				d.Hint = nsHints[t]
				if len(rule.VMNamespaces) == 0 {
					d.Expected = ""
				}
			}
		case nss[i].Path != "":
			if t == "pid" && !rule.SharePIDNamespace {
				d := k.deny(fmt.Sprintf("linux.namespaces[%d].path", i), fmt.Sprintf("%q", nss[i].Path), k.key+".share_pid_namespace", "")
				d.Reason = "joins the pod sandbox's pid namespace"
				d.Hint = "the pod does not share its process namespace (shareProcessNamespace): in the sandbox's a container sees the pod's other processes, their environment and roots through /proc"
				continue
			}
			if joined == nil || !joined.Identity.Sandbox() {
				who := "no container"
				if joined != nil {
					who = fmt.Sprintf("container %q, which is not the pod's sandbox", joined.Identity.Name)
				}
				d := k.deny(fmt.Sprintf("linux.namespaces[%d].path", i), fmt.Sprintf("%q", nss[i].Path), "", "")
				d.Reason = "joins " + who
				d.Hint = "a container may join only the namespaces of the pod's sandbox container"
			}
		}
	}
}

// mounts checks each mount against the rule's and the standard ones:
// destinations (and guest binds' sources) must be clean absolute paths,
// as rules match them as written, and read-only is the flag the runtime
// ends with (readOnly), not "ro" anywhere in the options.
func (k *checker) mounts(rule *policyapi.Container, ms []specs.Mount, kinds []policyapi.MountKind) {
	var allowed []string
	for _, m := range rule.Mounts {
		a := fmt.Sprintf("%s (%s", m.Destination, m.Kind)
		if m.Source != "" {
			a += " of " + m.Source
		}
		if m.Volume != "" {
			a += " volume " + string(m.Volume)
		}
		if m.ReadOnly {
			a += ", ro"
		}
		allowed = append(allowed, a+")")
	}
	allowed = append(allowed, "the standard mounts")
	expected := listed(allowed)
	for i, m := range ms {
		kind := policyapi.MountKind("")
		if i < len(kinds) {
			kind = kinds[i]
		}
		field := fmt.Sprintf("mounts[%d]", i)
		if !cleanAbs(m.Destination) {
			d := k.deny(field+".destination", fmt.Sprintf("%q", m.Destination), "", "")
			d.Reason = "not a clean absolute path"
			d.Hint = fmt.Sprintf("rules match destinations as written, and the runtime resolves %q to %q; CRI writes clean absolute paths", m.Destination, path.Join("/", m.Destination))
			continue
		}
		if kind == policyapi.KindGuest && !cleanAbs(m.Source) {
			d := k.deny(field+".source", fmt.Sprintf("%q", m.Source), "", "")
			d.Reason = "not a clean absolute path"
			d.Hint = "a guest bind's source is matched as written"
			continue
		}
		if kind == "" {
			d := k.deny(field+".type", fmt.Sprintf("%q", m.Type), "", "")
			d.Reason = "never allowed"
			d.Hint = fmt.Sprintf("a %q mount on %s: only bind mounts and the filesystems proc, sysfs, tmpfs, devpts, mqueue and cgroup are given to containers", m.Type, m.Destination)
			continue
		}
		ro := readOnly(m.Options)
		if slices.ContainsFunc(rule.Mounts, func(r policyapi.Mount) bool {
			return r.Kind == kind && r.Destination.Match(m.Destination) &&
				(kind != policyapi.KindGuest || r.Source == m.Source) && (!r.ReadOnly || ro) &&
				(kind != policyapi.KindEmptyDir || volumeMatch(r.Volume, m.Source))
		}) {
			continue
		}
		if std := standardMount(m.Destination, kind); std != nil {
			if !std.ReadOnly || ro || rule.Privileged {
				continue
			}
			d := k.deny(field+".options", quoted(m.Options), k.key+".privileged", "")
			d.Reason = fmt.Sprintf("read-write %s on %s needs a privileged container", kind, m.Destination)
			continue
		}
		switch kind {
		case policyapi.KindGuest:
			d := k.deny(field+".source", fmt.Sprintf("%q", m.Source), k.key+".mounts", expected)
			d.Hint = fmt.Sprintf("a bind of the guest's own %s on %s", m.Source, m.Destination)
			if under(m.Source, "/run/c8s") || m.Source == "/" || under(m.Source, "/dev") || under(m.Source, "/proc") || under(m.Source, "/sys") {
				d.Hint += ": guest-internal state (the pod's secrets, the containers' roots, devices, kernel interfaces)"
			}
		case policyapi.KindEmptyDir:
			d := k.deny(field, fmt.Sprintf("%q (emptydir volume %q)", m.Destination, path.Base(m.Source)), k.key+".mounts", expected)
			d.Hint = "an emptyDir is named by its volume: another container's, or one the pod spec does not mount here, would share its files"
		default:
			k.deny(field, fmt.Sprintf("%q (%s)", m.Destination, kind), k.key+".mounts", expected)
		}
	}
}

// cleanAbs reports whether p is absolute and clean: no "..", ".", "//"
// or trailing slash, so that a pattern matches the path the runtime uses.
func cleanAbs(p string) bool { return path.IsAbs(p) && path.Clean(p) == p }

// readOnly reports whether the runtime leaves a mount with options opts
// read-only. runc and crun apply ro and rw in order, the last one wins
// (["ro", "rw"] is read-write), and the recursive rro and rrw
// (mount_setattr) after the mount, over either.
func readOnly(opts []string) bool {
	ro, rec := false, ""
	for _, o := range opts {
		switch o {
		case "ro":
			ro = true
		case "rw":
			ro = false
		case "rro", "rrw":
			rec = o
		}
	}
	if rec != "" {
		return rec == "rro"
	}
	return ro
}

// under reports whether p is dir or below it.
func under(p, dir string) bool {
	p = path.Clean("/" + p)
	return p == dir || strings.HasPrefix(p, dir+"/")
}

func standardMount(dest string, kind policyapi.MountKind) *policyapi.StandardMount {
	for i, s := range policyapi.StandardMounts {
		if s.Destination == dest && s.Kind == kind {
			return &policyapi.StandardMounts[i]
		}
	}
	return nil
}

// sysctls checks linux.sysctl.
func (k *checker) sysctls(rule *policyapi.Container, l *specs.Linux) {
	if l == nil {
		return
	}
	keys := make([]string, 0, len(l.Sysctl))
	for key := range l.Sysctl {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	for _, key := range keys {
		kv := key + "=" + l.Sysctl[key]
		if !policyapi.MatchAny(rule.Sysctls, kv) {
			k.deny("linux.sysctl", fmt.Sprintf("%q", kv), k.key+".sysctls", listed(policyapi.Strings(rule.Sysctls)))
		}
	}
}
