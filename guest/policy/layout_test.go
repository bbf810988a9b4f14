package policy

import (
	"fmt"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

const saDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// A tmpfs the rule allows, on a destination below the service account's
// virtio-fs share: the host can detach it (by replacing the share's entry
// it sits on) and show its own files there. Refused, naming both.
func TestMaliciousHostMountBelowSharedMount(t *testing.T) {
	doc := strings.Replace(podPolicy, `{ destination = "/cache", kind = "tmpfs" },`,
		`{ destination = "/cache", kind = "tmpfs" },
  { destination = "`+saDir+`/cache", kind = "tmpfs" },`, 1)
	e := evaluator(t, doc)
	s := appSpec()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: saDir + "/cache", Type: "tmpfs", Source: "tmpfs"})
	_, err := create(t, e, s)
	field := "mounts[" + itoa(len(s.Mounts)-1) + "].destination"
	d := denied(t, err, field, "")
	if !strings.Contains(d.Error(), saDir+"/cache") || !strings.Contains(d.Error(), `"`+saDir+`"`) {
		t.Errorf("denial %q does not name the mount and the share", d)
	}
	// The same tmpfs elsewhere, and the share itself, are fine.
	s = appSpec()
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/cache", Type: "tmpfs", Source: "tmpfs"})
	if _, err := create(t, e, s); err != nil {
		t.Fatalf("a tmpfs beside the share: %v", err)
	}
}

// A secret whose path (the rule's, or the [[kbs.secrets]] entry's) lies
// below a shared mount: the host could detach its bind and serve its own
// file as the secret. Refused, naming both.
func TestMaliciousHostSecretBelowSharedMount(t *testing.T) {
	const res = "kbs:///default/key/db"
	for _, tc := range []struct {
		name, rulePath, kbsPath string
	}{
		{"rule path", saDir + "/db", "/etc/db"},
		{"kbs path", "", saDir + "/token2"},
		// The secret's bind over the shared mount itself sits on the
		// host's entry as well.
		{"rule path on the share", saDir, "/etc/db"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := strings.Replace(podPolicy, `secrets = [{ resource = "kbs:///default/key/db", path = "/etc/app/db" }]`,
				`secrets = [{ resource = "kbs:///default/key/db", path = "`+tc.rulePath+`" }]`, 1)
			e := evaluator(t, doc)
			s := appSpec()
			_, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e),
				SecretPaths: map[string][]string{res: {tc.kbsPath}}})
			d := denied(t, err, "secret "+res, "policy.containers.app.secrets[0]")
			want := tc.rulePath
			if want == "" {
				want = tc.kbsPath
			}
			if !strings.Contains(d.Error(), want) || !strings.Contains(d.Error(), `"`+saDir+`"`) {
				t.Errorf("denial %q does not name the secret's path %s and the share", d, want)
			}
		})
	}
	// A resource the document lists twice is bound at each of its paths:
	// each is checked, whichever comes first.
	doc := strings.Replace(podPolicy, `secrets = [{ resource = "kbs:///default/key/db", path = "/etc/app/db" }]`,
		`secrets = [{ resource = "kbs:///default/key/db" }]`, 1)
	for _, paths := range [][]string{{"/run/secrets/db", saDir + "/db"}, {saDir + "/db", "/run/secrets/db"}} {
		e := evaluator(t, doc)
		s := appSpec()
		_, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e),
			SecretPaths: map[string][]string{res: paths}})
		if d := denied(t, err, "secret "+res, "policy.containers.app.secrets[0]"); d.Actual != `"`+saDir+`/db"` {
			t.Errorf("paths %v: denial %v, want the one below the share named", paths, d)
		}
	}
	// The policy's own layout: the secret at /etc/app/db.
	e := evaluator(t, podPolicy)
	s := appSpec()
	if _, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e),
		SecretPaths: map[string][]string{res: {saDir + "/db"}}}); err != nil {
		t.Fatalf("the secret at the rule's /etc/app/db: %v", err)
	}
}

// The mesh files (the workload's key and the trust bundle it checks peers
// with) are bound into a container the mesh names after the spec's
// mounts: at or below a shared mount, the host could detach them and
// serve its own key and bundle.
func TestMaliciousHostMeshFilesOnSharedMount(t *testing.T) {
	for _, dir := range []string{saDir + "/mesh", saDir} {
		e := evaluator(t, podPolicy)
		s := appSpec()
		_, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e),
			SecretPaths: map[string][]string{"kbs:///default/key/db": {"/etc/app/db"}}, MeshDir: dir, MeshInto: []string{"app"}})
		d := denied(t, err, "mesh files", "mesh.containers")
		if !strings.Contains(d.Error(), `"`+saDir+`"`) {
			t.Errorf("denial %q does not name the share", d)
		}
	}
	// A container the mesh does not name gets no mesh files.
	e := evaluator(t, podPolicy)
	s := appSpec()
	if _, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e),
		SecretPaths: map[string][]string{"kbs:///default/key/db": {"/etc/app/db"}}, MeshDir: saDir, MeshInto: []string{"other"}}); err != nil {
		t.Fatalf("a container without mesh files: %v", err)
	}
}

// A VM runs one pod: a second container matching [policy.sandbox] is
// refused, so that the host cannot start a sandbox of its own for the
// pod's containers to join or port-forward to reach.
func TestMaliciousHostSecondSandbox(t *testing.T) {
	e := evaluator(t, podPolicy)
	sb := sandbox(t, e)
	if !sb.PodSandbox() {
		t.Fatal("the admitted sandbox is not the pod's sandbox")
	}
	s := sandboxSpec()
	c, err := e.CreateContainer(&CreateContainer{ID: "pod2", Spec: s, MountKinds: kindsOf(s.Mounts)})
	d := denied(t, err, AnnotationContainerType, "policy.sandbox")
	if c != nil || !strings.Contains(d.Error(), `"pod"`) {
		t.Errorf("second sandbox: %v, %q; want refused, naming the pod's sandbox", c, d)
	}
	// A create of the sandbox that failed later gives the claim back.
	e.ReleaseSandbox(sb)
	if _, err := e.CreateContainer(&CreateContainer{ID: "pod2", Spec: s, MountKinds: kindsOf(s.Mounts)}); err != nil {
		t.Fatalf("the sandbox after the first one's create failed: %v", err)
	}
	// An app container is not a sandbox.
	if app, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: appSpec(), MountKinds: kindsOf(appSpec().Mounts), Joined: sb}); err != nil || app.PodSandbox() {
		t.Fatalf("app: %v, sandbox %v", err, app.PodSandbox())
	}
}

// TestMaliciousHostSharesPIDNamespace: a pod that does not share its
// process namespace (shareProcessNamespace false, the default) gives each
// container its own; the host putting a container in the sandbox's would
// let it see the pod's other processes, their environment and roots
// through /proc. Only a rule with share_pid_namespace may join it.
func TestMaliciousHostSharesPIDNamespace(t *testing.T) {
	e := evaluator(t, podPolicy)
	sb := sandbox(t, e)
	s := appSpec()
	s.Linux.Namespaces[0].Path = "/proc/77/ns/pid"
	_, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sb})
	if d := denied(t, err, "linux.namespaces[0].path", "policy.containers.app.share_pid_namespace"); !strings.Contains(d.Error(), "sandbox's pid namespace") {
		t.Errorf("denial %q does not say what was joined", d)
	}
	shared := strings.Replace(podPolicy, "[policy.containers.app]\n", "[policy.containers.app]\nshare_pid_namespace = true\n", 1)
	if shared == podPolicy {
		t.Fatal("the test policy has no app rule to change")
	}
	e = evaluator(t, shared)
	if _, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e)}); err != nil {
		t.Fatalf("a pod that shares its process namespace: %v", err)
	}
}

// TestPodShmStandardOnlyAtDevShm: the pod's /dev/shm in guest memory
// (podshm) is a standard mount at /dev/shm, as containerd gives every
// container one; the same guest directory elsewhere needs a rule.
func TestPodShmStandardOnlyAtDevShm(t *testing.T) {
	e := evaluator(t, podPolicy)
	sb := sandbox(t, e)
	for _, c := range []struct {
		dest string
		ok   bool
	}{{"/dev/shm", true}, {"/data", false}} {
		s := appSpec()
		s.Mounts = append(s.Mounts, specs.Mount{Destination: c.dest, Type: "bind", Source: "/run/c8s/emptydir/.pod/shm", Options: []string{"rbind", "rw"}})
		kinds := kindsOf(s.Mounts)
		kinds[len(kinds)-1] = policyapi.KindPodShm
		_, err := e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kinds, Joined: sb})
		if c.ok && err != nil {
			t.Errorf("the pod's /dev/shm: %v", err)
		}
		if !c.ok {
			denied(t, err, fmt.Sprintf("mounts[%d]", len(s.Mounts)-1), "policy.containers.app.mounts")
		}
	}
}

// A terminal the pod spec does not give the container: on a tty, what the
// host writes to stdin is typed input, where ^C, ^\ and ^Z are SIGINT,
// SIGQUIT and SIGTSTP that the rule's signals do not list. Only a rule
// with tty (c8s-measure policy writes it from the pod spec) allows one.
func TestMaliciousHostGivesATerminal(t *testing.T) {
	e := evaluator(t, podPolicy)
	s := appSpec()
	req := &CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e),
		SecretPaths: map[string][]string{"kbs:///default/key/db": {"/etc/app/db"}}, Terminal: true}
	_, err := e.CreateContainer(req)
	denied(t, err, "stdio.terminal", "policy.containers.app.tty")

	doc := strings.Replace(podPolicy, "[policy.containers.app]\n", "[policy.containers.app]\ntty = true\n", 1)
	if doc == podPolicy {
		t.Fatal("no [policy.containers.app] to add tty to")
	}
	e = evaluator(t, doc)
	req.Joined = sandbox(t, e)
	if _, err := e.CreateContainer(req); err != nil {
		t.Fatalf("a terminal under tty = true: %v", err)
	}
}

// TestMaliciousHostSecretBelowShareThroughImageSymlink: the secret's path
// as written (/run/secrets/...) is apart from the service account's
// share (/var/run/secrets/...), but the image links /var/run to /run, so
// crun binds the secret below the share. ResolvedShares, given the root's
// resolution, refuses it; with nothing resolving elsewhere it has nothing
// to add.
func TestMaliciousHostSecretBelowShareThroughImageSymlink(t *testing.T) {
	const res = "kbs:///default/key/db"
	// The image links /var/run and /srv to /run.
	resolve := func(p string) string {
		for _, l := range []string{"/var/run", "/srv"} {
			if p == l || strings.HasPrefix(p, l+"/") {
				return "/run" + strings.TrimPrefix(p, l)
			}
		}
		return p
	}
	for _, alias := range []string{"/run/", "/srv/"} {
		secret := strings.Replace(saDir, "/var/run/", alias, 1) + "/db"
		doc := strings.Replace(podPolicy, `secrets = [{ resource = "kbs:///default/key/db", path = "/etc/app/db" }]`,
			`secrets = [{ resource = "kbs:///default/key/db", path = "`+secret+`" }]`, 1)
		e := evaluator(t, doc)
		s := appSpec()
		r := &CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e), SecretPaths: map[string][]string{res: {"/x"}}}
		c, err := e.CreateContainer(r)
		if err != nil {
			t.Fatalf("as written, the secret %s is apart from the share: %v", secret, err)
		}
		if err := e.ResolvedShares(c, r, func(p string) string { return p }); err != nil {
			t.Fatalf("nothing resolves elsewhere: %v", err)
		}
		d := denied(t, e.ResolvedShares(c, r, resolve), "secret "+res, "policy.containers.app.secrets[0]")
		if !strings.Contains(d.Error(), `"`+saDir+`" ("`+strings.Replace(saDir, "/var/run/", "/run/", 1)+`" in the container's root`) {
			t.Errorf("secret %s: denial %q does not name the share and where it resolves", secret, d)
		}
	}
}
