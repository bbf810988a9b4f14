package policy

import (
	"strconv"
	"strings"
	"testing"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// The image of the layered policy: three layers, bottom first.
var (
	baseLayer = policyapi.Layer{Digest: "sha256:" + strings.Repeat("1a", 32), Verity: strings.Repeat("b1", 32), Blocks: 100}
	libLayer  = policyapi.Layer{Digest: "sha256:" + strings.Repeat("2a", 32), Verity: strings.Repeat("b2", 32), Blocks: 20}
	appLayer  = policyapi.Layer{Digest: "sha256:" + strings.Repeat("3a", 32), Verity: strings.Repeat("b3", 32), Blocks: 3}
	evilLayer = policyapi.Layer{Digest: "sha256:" + strings.Repeat("ee", 32), Verity: strings.Repeat("e1", 32), Blocks: 3}
)

// layeredPolicy is podPolicy with app's image pinned to its layers.
func layeredPolicy(t *testing.T) *Evaluator {
	t.Helper()
	doc := podPolicy
	for _, l := range []policyapi.Layer{baseLayer, libLayer, appLayer} {
		doc = strings.Replace(doc, "\n[policy.containers.sidecar]", "\n[[policy.containers.app.layers]]\ndigest = \""+l.Digest+"\"\nverity = \""+l.Verity+"\"\nblocks = "+strconv.FormatUint(l.Blocks, 10)+"\n\n[policy.containers.sidecar]", 1)
	}
	return evaluator(t, doc)
}

// createRoot asks e to create app with root r.
func createRoot(t *testing.T, e *Evaluator, r Root) (*Container, error) {
	t.Helper()
	s := appSpec()
	return e.CreateContainer(&CreateContainer{ID: "abc", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e), Root: r})
}

// The pinned image's layers, as the policy names them, are allowed, and
// the container is opened with the policy's roots.
func TestPinnedLayersAllowed(t *testing.T) {
	e := layeredPolicy(t)
	c, err := createRoot(t, e, Root{Layers: []policyapi.Layer{baseLayer, libLayer, appLayer}})
	if err != nil {
		t.Fatal(err)
	}
	pinned := c.PinnedLayers()
	if len(pinned) != 3 || pinned[0] != baseLayer || pinned[2] != appLayer {
		t.Fatalf("PinnedLayers = %+v, want the rule's three", pinned)
	}
	// The sidecar's rule pins nothing: its root is the host's, as before.
	s := appSpec()
	s.Annotations[AnnotationContainerName], s.Annotations[AnnotationImageName] = "sidecar", "ghcr.io/example/sidecar@sha256:"+strings.Repeat("0", 64)
	s.Process.Args, s.Process.User.UID, s.Process.User.GID, s.Process.Env = []string{"/sidecar"}, 0, 0, nil
	s.Mounts = standardMounts()
	side, err := e.CreateContainer(&CreateContainer{ID: "side", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e),
		Root: Root{Layers: []policyapi.Layer{evilLayer}}})
	if err != nil {
		t.Fatal(err)
	}
	if side.PinnedLayers() != nil {
		t.Fatalf("a rule without layers pins %+v", side.PinnedLayers())
	}
}

// Each way a host could change the image under a rule that pins its
// layers is refused, naming the rule, the field, and what it expected.
func TestMaliciousHostLayers(t *testing.T) {
	rule := "policy.containers.app.layers"
	for name, tc := range map[string]struct {
		root             Root
		field, rule      string
		actual, expected string
	}{
		"host-built root disk": {Root{HostDisk: true}, "rootfs.source", rule, "(a root disk the host built)", "the image's 3 layers"},
		"layer not in the policy": {Root{Layers: []policyapi.Layer{baseLayer, libLayer, appLayer, evilLayer}},
			"layers[3].digest", rule, `"` + evilLayer.Digest + `"`, "3 layers"},
		"layer swapped": {Root{Layers: []policyapi.Layer{baseLayer, evilLayer, appLayer}},
			"layers[1].digest", rule, `"` + evilLayer.Digest + `"`, `"` + libLayer.Digest + `"`},
		"layer dropped": {Root{Layers: []policyapi.Layer{baseLayer, libLayer}},
			"layers[2].digest", rule, "", `"` + appLayer.Digest + `"`},
		"layers reordered": {Root{Layers: []policyapi.Layer{libLayer, baseLayer, appLayer}},
			"layers[0].digest", rule, `"` + libLayer.Digest + `"`, `"` + baseLayer.Digest + `"`},
		"root hash from the host": {Root{Layers: []policyapi.Layer{baseLayer, {Digest: libLayer.Digest, Verity: evilLayer.Verity, Blocks: libLayer.Blocks}, appLayer}},
			"layers[1].root_hash", rule + "[1].verity", `"` + evilLayer.Verity + `"`, `"` + libLayer.Verity + `"`},
		"data blocks from the host": {Root{Layers: []policyapi.Layer{baseLayer, libLayer, {Digest: appLayer.Digest, Verity: appLayer.Verity, Blocks: 2}}},
			"layers[2].data_blocks", rule + "[2].blocks", "2", "3"},
		"no root at all": {Root{}, "layers[0].digest", rule, "", `"` + baseLayer.Digest + `"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := createRoot(t, layeredPolicy(t), tc.root)
			d := denied(t, err, tc.field, tc.rule)
			if d.Actual != tc.actual || d.Expected != tc.expected {
				t.Errorf("denial %q: actual %q expected %q; want %q and %q", d, d.Actual, d.Expected, tc.actual, tc.expected)
			}
			for _, want := range []string{tc.field, tc.rule} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the message %q does not name %q", err, want)
				}
			}
		})
	}
}

// In audit mode a layer denial is logged and the request allowed; the
// rule's layers are still what PinnedLayers gives the guest.
func TestLayersAudit(t *testing.T) {
	e := layeredPolicy(t)
	e.p.Audit = true
	var logged []*Denial
	e.onDenial = func(d *Denial, enforced bool) { logged = append(logged, d) }
	c, err := createRoot(t, e, Root{Layers: []policyapi.Layer{evilLayer}})
	if err != nil {
		t.Fatal(err)
	}
	if len(logged) == 0 || logged[0].Field != "layers[0].digest" {
		t.Fatalf("audit logged %v", logged)
	}
	if len(c.PinnedLayers()) != 3 {
		t.Fatal("audit mode dropped the rule's layers")
	}
}

// The built-in policy of a VM launched without init data pins no image:
// layers are allowed with the host's roots, and so is a disk the host
// built, as before.
func TestZeroLaunchDefaultLayers(t *testing.T) {
	e := New(policyapi.ZeroLaunchDefault(), nil)
	for _, r := range []Root{{Layers: []policyapi.Layer{evilLayer}}, {HostDisk: true}} {
		s := appSpec()
		s.Mounts = standardMounts()
		c, err := e.CreateContainer(&CreateContainer{ID: "x", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e), Root: r})
		if err != nil {
			t.Fatalf("root %+v under the zero-launch default: %v", r, err)
		}
		if c.PinnedLayers() != nil {
			t.Fatalf("the zero-launch default pins %+v", c.PinnedLayers())
		}
	}
}
