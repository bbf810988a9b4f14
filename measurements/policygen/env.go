package policygen

import (
	"fmt"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// The environment of a container's process, as containerd 2.2's CRI
// builds it: containerd's default PATH, TERM=xterm with a terminal, and
// HOSTNAME; the image's env over them; the env the kubelet computed
// (envFrom, then env, then the service links of the names the container
// does not set) over those, each name replacing an earlier one.

// defaultPath is containerd's default PATH (oci.WithDefaultPathEnv).
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Value patterns of what the kubelet and the API server fill in.
const (
	reIP    = `[0-9a-f.:]+`
	rePort  = `[0-9]{1,5}`
	reURL   = `(tcp|udp|sctp)://(` + reIP + `|\[` + reIP + `\]):` + rePort
	reAny   = `(?s:.*)`
	reLabel = `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
)

// value is an env value: exact, or known only as a regular expression.
type value struct {
	exact bool
	s     string // the value if exact, else its regular expression
}

func exactValue(s string) value { return value{exact: true, s: s} }
func reValue(re string) value   { return value{s: re} }

// re is the value as a regular expression.
func (v value) re() string {
	if v.exact {
		return regexp.QuoteMeta(v.s)
	}
	return v.s
}

// exact is the pattern that matches only s.
func exact(s string) policyapi.Pattern {
	if strings.HasPrefix(s, policyapi.RegexPrefix) {
		return policyapi.Pattern(policyapi.RegexPrefix + regexp.QuoteMeta(s))
	}
	return policyapi.Pattern(s)
}

// entryPattern is the pattern of the env entry NAME=value.
func entryPattern(name string, v value) policyapi.Pattern {
	if v.exact {
		return exact(name + "=" + v.s)
	}
	return policyapi.Pattern(policyapi.RegexPrefix + regexp.QuoteMeta(name) + "=" + v.s)
}

// envEntry is one entry of a container's env rule: a variable and its
// value, or a pattern over many names.
type envEntry struct {
	name string
	v    value
	p    policyapi.Pattern // when name is ""
	note string
}

// pattern is the entry as the rule writes it.
func (e envEntry) pattern() policyapi.Pattern {
	if e.name == "" {
		return e.p
	}
	return entryPattern(e.name, e.v)
}

// envList is an env rule in the making, by name in order.
type envList struct{ entries []envEntry }

// set gives name value v, replacing an earlier value in place.
func (l *envList) set(name string, v value, note string) {
	e := envEntry{name: name, v: v, note: note}
	for i := range l.entries {
		if l.entries[i].name == name {
			l.entries[i] = e
			return
		}
	}
	l.entries = append(l.entries, e)
}

// setRaw applies an image env entry: NAME=VALUE, or NAME alone to unset.
func (l *envList) setRaw(entry, note string) {
	name, val, ok := strings.Cut(entry, "=")
	if !ok {
		for i := range l.entries {
			if l.entries[i].name == name {
				l.entries = append(l.entries[:i], l.entries[i+1:]...)
				return
			}
		}
		return
	}
	l.set(name, exactValue(val), note)
}

// serviceLink is the name and value of a family of variables the kubelet
// injects for services (pkg/kubelet/envvars): FOO_SERVICE_HOST,
// FOO_SERVICE_PORT[_NAME], FOO_PORT, FOO_PORT_443_TCP[_PROTO|_PORT|_ADDR].
type serviceLink struct{ name, value string }

// serviceLinks are the families for services named by svc (a regular
// expression of the upper-cased service name).
func serviceLinks(svc, portName string) []serviceLink {
	proto := `_[0-9]{1,5}_(TCP|UDP|SCTP)`
	return []serviceLink{
		{svc + `_SERVICE_HOST`, reIP},
		{svc + `_SERVICE_PORT` + portName, rePort},
		{svc + `_PORT(` + proto + `)?`, reURL},
		{svc + `_PORT` + proto + `_PROTO`, `(tcp|udp|sctp)`},
		{svc + `_PORT` + proto + `_PORT`, rePort},
		{svc + `_PORT` + proto + `_ADDR`, reIP},
	}
}

// links are the service variables the kubelet may inject: every
// service's in the pod's namespace with service links, else those of the
// API server's service "kubernetes", which it always injects.
func (g *gen) links() []serviceLink {
	if g.w.spec.EnableServiceLinks == nil || *g.w.spec.EnableServiceLinks {
		return serviceLinks(`[A-Z][A-Z0-9_]*`, `(_[A-Z0-9_]+)?`)
	}
	return serviceLinks(`KUBERNETES`, `(_HTTPS)?`)
}

// linkValue returns the value pattern of a service variable called name,
// if the kubelet may inject one.
func (g *gen) linkValue(name string) (string, bool) {
	for _, l := range g.links() {
		if regexp.MustCompile(`^(?:` + l.name + `)$`).MatchString(name) {
			return l.value, true
		}
	}
	return "", false
}

// expand is the kubelet's $(VAR) expansion (third_party/forked/golang/
// expansion) of s, where lookup gives the variables it may use; a name it
// does not give stays "$(NAME)".
func expand(s string, lookup func(string) (value, bool)) value {
	var lits []string // alternately literal text and regular expressions
	exactSoFar := true
	var b strings.Builder
	flushLit := func() {
		lits = append(lits, regexp.QuoteMeta(b.String()))
	}
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 >= len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$': // escaped
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString("$(")
				i++
				continue
			}
			name := s[i+2 : i+2+end]
			i += 2 + end
			v, ok := lookup(name)
			switch {
			case !ok:
				b.WriteString("$(" + name + ")")
			case v.exact:
				b.WriteString(v.s)
			default:
				flushLit()
				b.Reset()
				lits = append(lits, v.s)
				exactSoFar = false
			}
		default:
			b.WriteString(s[i : i+2])
			i++
		}
	}
	if exactSoFar {
		return exactValue(b.String())
	}
	flushLit()
	return reValue(strings.Join(lits, ""))
}

// withLinks adds to lookup the service variables the kubelet may inject,
// whose values are unknown: a name that is none stays "$(NAME)".
func (g *gen) withLinks(lookup func(string) (value, bool)) func(string) (value, bool) {
	return func(name string) (value, bool) {
		if v, ok := lookup(name); ok {
			return v, true
		}
		if re, link := g.linkValue(name); link {
			return reValue(`(` + re + `|` + regexp.QuoteMeta("$("+name+")") + `)`), true
		}
		return value{}, false
	}
}

// staticEnv is the lookup of the kubelet's ExpandContainerCommandOnlyStatic,
// with which it expands an exec probe's command: each env entry's value as
// written, "" for one set from a source, nothing else.
func staticEnv(c *corev1.Container) func(string) (value, bool) {
	vals := map[string]string{}
	for _, e := range c.Env {
		vals[e.Name] = e.Value
	}
	return func(name string) (value, bool) {
		v, ok := vals[name]
		return exactValue(v), ok
	}
}

// kubeEnv is the env the kubelet computes for container c, in the order
// it is applied, and a lookup of its final values for $(VAR) references
// in command and args.
func (g *gen) kubeEnv(c *corev1.Container) ([]envEntry, func(string) (value, bool), error) {
	vals := map[string]value{}
	var order []string
	var notes = map[string]string{}
	define := func(name string, v value, note string) {
		if _, ok := vals[name]; !ok {
			order = append(order, name)
		}
		vals[name], notes[name] = v, note
	}
	for i, ef := range c.EnvFrom {
		switch {
		case ef.ConfigMapRef != nil:
			cm := g.in.configMaps[ef.ConfigMapRef.Name]
			if cm == nil {
				if opt := ef.ConfigMapRef.Optional; opt != nil && *opt {
					g.warn("container %s: envFrom[%d]: optional ConfigMap %s is not in the input: if it exists, CreateContainer is refused (its variables are not in the policy)", c.Name, i, ef.ConfigMapRef.Name)
					continue
				}
				return nil, nil, fmt.Errorf("cannot pin the env of container %s: envFrom[%d] takes its variable names from ConfigMap %s, which is not in the input; add the ConfigMap to the YAML", c.Name, i, ef.ConfigMapRef.Name)
			}
			for _, k := range sortedKeys(cm.Data) {
				define(ef.Prefix+k, exactValue(cm.Data[k]), "ConfigMap "+cm.Name)
			}
		case ef.SecretRef != nil:
			s := g.in.secrets[ef.SecretRef.Name]
			if s == nil {
				if opt := ef.SecretRef.Optional; opt != nil && *opt {
					g.warn("container %s: envFrom[%d]: optional Secret %s is not in the input: if it exists, CreateContainer is refused (its variables are not in the policy)", c.Name, i, ef.SecretRef.Name)
					continue
				}
				return nil, nil, fmt.Errorf("cannot pin the env of container %s: envFrom[%d] takes its variable names from Secret %s, which is not in the input; add the Secret to the YAML (its values are not measured, only its keys)", c.Name, i, ef.SecretRef.Name)
			}
			keys := sortedKeys(s.Data)
			for _, k := range sortedKeys(s.StringData) {
				if _, dup := s.Data[k]; !dup {
					keys = append(keys, k)
				}
			}
			for _, k := range keys {
				define(ef.Prefix+k, reValue(reAny), "Secret "+s.Name+": the value is not measured")
			}
		}
	}
	lookup := g.withLinks(func(name string) (value, bool) { v, ok := vals[name]; return v, ok })
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.Value != "" {
			v := expand(e.Value, lookup)
			note := ""
			if !v.exact {
				note = "expands service variables"
			}
			define(e.Name, v, note)
			continue
		}
		v, note, skip := g.valueFrom(c, e)
		if !skip {
			define(e.Name, v, note)
		}
	}
	out := make([]envEntry, 0, len(order))
	for _, name := range order {
		out = append(out, envEntry{name: name, v: vals[name], note: notes[name]})
	}
	return out, lookup, nil
}

// valueFrom is the value of an env variable set from a source.
func (g *gen) valueFrom(c *corev1.Container, e corev1.EnvVar) (v value, note string, skip bool) {
	vf := e.ValueFrom
	switch {
	case vf.FieldRef != nil:
		return g.fieldValue(vf.FieldRef.FieldPath), "fieldRef " + vf.FieldRef.FieldPath, false
	case vf.ResourceFieldRef != nil:
		return reValue(`[0-9]+`), "resourceFieldRef " + vf.ResourceFieldRef.Resource, false
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		cm := g.in.configMaps[ref.Name]
		if cm == nil {
			g.warn("container %s: env %s: ConfigMap %s is not in the input, so its value is not pinned; add the ConfigMap to the YAML to pin it", c.Name, e.Name, ref.Name)
			return reValue(reAny), "ConfigMap " + ref.Name + " key " + ref.Key + ": not in the input, not pinned", false
		}
		val, ok := cm.Data[ref.Key]
		if !ok {
			g.warn("container %s: env %s: ConfigMap %s has no key %s", c.Name, e.Name, ref.Name, ref.Key)
			return value{}, "", true
		}
		return exactValue(val), "ConfigMap " + ref.Name + " key " + ref.Key, false
	case vf.SecretKeyRef != nil:
		return reValue(reAny), "Secret " + vf.SecretKeyRef.Name + " key " + vf.SecretKeyRef.Key + ": the value is not measured", false
	case vf.FileKeyRef != nil:
		return reValue(reAny), "fileKeyRef " + vf.FileKeyRef.Path + ": not pinned", false
	}
	return reValue(reAny), "valueFrom: not pinned", false
}

// fieldValue is the value of a downward API field.
func (g *gen) fieldValue(path string) value {
	switch path {
	case "metadata.name":
		if g.w.exactName != "" {
			return exactValue(g.w.exactName)
		}
		return reValue(g.w.podName)
	case "metadata.namespace":
		if g.w.namespace != "" {
			return exactValue(g.w.namespace)
		}
		return reValue(reLabel)
	case "metadata.uid":
		return reValue(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	case "spec.nodeName":
		return reValue(`[a-z0-9.-]+`)
	case "spec.serviceAccountName":
		if sa := g.w.spec.ServiceAccountName; sa != "" {
			return exactValue(sa)
		}
		return exactValue("default")
	case "status.hostIP", "status.podIP":
		return reValue(reIP)
	case "status.hostIPs", "status.podIPs":
		return reValue(`[0-9a-f.:,]+`)
	}
	// A label or annotation the pod's template states is what its pods
	// carry (one a controller or the cluster adds is not known here).
	for prefix, m := range map[string]map[string]string{"metadata.labels": g.w.meta.Labels, "metadata.annotations": g.w.meta.Annotations} {
		if key, ok := strings.CutPrefix(path, prefix+"['"); ok {
			if key, ok := strings.CutSuffix(key, "']"); ok {
				if v, ok := m[key]; ok {
					return exactValue(v)
				}
			}
		}
	}
	return reValue(reAny)
}

// hostname is the pattern of the pod's hostname (the sandbox's, which
// containerd gives each container as HOSTNAME): kubelet's
// GeneratePodHostNameAndDomain and GetNodenameForKernel.
func (g *gen) hostname() (value, string) {
	s := &g.w.spec
	if s.HostNetwork {
		return reValue(`[A-Za-z0-9.-]+`), "hostNetwork: the node's name"
	}
	host := value{}
	switch {
	case s.Hostname != "":
		host = exactValue(s.Hostname)
	case g.w.exactName != "":
		h := g.w.exactName
		if len(h) > 63 {
			h = strings.TrimRight(h[:63], "-.")
		}
		host = exactValue(h)
	default:
		host = reValue(g.w.podName)
	}
	subdomain := s.Subdomain
	if g.w.stsService != "" {
		subdomain = g.w.stsService
	}
	if s.SetHostnameAsFQDN == nil || !*s.SetHostnameAsFQDN || subdomain == "" {
		if host.exact {
			return host, ""
		}
		return host, "the pod's name, which the " + g.w.kind + " generates"
	}
	ns := reLabel
	if g.w.namespace != "" {
		ns = regexp.QuoteMeta(g.w.namespace)
	}
	return reValue(host.re() + `\.` + regexp.QuoteMeta(subdomain) + `\.` + ns + `\.svc\.` + regexp.QuoteMeta(g.o.ClusterDomain)), "setHostnameAsFQDN: HOSTNAME.SUBDOMAIN.NAMESPACE.svc." + g.o.ClusterDomain
}

// validDomain reports whether d is a DNS name of RFC 1123 labels.
func validDomain(d string) bool {
	if len(d) > 253 {
		return false
	}
	for _, l := range strings.Split(d, ".") {
		if len(l) > 63 || !labelRE.MatchString(l) {
			return false
		}
	}
	return true
}

var labelRE = regexp.MustCompile(`^` + reLabel + `$`)

// env is container c's env rule.
func (g *gen) env(c *corev1.Container, img *Image) ([]envEntry, func(string) (value, bool), error) {
	var l envList
	l.set("PATH", exactValue(strings.TrimPrefix(defaultPath, "PATH=")), "containerd's default")
	if c.TTY {
		l.set("TERM", exactValue("xterm"), "tty")
	}
	host, note := g.hostname()
	l.set("HOSTNAME", host, note)
	if img != nil {
		for _, e := range img.Config.Env {
			l.setRaw(e, "image")
		}
		// The image's PATH replaces containerd's in place.
		for i := range l.entries {
			if l.entries[i].name == "PATH" && l.entries[i].note == "containerd's default" && hasEnv(img.Config.Env, "PATH") {
				l.entries[i].note = "image"
			}
		}
	}
	kube, lookup, err := g.kubeEnv(c)
	if err != nil {
		return nil, nil, err
	}
	set := map[string]bool{}
	for _, e := range kube {
		set[e.name] = true
		if i := l.index(e.name); i >= 0 {
			l.entries[i] = e
		} else {
			l.entries = append(l.entries, e)
		}
	}
	// A service variable replaces a variable of the image (or containerd)
	// of the same name, which the container does not set.
	for i, e := range l.entries {
		if set[e.name] {
			continue
		}
		if re, ok := g.linkValue(e.name); ok {
			l.entries[i].v = reValue("(" + e.v.re() + "|" + re + ")")
			l.entries[i].note = e.note + ", or a service's variable"
		}
	}
	what := "service links"
	if g.w.spec.EnableServiceLinks != nil && !*g.w.spec.EnableServiceLinks {
		what = "the API server's service (enableServiceLinks: false)"
	}
	for i, sl := range g.links() {
		e := envEntry{p: policyapi.Pattern(policyapi.RegexPrefix + sl.name + "=" + sl.value)}
		if i == 0 {
			e.note = "the kubelet's: " + what
		}
		l.entries = append(l.entries, e)
	}
	return l.entries, lookup, nil
}

func (l *envList) index(name string) int {
	for i, e := range l.entries {
		if e.name == name && name != "" {
			return i
		}
	}
	return -1
}

func hasEnv(env []string, name string) bool {
	for _, e := range env {
		if k, _, _ := strings.Cut(e, "="); k == name {
			return true
		}
	}
	return false
}
