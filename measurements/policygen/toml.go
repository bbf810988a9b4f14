package policygen

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// The document is written by hand rather than marshalled, so that it
// carries comments saying where each value comes from; check reads it
// back with initdata.Parse and compares.

// plan is a document before it is written.
type plan struct {
	header  []string
	ports   []uint32
	kbs     initdata.KBS
	policy  policyapi.Policy
	sandbox *rule
	rules   []*rule
}

// plan builds the workload's document.
func (g *gen) plan() (*plan, error) {
	p := &plan{ports: g.o.PortForward}
	digested := "Its digest is the pod VM's HOST_DATA (SNP, sim) and MRCONFIGID (TDX): every byte counts."
	if g.o.Format == initdata.FormatCoCo {
		digested = "The CoCo document holding it is digested into HOST_DATA and MRCONFIGID: every byte counts."
	}
	p.header = []string{
		fmt.Sprintf("Init data of %s %s, written by `c8s-measure policy`.", g.w.kind, g.w.qualified()),
		digested,
		"Each container may also have the standard mounts (guest/api/policy StandardMounts):",
		"/proc, /dev, /dev/pts, /dev/shm (tmpfs, or the pod's in guest memory: podshm),",
		"/dev/mqueue, /sys, /sys/fs/cgroup, and the files /etc/hosts, /etc/hostname,",
		"/etc/resolv.conf and /dev/termination-log.",
	}
	names := map[string]bool{}
	var errs []error
	for _, list := range []struct {
		where string
		cs    []corev1.Container
	}{{"Init container", g.w.spec.InitContainers}, {"Container", g.w.spec.Containers}} {
		for i := range list.cs {
			c := &list.cs[i]
			if names[c.Name] {
				errs = append(errs, fmt.Errorf("two containers are called %s: CRI names a container's rule by its name", c.Name))
				continue
			}
			names[c.Name] = true
			r, err := g.container(c, list.where)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			p.rules = append(p.rules, r)
		}
	}
	if len(g.w.spec.EphemeralContainers) > 0 {
		g.warn("the pod spec has ephemeral containers: they get no rule, so the host cannot create them (kubectl debug is refused)")
	}
	if len(g.w.spec.Containers) == 0 {
		errs = append(errs, errors.New("the pod spec has no containers"))
	}
	if podOS := g.w.spec.OS; podOS != nil && podOS.Name != corev1.Linux {
		errs = append(errs, fmt.Errorf("spec.os.name %q: c8s runs Linux pods", podOS.Name))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := g.checkNames(names); err != nil {
		return nil, err
	}
	sb, err := g.sandbox()
	if err != nil {
		return nil, err
	}
	p.sandbox = sb
	p.policy.Audit = g.o.Audit
	// The nameservers the pod's spec names alone (dnsPolicy None); the
	// cluster's or the node's (the other policies) are not known here.
	// With them the search domains (the spec's too) and the /etc/hosts
	// entries beside the standard ones (the spec's hostAliases) are pinned.
	if g.w.spec.DNSPolicy == corev1.DNSNone {
		n := &policyapi.Network{DNS: []policyapi.Pattern{}, DNSSearch: []policyapi.Pattern{}, Hosts: []policyapi.Pattern{}} // none named: none at all
		if dc := g.w.spec.DNSConfig; dc != nil {
			for _, ns := range dc.Nameservers {
				n.DNS = append(n.DNS, exact(ns))
			}
			for _, d := range dc.Searches {
				n.DNSSearch = append(n.DNSSearch, exact(d))
			}
		}
		for _, a := range g.w.spec.HostAliases {
			for _, h := range a.Hostnames {
				n.Hosts = append(n.Hosts, exact(a.IP+" "+h))
			}
		}
		// The hostname /etc/hosts may name the pod by (the node's, with
		// hostNetwork, is left to the default: one DNS label).
		if !g.w.spec.HostNetwork {
			if host, _ := g.hostname(); host.exact {
				n.Hostname = exact(host.s)
			} else {
				n.Hostname = policyapi.Pattern(policyapi.RegexPrefix + host.s)
			}
		}
		p.policy.Network = n
	}
	p.policy.Sandbox = &sb.c
	p.policy.Containers = map[string]*policyapi.Container{}
	for _, r := range p.rules {
		r.c.Env = envPatterns(r.env)
		p.policy.Containers[r.name] = &r.c
	}
	sb.c.Env = envPatterns(sb.env)
	if g.o.KBS.URL != "" || g.o.KBS.Cert != "" || len(g.o.Secrets) > 0 || g.pullAuths() {
		p.kbs = initdata.KBS{URL: g.o.KBS.URL, Cert: g.o.KBS.Cert}
		seen := map[string]bool{}
		for _, s := range g.o.Secrets {
			if !seen[s.Resource] {
				seen[s.Resource] = true
				p.kbs.Secrets = append(p.kbs.Secrets, initdata.Secret{Resource: s.Resource, Path: s.Path})
			}
		}
		p.kbs.Secrets = append(p.kbs.Secrets, g.pullAuthSecrets(seen)...)
	}
	if g.o.Audit {
		g.warn("policy.audit = true: denials are logged, not enforced; the owner's broker sees it in the measured document")
	}
	return p, nil
}

// checkNames refuses options naming containers the pod does not have.
func (g *gen) checkNames(names map[string]bool) error {
	var bad []string
	check := func(what, name string) {
		if !names[name] {
			bad = append(bad, fmt.Sprintf("%s names container %q", what, name))
		}
	}
	for _, n := range sortedKeys(g.o.Exec) {
		check("--allow-exec", n)
	}
	for _, n := range g.o.ExecStdin {
		check("--exec-stdin", n)
	}
	for _, s := range g.o.Secrets {
		check("--secret", s.Container)
	}
	for _, n := range sortedKeys(g.o.Pull) {
		check("--pull", n)
	}
	if len(bad) > 0 {
		all := make([]string, 0, len(names))
		for n := range names {
			all = append(all, n)
		}
		sort.Strings(all)
		return fmt.Errorf("%s, which the pod does not have (it has %s)", strings.Join(bad, "; "), strings.Join(all, ", "))
	}
	return nil
}

func envPatterns(es []envEntry) []policyapi.Pattern {
	if len(es) == 0 {
		return nil
	}
	out := make([]policyapi.Pattern, len(es))
	for i, e := range es {
		out[i] = e.pattern()
	}
	return out
}

// document writes the workload's init data in the chosen format.
func (g *gen) document() ([]byte, error) {
	p, err := g.plan()
	if err != nil {
		return nil, err
	}
	g.p = p
	doc := p.write()
	if g.o.Format == initdata.FormatCoCo {
		alg := g.o.Algorithm
		if alg == "" {
			alg = "sha384"
		}
		if !slices.Contains(initdata.CoCoAlgorithms, alg) {
			return nil, fmt.Errorf("algorithm %q: want one of %s", alg, strings.Join(initdata.CoCoAlgorithms, ", "))
		}
		var b bytes.Buffer
		b.WriteString("# CoCo init data (Trustee's initdata specification) of " + g.w.kind + " " + g.w.qualified() + ",\n")
		b.WriteString("# written by `c8s-measure policy`; c8s reads its " + initdata.CoCoC8sKey + " entry.\n")
		fmt.Fprintf(&b, "version = %q\nalgorithm = %q\n\n[data]\n%q = %s\n", initdata.CoCoVersion, alg, initdata.CoCoC8sKey, multiline(string(doc), true))
		doc = b.Bytes()
	}
	return doc, nil
}

// check reads the document back as the shim and the agent will and
// compares it with the plan.
func (g *gen) check(doc []byte) error {
	d, err := initdata.Parse(doc)
	if err != nil {
		return fmt.Errorf("the generated init data does not parse (a bug in c8s-measure policy, or options it cannot express): %w", err)
	}
	if d.Policy == nil || !reflect.DeepEqual(*d.Policy, g.p.policy) || !reflect.DeepEqual(d.KBS, g.p.kbs) || !slices.Equal(d.Agent.AllowPortForward, g.p.ports) {
		return fmt.Errorf("the generated init data reads back as another policy than the one written (a bug in c8s-measure policy): %s", differs(d, g.p))
	}
	return nil
}

// differs names what check found different.
func differs(d *initdata.InitData, p *plan) string {
	switch {
	case d.Policy == nil:
		return "no [policy]"
	case !reflect.DeepEqual(d.KBS, p.kbs):
		return "[kbs]"
	case !slices.Equal(d.Agent.AllowPortForward, p.ports):
		return "agent_policy.allow_port_forward"
	case !reflect.DeepEqual(d.Policy.Network, p.policy.Network):
		return "policy.network"
	case !reflect.DeepEqual(d.Policy.Sandbox, p.policy.Sandbox):
		return "policy.sandbox" + fieldDiff(d.Policy.Sandbox, p.policy.Sandbox)
	}
	for _, n := range sortedKeys(p.policy.Containers) {
		if got := d.Policy.Containers[n]; !reflect.DeepEqual(got, p.policy.Containers[n]) {
			return "policy.containers." + key(n) + fieldDiff(got, p.policy.Containers[n])
		}
	}
	return "policy"
}

// fieldDiff names the first field in which two rules differ.
func fieldDiff(read, wrote *policyapi.Container) string {
	if read == nil || wrote == nil {
		return ": missing"
	}
	a, b := reflect.ValueOf(*read), reflect.ValueOf(*wrote)
	for i := range a.NumField() {
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			return fmt.Sprintf(".%s: read %#v, wrote %#v", a.Type().Field(i).Name, a.Field(i).Interface(), b.Field(i).Interface())
		}
	}
	return ""
}

// write writes the document in c8s's format.
func (p *plan) write() []byte {
	var b bytes.Buffer
	for _, h := range p.header {
		b.WriteString("# " + h + "\n")
	}
	fmt.Fprintf(&b, "version = %q\n", initdata.Version)
	if len(p.ports) > 0 {
		ports := make([]string, len(p.ports))
		for i, port := range p.ports {
			ports[i] = strconv.FormatUint(uint64(port), 10)
		}
		b.WriteString("\n[agent_policy]\nallow_port_forward = [" + strings.Join(ports, ", ") + "]\n")
	}
	if p.kbs.URL != "" || p.kbs.Cert != "" {
		b.WriteString("\n[kbs]\n")
		if p.kbs.URL != "" {
			b.WriteString("url = " + str(p.kbs.URL) + "\n")
		}
		if p.kbs.Cert != "" {
			// A basic string: the c8s.toml entry of a CoCo document is a literal one.
			b.WriteString("cert = " + multiline(p.kbs.Cert, false) + "\n")
		}
	}
	for _, s := range p.kbs.Secrets {
		b.WriteString("\n[[kbs.secrets]]\nresource = " + str(s.Resource) + "\npath = " + str(s.Path) + "\n")
	}
	b.WriteString("\n[policy]\n")
	if p.policy.Audit {
		b.WriteString("audit = true  # denials are logged, not enforced\n")
	}
	if n := p.policy.Network; n != nil {
		b.WriteString("\n[policy.network]\n")
		dns := quotedPatterns(n.DNS)
		b.WriteString("dns = [" + strings.Join(dns, ", ") + "]  # dnsPolicy None: the pod's dnsConfig.nameservers\n")
		b.WriteString("dns_search = [" + strings.Join(quotedPatterns(n.DNSSearch), ", ") + "]  # its dnsConfig.searches\n")
		b.WriteString("hosts = [" + strings.Join(quotedPatterns(n.Hosts), ", ") + "]  # its hostAliases, beside the standard entries\n")
		if n.Hostname != "" {
			b.WriteString("hostname = " + str(string(n.Hostname)) + "  # the pod's hostname, by which /etc/hosts names it\n")
		}
	}
	p.sandbox.write(&b, "policy.sandbox")
	for _, r := range p.rules {
		r.write(&b, "policy.containers."+key(r.name))
	}
	return b.Bytes()
}

// write writes one rule's table.
func (r *rule) write(b *bytes.Buffer, table string) {
	b.WriteString("\n")
	for _, a := range r.about {
		b.WriteString("# " + a + "\n")
	}
	b.WriteString("[" + table + "]\n")
	c := &r.c
	b.WriteString("image = " + str(string(c.Image)) + "\n")
	r.patterns(b, "args", c.Args)
	envNotes := map[string]string{}
	for i, e := range r.env {
		if e.note != "" {
			envNotes[fmt.Sprintf("env[%d]", i)] = e.note
		}
	}
	r.list(b, "env", len(c.Env), func(i int) string { return str(string(c.Env[i])) }, envNotes)
	if c.WorkingDir != nil {
		r.scalar(b, "working_dir", str(string(*c.WorkingDir)))
	}
	if c.UID != nil {
		r.scalar(b, "uid", strconv.FormatUint(uint64(*c.UID), 10))
	}
	if c.GID != nil {
		r.scalar(b, "gid", strconv.FormatUint(uint64(*c.GID), 10))
	}
	if c.AdditionalGIDs != nil {
		gids := make([]string, len(*c.AdditionalGIDs))
		for i, g := range *c.AdditionalGIDs {
			gids[i] = strconv.FormatUint(uint64(g), 10)
		}
		r.scalar(b, "additional_gids", "["+strings.Join(gids, ", ")+"]")
	}
	for _, f := range []struct {
		key string
		on  bool
	}{{"privileged", c.Privileged}, {"no_new_privileges", c.NoNewPrivileges}, {"read_only_root", c.ReadOnlyRoot}, {"user_namespace", c.UserNamespace}, {"share_pid_namespace", c.SharePIDNamespace}} {
		if f.on {
			r.scalar(b, f.key, "true")
		}
	}
	if c.Capabilities != nil {
		r.strings(b, "capabilities", *c.Capabilities)
	}
	if len(c.VMNamespaces) > 0 {
		r.strings(b, "vm_namespaces", c.VMNamespaces)
	}
	if c.MaskedPaths != nil {
		r.strings(b, "masked_paths", *c.MaskedPaths)
	}
	if c.ReadonlyPaths != nil {
		r.strings(b, "readonly_paths", *c.ReadonlyPaths)
	}
	r.list(b, "mounts", len(c.Mounts), func(i int) string {
		m := c.Mounts[i]
		s := "{ destination = " + str(string(m.Destination)) + ", kind = " + str(string(m.Kind))
		if m.Source != "" {
			s += ", source = " + str(m.Source)
		}
		if m.Volume != "" {
			s += ", volume = " + str(string(m.Volume))
		}
		if m.ReadOnly {
			s += ", read_only = true"
		}
		return s + " }"
	}, r.notes)
	r.patterns(b, "sysctls", c.Sysctls)
	r.list(b, "exec", len(c.Exec), func(i int) string { return inline(c.Exec[i]) }, r.notes)
	if c.Signals != nil {
		r.strings(b, "signals", *c.Signals)
	}
	for _, f := range []struct {
		key string
		on  bool
	}{{"exec_stdin", c.ExecStdin}, {"logs", c.Logs}, {"stdin", c.Stdin}, {"tty", c.TTY}} {
		if f.on {
			r.scalar(b, f.key, "true")
		}
	}
	r.list(b, "secrets", len(c.Secrets), func(i int) string {
		return "{ resource = " + str(c.Secrets[i].Resource) + ", path = " + str(c.Secrets[i].Path) + " }"
	}, nil)
	if c.Pull != "" {
		r.scalar(b, "pull", str(c.Pull))
		if c.PullAuth != "" {
			r.scalar(b, "pull_auth", str(c.PullAuth))
		}
		if c.PullPlainHTTP {
			r.scalar(b, "pull_plain_http", "true")
		}
		if c.PullCA != "" {
			r.scalar(b, "pull_ca", multiline(c.PullCA, false))
		}
	}
	// The layers are tables of their own: they end the rule.
	for i, l := range c.Layers {
		b.WriteString("\n[[" + table + ".layers]]")
		if n := r.notes[fmt.Sprintf("layers[%d]", i)]; n != "" {
			b.WriteString("  # " + n)
		}
		b.WriteString("\ndigest = " + str(l.Digest) + "\nverity = " + str(l.Verity) + "\nblocks = " + strconv.FormatUint(l.Blocks, 10) + "\n")
	}
}

func (r *rule) scalar(b *bytes.Buffer, k, v string) {
	b.WriteString(k + " = " + v)
	if n := r.notes[k]; n != "" {
		b.WriteString("  # " + n)
	}
	b.WriteString("\n")
}

func (r *rule) patterns(b *bytes.Buffer, k string, ps []policyapi.Pattern) {
	if len(ps) == 0 {
		return
	}
	r.strings(b, k, policyapi.Strings(ps))
}

// strings writes a list of strings: on one line when it is short and
// has no comments.
func (r *rule) strings(b *bytes.Buffer, k string, ss []string) {
	if ss == nil {
		return
	}
	line := make([]policyapi.Pattern, len(ss))
	for i, s := range ss {
		line[i] = policyapi.Pattern(s)
	}
	one := inline(line)
	commented := false
	for i := range ss {
		commented = commented || r.notes[fmt.Sprintf("%s[%d]", k, i)] != ""
	}
	if len(ss) == 0 || !commented && len(k)+len(one) < 96 {
		r.scalar(b, k, one)
		return
	}
	r.list(b, k, len(ss), func(i int) string { return str(ss[i]) }, r.notes)
}

// list writes a list one entry a line, each with its note.
func (r *rule) list(b *bytes.Buffer, k string, n int, entry func(int) string, notes map[string]string) {
	if n == 0 {
		return
	}
	b.WriteString(k + " = [\n")
	for i := range n {
		b.WriteString("  " + entry(i) + ",")
		if note := notes[fmt.Sprintf("%s[%d]", k, i)]; note != "" {
			b.WriteString("  # " + note)
		}
		b.WriteString("\n")
	}
	b.WriteString("]\n")
}

func inline(ps []policyapi.Pattern) string {
	q := make([]string, len(ps))
	for i, p := range ps {
		q[i] = str(string(p))
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// str writes a TOML string: a literal string ('...') for one with
// backslashes (regular expressions read better so), else a basic string.
func str(s string) string {
	if strings.Contains(s, `\`) && !strings.ContainsAny(s, "'\n\r\t\x7f") && !hasControl(s) {
		return "'" + s + "'"
	}
	var b strings.Builder
	b.WriteByte('"')
	escape(&b, s, false)
	b.WriteByte('"')
	return b.String()
}

// escape writes s for a TOML basic string: quotes, backslashes and
// control characters escaped; newlines kept as they are when multi-line.
func escape(b *strings.Builder, s string, multiLine bool) {
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n' && multiLine:
			b.WriteByte('\n')
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, `\u%04X`, r)
		default:
			b.WriteRune(r)
		}
	}
}

func hasControl(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return true
		}
	}
	return false
}

// multiline writes a multi-line TOML string whose value is s exactly: a
// literal one (”'...”') when literal is set and s allows it, else a basic
// one ("""...""") with escapes.
func multiline(s string, literal bool) string {
	if literal && !strings.Contains(s, "'''") && !strings.HasSuffix(s, "'") && !strings.ContainsAny(s, "\r\x7f") && !hasControlBut(s, "\n\t") {
		return "'''\n" + s + "'''"
	}
	var b strings.Builder
	b.WriteString("\"\"\"\n")
	escape(&b, s, true)
	b.WriteString(`"""`)
	return b.String()
}

func hasControlBut(s, allowed string) bool {
	for _, r := range s {
		if (r < 0x20 || r == 0x7f) && !strings.ContainsRune(allowed, r) {
			return true
		}
	}
	return false
}

// key writes a container name as a TOML key.
func key(k string) string {
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return str(k)
		}
	}
	if k == "" {
		return `""`
	}
	return k
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// quotedPatterns writes patterns as TOML strings.
func quotedPatterns(ps []policyapi.Pattern) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = str(string(p))
	}
	return out
}
