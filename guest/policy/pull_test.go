package policy

import (
	"strconv"
	"strings"
	"testing"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

const pullRef = "registry.example:5000/app@sha256:0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e0f6e"

// pulledPolicy is podPolicy with app's image named for the guest to pull,
// and its layers pinned as well if layers.
func pulledPolicy(t *testing.T, layers bool) *Evaluator {
	t.Helper()
	doc := podPolicy
	if layers {
		doc = layeredDoc()
	}
	doc = strings.Replace(doc, "\n[policy.containers.sidecar]", "\npull = \""+pullRef+"\"\n\n[policy.containers.sidecar]", 1)
	if layers {
		// The pull key must sit in app's table, before its layers.
		doc = strings.Replace(doc, "\npull = \""+pullRef+"\"\n", "\n", 1)
		doc = strings.Replace(doc, "\n[[policy.containers.app.layers]]", "\npull = \""+pullRef+"\"\n\n[[policy.containers.app.layers]]", 1)
	}
	return evaluator(t, doc)
}

// layeredDoc is layeredPolicy's document.
func layeredDoc() string {
	doc := podPolicy
	for _, l := range []policyapi.Layer{baseLayer, libLayer, appLayer} {
		doc = strings.Replace(doc, "\n[policy.containers.sidecar]", "\n[[policy.containers.app.layers]]\ndigest = \""+l.Digest+"\"\nverity = \""+l.Verity+"\"\nblocks = "+strconv.FormatUint(l.Blocks, 10)+"\n\n[policy.containers.sidecar]", 1)
	}
	return doc
}

// A rule with a pull reference lets the host offer no root: the guest
// pulls the rule's reference, never one of the host's.
func TestPullEmptyRootAllowed(t *testing.T) {
	for _, layers := range []bool{false, true} {
		c, err := createRoot(t, pulledPolicy(t, layers), Root{Empty: true})
		if err != nil {
			t.Fatalf("layers %v: %v", layers, err)
		}
		img, ok := c.PullImage()
		if !ok || img.Ref.String() != pullRef || img.Auth != "" || img.PlainHTTP {
			t.Fatalf("PullImage = %+v, %v; want %s", img, ok, pullRef)
		}
	}
}

// A rule that binds the image only by its pull reference refuses every
// root the host offers: nothing would bind a disk of the host's to the
// image. With layers pinned too, the node's layer disks pass the layers
// check.
func TestMaliciousHostPullRoot(t *testing.T) {
	rule := "policy.containers.app.pull"
	for name, r := range map[string]Root{
		"host-built root disk":                     {HostDisk: true},
		"host's layer disks":                       {Layers: []policyapi.Layer{evilLayer}},
		"the pinned layers, unpinned in this rule": {Layers: []policyapi.Layer{baseLayer, libLayer, appLayer}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := createRoot(t, pulledPolicy(t, false), r)
			d := denied(t, err, "rootfs", rule)
			if !strings.Contains(d.Expected, pullRef) {
				t.Errorf("denial %q does not name the pull reference", d)
			}
		})
	}
	if _, err := createRoot(t, pulledPolicy(t, true), Root{Layers: []policyapi.Layer{baseLayer, libLayer, appLayer}}); err != nil {
		t.Fatalf("the pinned layers under a rule that also pulls: %v", err)
	}
	_, err := createRoot(t, pulledPolicy(t, true), Root{Layers: []policyapi.Layer{evilLayer}})
	denied(t, err, "layers[0].digest", "policy.containers.app.layers")
	// No root and nothing to pull: refused.
	_, err = createRoot(t, layeredPolicy(t), Root{Empty: true})
	denied(t, err, "rootfs", rule)
}

// No policy, or the zero-launch default: nothing to pull.
func TestPullImageUngoverned(t *testing.T) {
	var c *Container
	if _, ok := c.PullImage(); ok {
		t.Fatal("an ungoverned container pulls")
	}
	e := New(policyapi.ZeroLaunchDefault(), nil)
	s := appSpec()
	s.Mounts = standardMounts()
	_, err := e.CreateContainer(&CreateContainer{ID: "x", Spec: s, MountKinds: kindsOf(s.Mounts), Joined: sandbox(t, e), Root: Root{Empty: true}})
	if err == nil {
		t.Fatal("the zero-launch default allowed a container with no root")
	}
}
