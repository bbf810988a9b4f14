package policygen

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// template is the pod template of the workloads below.
const template = `    metadata:
      labels: {app: w}
    spec:
      containers:
        - name: c
          image: ghcr.io/example/c@sha256:` + "abababababababababababababababababababababababababababababababab" + `
          command: ["/c"]
          workingDir: /
          securityContext: {runAsUser: 1, runAsGroup: 1}
`

// rulesOf generates the policy of each workload of y.
func rulesOf(t *testing.T, y string, o Options) map[string]*policyapi.Policy {
	t.Helper()
	rs, err := Generate([]byte(y), o)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*policyapi.Policy{}
	for _, r := range rs {
		d, err := initdata.Parse(r.InitData)
		if err != nil {
			t.Fatal(err)
		}
		out[r.Kind] = d.Policy
	}
	return out
}

// envMatch reports whether an env entry passes the rule.
func envMatch(c *policyapi.Container, entry string) bool {
	return policyapi.MatchAny(c.Env, entry)
}

// Each controller names its pods its own way; HOSTNAME and the downward
// API's metadata.name match those names and no others.
func TestPodNames(t *testing.T) {
	long := strings.Repeat("x", 60)
	y := strings.Join([]string{
		"apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec:\n  serviceName: db\n  selector: {matchLabels: {app: w}}\n  template:\n" + template,
		"apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: agent}\nspec:\n  selector: {matchLabels: {app: w}}\n  template:\n" + template,
		"apiVersion: batch/v1\nkind: Job\nmetadata: {name: once}\nspec:\n  template:\n" + template,
		"apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: nightly}\nspec:\n  schedule: '@daily'\n  jobTemplate:\n    spec:\n      template:\n" + strings.ReplaceAll(template, "\n    ", "\n        "),
		"apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {name: " + long + "}\nspec:\n  selector: {matchLabels: {app: w}}\n  template:\n" + template,
		"apiVersion: v1\nkind: ReplicationController\nmetadata: {name: rc}\nspec:\n  template:\n" + template,
	}, "---\n")
	// The CronJob's template is indented two more levels.
	y = strings.Replace(y, "      template:\n    metadata:", "      template:\n        metadata:", 1)
	ps := rulesOf(t, y, Options{})
	for kind, c := range map[string]struct{ good, bad []string }{
		"StatefulSet":           {[]string{"db-0", "db-12"}, []string{"db-x", "dbx-0", "other-0"}},
		"DaemonSet":             {[]string{"agent-x2k4q"}, []string{"agent-x2k4", "agent-X2K4Q", "agentx-x2k4q"}},
		"Job":                   {[]string{"once-x2k4q", "once-3-x2k4q"}, []string{"once-x2k4", "twice-x2k4q"}},
		"CronJob":               {[]string{"nightly-29000000-x2k4q"}, []string{"nightly-x2k4q"}},
		"ReplicaSet":            {[]string{long[:58] + "x2k4q"}, []string{long + "-x2k4q"}},
		"ReplicationController": {[]string{"rc-x2k4q"}, []string{"rc-x2k4"}},
	} {
		p := ps[kind]
		if p == nil {
			t.Fatalf("no policy for the %s", kind)
		}
		rule := p.Containers["c"]
		for _, name := range c.good {
			if !envMatch(rule, "HOSTNAME="+name) {
				t.Errorf("%s: HOSTNAME=%s refused", kind, name)
			}
		}
		for _, name := range c.bad {
			if envMatch(rule, "HOSTNAME="+name) {
				t.Errorf("%s: HOSTNAME=%s allowed", kind, name)
			}
		}
	}
}

// hostNetwork, hostPID and hostIPC share the VM's namespaces and take the
// node's name; setHostnameAsFQDN makes HOSTNAME the FQDN.
func TestHostNamespacesAndFQDN(t *testing.T) {
	y := "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nspec:\n  hostNetwork: true\n  hostPID: true\n  hostIPC: true\n" +
		strings.TrimPrefix(strings.ReplaceAll(template, "\n    ", "\n"), "    metadata:\n  labels: {app: w}\nspec:\n")
	p := rulesOf(t, y, Options{})["Pod"]
	for _, r := range []*policyapi.Container{p.Sandbox, p.Containers["c"]} {
		if !slices.Equal(r.VMNamespaces, []string{"pid", "network", "ipc"}) {
			t.Errorf("vm_namespaces = %v", r.VMNamespaces)
		}
	}
	if len(p.Sandbox.Sysctls) != 0 {
		t.Errorf("a host-network sandbox gets containerd's network sysctls: %v", p.Sandbox.Sysctls)
	}
	if !envMatch(p.Containers["c"], "HOSTNAME=node-1.example") {
		t.Error("hostNetwork: the node's name refused")
	}
	y = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nspec:\n  hostname: h\n  subdomain: s\n  setHostnameAsFQDN: true\n" +
		strings.TrimPrefix(strings.ReplaceAll(template, "\n    ", "\n"), "    metadata:\n  labels: {app: w}\nspec:\n")
	c := rulesOf(t, y, Options{})["Pod"].Containers["c"]
	if !envMatch(c, "HOSTNAME=h.s.ns.svc.cluster.local") || envMatch(c, "HOSTNAME=p") || envMatch(c, "HOSTNAME=h.s.other.svc.cluster.local") {
		t.Error("setHostnameAsFQDN: HOSTNAME is not h.s.ns.svc.CLUSTER-DOMAIN")
	}
	// The cluster domain is the kubelet's, not any the host names: a
	// hostname under a domain of the host's choosing is refused.
	for _, h := range []string{"h.s.ns.svc.evil.example", "h.s.ns.svc.cluster.local.evil.example", "h.s.ns.svc.cluster-local"} {
		if envMatch(c, "HOSTNAME="+h) {
			t.Errorf("setHostnameAsFQDN: HOSTNAME=%s allowed", h)
		}
	}
	c = rulesOf(t, y, Options{ClusterDomain: "corp.internal"})["Pod"].Containers["c"]
	if !envMatch(c, "HOSTNAME=h.s.ns.svc.corp.internal") || envMatch(c, "HOSTNAME=h.s.ns.svc.cluster.local") {
		t.Error("setHostnameAsFQDN: HOSTNAME does not end in the cluster domain given")
	}
	for _, d := range []string{"Cluster.Local", "cluster..local", "cluster.local.", "-x.local", "a_b.local", strings.Repeat("a", 64) + ".local"} {
		_, err := Generate([]byte(y), Options{ClusterDomain: d})
		if err == nil || !strings.Contains(err.Error(), "cluster domain") {
			t.Errorf("cluster domain %q: err = %v, want it refused by name", d, err)
		}
	}
}

// The kubelet's $(VAR) expansion: defined variables, escapes, service
// variables (unknown values), and names it leaves as they are.
func TestExpand(t *testing.T) {
	g := &gen{w: &workload{}}
	vals := map[string]value{"A": exactValue("1"), "IP": reValue(reIP)}
	lookup := g.withLinks(func(n string) (value, bool) { v, ok := vals[n]; return v, ok })
	for in, want := range map[string]string{
		"x$(A)y":    "x1y",
		"$$(A)":     "$(A)",
		"$(B)":      "$(B)",
		"$(A":       "$(A",
		"a$":        "a$",
		"$x":        "$x",
		"$(A)$(A)$": "11$",
	} {
		if v := expand(in, lookup); !v.exact || v.s != want {
			t.Errorf("expand(%q) = %+v, want %q", in, v, want)
		}
	}
	for in, c := range map[string]struct{ good, bad []string }{
		"--ip=$(IP)":           {[]string{"--ip=10.0.0.1"}, []string{"--ip=x", "--ip=$(IP)"}},
		"$(DB_SERVICE_HOST):1": {[]string{"10.0.0.2:1", "$(DB_SERVICE_HOST):1"}, []string{"evil:1"}},
	} {
		v := expand(in, lookup)
		re := regexp.MustCompile("^(?:" + v.re() + ")$")
		for _, s := range c.good {
			if !re.MatchString(s) {
				t.Errorf("expand(%q) = %s does not match %q", in, v.re(), s)
			}
		}
		for _, s := range c.bad {
			if re.MatchString(s) {
				t.Errorf("expand(%q) = %s matches %q", in, v.re(), s)
			}
		}
	}
}

// A variable of the image that a service link of the same name replaces
// may have either value; with service links off, only the image's.
func TestServiceLinkReplacesImageEnv(t *testing.T) {
	y := pod("      workingDir: /\n      securityContext: {runAsUser: 1, runAsGroup: 1}\n")
	img := &Image{Source: "t"}
	img.Config.Cmd = []string{"/redis-client"}
	img.Config.Env = []string{"REDIS_PORT=6379"}
	o := Options{Images: map[string]*Image{"app": img}}
	c := rulesOf(t, y, o)["Pod"].Containers["app"]
	for _, e := range []string{"REDIS_PORT=6379", "REDIS_PORT=tcp://10.0.0.3:6379"} {
		if !envMatch(c, e) {
			t.Errorf("%s refused", e)
		}
	}
	c = rulesOf(t, strings.Replace(y, "spec:\n", "spec:\n  enableServiceLinks: false\n", 1), o)["Pod"].Containers["app"]
	if !envMatch(c, "REDIS_PORT=6379") || envMatch(c, "REDIS_PORT=tcp://10.0.0.3:6379") || envMatch(c, "DB_SERVICE_HOST=10.0.0.1") {
		t.Error("enableServiceLinks: false still allows service links")
	}
	if !envMatch(c, "KUBERNETES_SERVICE_HOST=10.96.0.1") {
		t.Error("enableServiceLinks: false refuses the API server's service")
	}
}

// An image's VOLUME that no volume covers is a node directory containerd
// binds: allowed as shared, with a warning. Its STOPSIGNAL is allowed.
func TestImageVolumes(t *testing.T) {
	y := pod("      workingDir: /\n      securityContext: {runAsUser: 1, runAsGroup: 1}\n      volumeMounts:\n        - {name: d, mountPath: /data/}\n")
	y = strings.Replace(y, "spec:\n", "spec:\n  volumes:\n    - {name: d, emptyDir: {}}\n", 1)
	img := &Image{Source: "t"}
	img.Config.Cmd = []string{"/db"}
	img.Config.Volumes = map[string]struct{}{"/data": {}, "/var/log/db/": {}}
	img.Config.StopSignal = "SIGQUIT"
	rs, err := Generate([]byte(y), Options{Images: map[string]*Image{"app": img}})
	if err != nil {
		t.Fatal(err)
	}
	d, _ := initdata.Parse(rs[0].InitData)
	var got []string
	for _, m := range d.Policy.Containers["app"].Mounts {
		got = append(got, string(m.Destination)+" "+string(m.Kind))
	}
	want := []string{"/data emptydir", "/var/run/secrets/kubernetes.io/serviceaccount shared", "/var/log/db shared"}
	if !slices.Equal(got, want) {
		t.Errorf("mounts %q, want %q", got, want)
	}
	if !strings.Contains(strings.Join(rs[0].Warnings, "\n"), "the image's VOLUME /var/log/db is a directory of the node") {
		t.Errorf("warnings %q", rs[0].Warnings)
	}
	// The image's STOPSIGNAL, which the defaults lack, is allowed.
	if sigs := d.Policy.Containers["app"].Signals; sigs == nil || !slices.Contains(*sigs, "SIGQUIT") || !slices.Contains(*sigs, "SIGKILL") {
		t.Errorf("signals %v, want the defaults and SIGQUIT", sigs)
	}
}

// The kubelet expands an exec probe's command with the container's env as
// written (a valueFrom variable as ""), a hook's not at all.
func TestProbeExpansion(t *testing.T) {
	y := pod(`      command: ["/app"]
      workingDir: /
      securityContext: {runAsUser: 1, runAsGroup: 1}
      env:
        - {name: PORT, value: "80$(X)"}
        - name: NAME
          valueFrom: {fieldRef: {fieldPath: metadata.name}}
      livenessProbe:
        exec: {command: ["/check", "$(PORT)", "$(NAME)", "$(DB_SERVICE_HOST)", "$$(PORT)"]}
      lifecycle:
        postStart:
          exec: {command: ["/hook", "$(PORT)"]}
`)
	c := rulesOf(t, y, Options{})["Pod"].Containers["app"]
	want := [][]policyapi.Pattern{{"/check", "80$(X)", "", "$(DB_SERVICE_HOST)", "$(PORT)"}, {"/hook", "$(PORT)"}}
	if len(c.Exec) != 2 || !slices.Equal(c.Exec[0], want[0]) || !slices.Equal(c.Exec[1], want[1]) {
		t.Errorf("exec = %q, want %q", c.Exec, want)
	}
}
