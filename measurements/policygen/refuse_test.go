package policygen

import (
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// pod is a one-container Pod with the container fields given (YAML,
// indented for a container entry).
func pod(container string) string {
	return `apiVersion: v1
kind: Pod
metadata:
  name: p
spec:
  containers:
    - name: app
      image: ghcr.io/example/app@sha256:` + strings.Repeat("ab", 32) + `
` + container
}

const pinned = `      command: ["/app"]
      workingDir: /
      securityContext:
        runAsUser: 10
        runAsGroup: 10
`

// What the generator cannot pin it refuses, naming what is missing and
// how to give it.
func TestRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		yaml string
		o    Options
		want []string
	}{
		"no command, no image": {pod("      workingDir: /\n      securityContext:\n        runAsUser: 1\n"), Options{},
			[]string{"cannot pin the args of container app: the pod spec gives no command and no image config was given; pass --image ghcr.io/example/app@sha256:", "=LAYOUT or set command"}},
		"no working dir, no user": {pod("      command: [\"/app\"]\n"), Options{},
			[]string{"cannot pin the working dir of container app", "set workingDir", "cannot pin the user of container app", "set securityContext.runAsUser"}},
		"unpinned image, strict": {strings.Replace(pod(pinned), "@sha256:"+strings.Repeat("ab", 32), ":1.0", 1), Options{Strict: true},
			[]string{`image "ghcr.io/example/app:1.0" is not pinned by digest (--strict)`}},
		"unpinned files, strict": {pod(pinned), Options{Strict: true},
			[]string{`container app: the files of image "ghcr.io/example/app@sha256:`, `are not pinned (no image was given; --strict)`, "give --image"}},
		"the sandbox's files, strict": {pod(pinned), Options{Strict: true, SandboxImage: "registry.example/pause@sha256:" + strings.Repeat("cd", 32), Images: map[string]*Image{
			"app": {Source: "t", Layers: []policyapi.Layer{{Digest: "sha256:" + strings.Repeat("12", 32), Verity: strings.Repeat("34", 32), Blocks: 1}}},
			"registry.example/pause@sha256:" + strings.Repeat("cd", 32): {Source: "t", Config: ocispec.ImageConfig{Entrypoint: []string{"/pause"}}}}},
			[]string{`the sandbox: the files of image "registry.example/pause@sha256:`, `are not pinned (only its config is known; --strict)`}},
		"envFrom a ConfigMap not in the input": {pod(pinned + "      envFrom:\n        - configMapRef:\n            name: cfg\n"), Options{},
			[]string{"cannot pin the env of container app: envFrom[0] takes its variable names from ConfigMap cfg, which is not in the input"}},
		"envFrom a Secret not in the input": {pod(pinned + "      envFrom:\n        - secretRef:\n            name: s\n"), Options{},
			[]string{"Secret s, which is not in the input", "its values are not measured"}},
		"a typo":            {pod(pinned + "      comand: [\"/x\"]\n"), Options{}, []string{`YAML document 1: v1 Pod:`, `unknown field "comand"`}},
		"an old apiVersion": {"apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata:\n  name: d\n", Options{}, []string{`apiVersion "extensions/v1beta1" kind "Deployment" is not read`}},
		"no workload":       {"apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n", Options{}, []string{"the input has no Pod, Deployment"}},
		"a raw block device": {pod(pinned + "      volumeDevices:\n        - name: disk\n          devicePath: /dev/xvda\n"), Options{},
			[]string{"volumeDevices (raw block device /dev/xvda) are never given"}},
		"CAP_ prefix": {pod(strings.Replace(pinned, "        runAsUser: 10\n", "        runAsUser: 10\n        capabilities:\n          add: [CAP_NET_ADMIN]\n", 1)), Options{},
			[]string{`capability "CAP_NET_ADMIN": containerd makes it CAP_CAP_NET_ADMIN`}},
		"--secret for a container the pod lacks": {pod(pinned), Options{Secrets: []Secret{{Container: "db", Resource: "kbs:///a/b/c", Path: "/s"}}},
			[]string{`--secret names container "db", which the pod does not have (it has app)`}},
		"--allow-exec for a container the pod lacks": {pod(pinned), Options{Exec: map[string][][]policyapi.Pattern{"ap": {{"sh"}}}},
			[]string{`--allow-exec names container "ap"`}},
		"a sandbox image with no config": {pod(pinned), Options{SandboxImage: "registry.example/pause@sha256:" + strings.Repeat("cd", 32)},
			[]string{"cannot pin the sandbox container: no image config for sandbox image registry.example/pause@sha256:", "pass --image registry.example/pause@sha256:"}},
		"an image volume": {strings.Replace(pod(pinned+"      volumeMounts:\n        - name: v\n          mountPath: /v\n"), "spec:\n", "spec:\n  volumes:\n    - name: v\n      image:\n        reference: x\n", 1), Options{},
			[]string{"volume v is an image volume"}},
		"a secret without a broker": {pod(pinned), Options{Secrets: []Secret{{Container: "app", Resource: "kbs:///a/b/c", Path: "/s"}}},
			[]string{"kbs.url is required"}},
		"an image config with no user: root": {pod("      command: [\"/app\"]\n      workingDir: /\n"), Options{Images: map[string]*Image{"app": {Source: "t"}}},
			[]string{}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Generate([]byte(c.yaml), c.o)
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error does not say %q:\n%v", w, err)
				}
			}
		})
	}
}

// Loose pins are warned about: images not pinned by digest, env the
// generator could only assume, volumes of host content.
func TestWarns(t *testing.T) {
	y := strings.Replace(pod(`      command: ["/app"]
      workingDir: /
      securityContext:
        runAsUser: 10
        runAsNonRoot: true
      volumeMounts:
        - name: h
          mountPath: /host
`), "spec:\n", "spec:\n  volumes:\n    - name: h\n      hostPath:\n        path: /srv\n", 1)
	y = strings.Replace(y, "@sha256:"+strings.Repeat("ab", 32), ":1.0", 1)
	rs, err := Generate([]byte(y), Options{Layouts: map[string]string{"nginx": "/nonexistent"}})
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(rs[0].Warnings, "\n")
	for _, w := range []string{
		`container app: IMAGE "ghcr.io/example/app:1.0" IS NOT PINNED BY DIGEST`,
		`the sandbox: IMAGE "registry.k8s.io/pause:3.10.1" IS NOT PINNED`,
		"container app: no image config",
		"runAsUser 10 without runAsGroup and no image config: gid 0 is assumed",
		"volume h is the node's /srv: content the host reads and writes",
		"--image nginx names no container's image",
		`container app: THE FILES OF IMAGE "ghcr.io/example/app:1.0" ARE NOT PINNED (no image was given)`,
		`the sandbox: THE FILES OF IMAGE "registry.k8s.io/pause:3.10.1" ARE NOT PINNED (only its config is known)`,
	} {
		if !strings.Contains(all, w) {
			t.Errorf("no warning %q in:\n%s", w, all)
		}
	}
}

// A secret, or an emptyDir (kept in guest memory), below a volume shared
// over virtio-fs is warned about: the host can detach it, and the guest
// refuses the container.
func TestWarnsBelowShared(t *testing.T) {
	y := strings.Replace(pod(`      command: ["/app"]
      workingDir: /
      securityContext:
        runAsUser: 10
        runAsGroup: 10
      volumeMounts:
        - name: h
          mountPath: /data
        - name: e
          mountPath: /data/cache
`), "spec:\n", "spec:\n  volumes:\n    - name: h\n      hostPath:\n        path: /srv\n    - name: e\n      emptyDir: {}\n", 1)
	o := deploymentOptions(t)
	o.Images, o.Exec, o.PortForward = nil, nil, nil
	o.Secrets = []Secret{{Container: "app", Resource: "kbs:///default/key/db", Path: "/data/db"}}
	rs, err := Generate([]byte(y), o)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(rs[0].Warnings, "\n")
	for _, w := range []string{
		"container app: the emptydir mount on /data/cache is below the shared (virtio-fs) mount on /data",
		"container app: secret kbs:///default/key/db at /data/db is below the shared (virtio-fs) mount on /data",
	} {
		if !strings.Contains(all, w) {
			t.Errorf("no warning %q in:\n%s", w, all)
		}
	}
}

// TestLabelFieldRefPinned: a $(VAR) in the command whose value is a label
// or annotation the pod states (downward API fieldRef) is that value, not
// a pattern: with a pattern the host would choose that part of the
// command line (`--tier=frontend; wget … | sh`). One the pod does not
// state stays a pattern, and the generator says so loudly.
func TestLabelFieldRefPinned(t *testing.T) {
	y := strings.Replace(pod(`      command: ["/bin/sh", "-c", "exec /app/server --tier=$(TIER) --team=$(TEAM) --zone=$(ZONE)"]
      workingDir: /
      securityContext:
        runAsUser: 10
        runAsGroup: 10
      env:
        - name: TIER
          valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}
        - name: TEAM
          valueFrom: {fieldRef: {fieldPath: "metadata.annotations['example.com/team']"}}
        - name: ZONE
          valueFrom: {fieldRef: {fieldPath: "metadata.labels['zone']"}}
`), "  name: p\n", "  name: p\n  labels: {tier: frontend}\n  annotations: {example.com/team: shop}\n", 1)
	rs, err := Generate([]byte(y), Options{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := initdata.Parse(rs[0].InitData)
	if err != nil {
		t.Fatal(err)
	}
	app := d.Policy.Containers["app"]
	if got := string(app.Args[2]); got != `re:exec /app/server --tier=frontend --team=shop --zone=(?s:.*)` {
		t.Errorf("args[2] = %q: want the stated label and annotation exact, the unstated label a pattern", got)
	}
	for _, e := range []string{"TIER=frontend", "TEAM=shop"} {
		if !slices.Contains(app.Env, policyapi.Pattern(e)) {
			t.Errorf("env lacks the exact %q: %q", e, app.Env)
		}
	}
	if w := strings.Join(rs[0].Warnings, "\n"); !strings.Contains(w, "container app: ARGS[2] IS A PATTERN") {
		t.Errorf("no warning that args[2] is a pattern in:\n%s", w)
	}
}

// TestShareProcessNamespace: only a pod that shares its process namespace
// gets rules that let its containers join the sandbox's.
func TestShareProcessNamespace(t *testing.T) {
	for _, shared := range []bool{false, true} {
		y := pod(pinned)
		if shared {
			y = strings.Replace(y, "spec:\n", "spec:\n  shareProcessNamespace: true\n", 1)
		}
		if got := rulesOf(t, y, Options{})["Pod"].Containers["app"].SharePIDNamespace; got != shared {
			t.Errorf("shareProcessNamespace %v: share_pid_namespace %v", shared, got)
		}
	}
}

// TestDNSConfigPinned: with dnsPolicy None the pod's nameservers are all
// its spec names, and the policy pins them, with its search domains and
// its hostAliases (the /etc/hosts entries beside the standard ones);
// otherwise they are the cluster's or the node's, which the generator
// cannot know.
func TestDNSConfigPinned(t *testing.T) {
	for _, c := range []struct {
		spec               string
		dns, search, hosts []policyapi.Pattern
		hostname           policyapi.Pattern
	}{
		{"  dnsPolicy: None\n  dnsConfig:\n    nameservers: [10.0.0.53, \"fd00::53\"]\n    searches: [ns1.svc.example]\n  hostAliases:\n  - ip: 10.1.2.3\n    hostnames: [db.internal, db]\n",
			[]policyapi.Pattern{"10.0.0.53", "fd00::53"}, []policyapi.Pattern{"ns1.svc.example"}, []policyapi.Pattern{"10.1.2.3 db.internal", "10.1.2.3 db"}, "p"},
		{"  dnsPolicy: None\n  hostname: web-0\n", []policyapi.Pattern{}, []policyapi.Pattern{}, []policyapi.Pattern{}, "web-0"},
		{"  dnsPolicy: None\n  hostNetwork: true\n", []policyapi.Pattern{}, []policyapi.Pattern{}, []policyapi.Pattern{}, ""},
		{"  dnsConfig:\n    nameservers: [10.0.0.53]\n", nil, nil, nil, ""},
		{"", nil, nil, nil, ""},
	} {
		var dns, search, hosts []policyapi.Pattern
		var hostname policyapi.Pattern
		if n := rulesOf(t, strings.Replace(pod(pinned), "spec:\n", "spec:\n"+c.spec, 1), Options{})["Pod"].Network; n != nil {
			dns, search, hosts, hostname = n.DNS, n.DNSSearch, n.Hosts, n.Hostname
		}
		if hostname != c.hostname {
			t.Errorf("%q: hostname %q, want %q", c.spec, hostname, c.hostname)
		}
		for _, f := range []struct {
			name      string
			got, want []policyapi.Pattern
		}{{"dns", dns, c.dns}, {"dns_search", search, c.search}, {"hosts", hosts, c.hosts}} {
			if !slices.Equal(f.got, f.want) || (f.got == nil) != (f.want == nil) {
				t.Errorf("%q: %s %q, want %q", c.spec, f.name, f.got, f.want)
			}
		}
	}
}

// TestStrictGroupsPinnedWithoutImage: under supplementalGroupsPolicy
// Strict a process's supplementary groups are its gid, supplementalGroups
// and fsGroup, whatever the image's /etc/group says: pinned without the
// image's config too.
func TestStrictGroupsPinnedWithoutImage(t *testing.T) {
	y := strings.Replace(pod(pinned), "spec:\n", "spec:\n  securityContext:\n    supplementalGroupsPolicy: Strict\n    supplementalGroups: [5000]\n    fsGroup: 2000\n", 1)
	got := rulesOf(t, y, Options{})["Pod"].Containers["app"].AdditionalGIDs
	if got == nil || !slices.Equal(*got, []uint32{10, 2000, 5000}) {
		t.Fatalf("additional_gids %v, want [10 2000 5000]", got)
	}
}
