package task

import (
	"errors"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/launcher/layercache"
)

type fakeCached map[digest.Digest]bool

func (f fakeCached) Lookup(d digest.Digest) (layercache.Entry, error) {
	if f[d] {
		return layercache.Entry{}, nil
	}
	return layercache.Entry{}, layercache.ErrNotCached
}

func TestGuestPulls(t *testing.T) {
	l1, l2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	ref := "registry:5000/app@sha256:" + strings.Repeat("a", 64)
	pullOnly := &policyapi.Container{Pull: ref}
	both := &policyapi.Container{Pull: ref, Layers: []policyapi.Layer{{Digest: l1}, {Digest: l2}}}
	layersOnly := &policyapi.Container{Layers: []policyapi.Layer{{Digest: l1}}}
	all := fakeCached{digest.Digest(l1): true, digest.Digest(l2): true}
	half := fakeCached{digest.Digest(l1): true}
	for name, c := range map[string]struct {
		mode  string
		rule  *policyapi.Container
		cache Cached
		want  bool
	}{
		"no rule":                   {"", nil, all, false},
		"rule without pull":         {"", layersOnly, half, false},
		"pull only":                 {"", pullOnly, all, true},
		"pull only, never":          {"never", pullOnly, all, false},
		"layers all cached":         {"auto", both, all, false},
		"a layer not cached":        {"", both, half, true},
		"always, all cached":        {"always", both, all, true},
		"never, a layer not cached": {"never", both, half, false},
	} {
		got, why := guestPulls(c.mode, c.rule, func() (Cached, error) { return c.cache, nil })
		if got != c.want || got && why == "" {
			t.Errorf("%s: guestPulls = %v (%q), want %v", name, got, why, c.want)
		}
	}
	if got, _ := guestPulls("", both, func() (Cached, error) { return nil, errors.New("no cache") }); !got {
		t.Error("a cache that does not open: the guest should pull")
	}
}

// The rule is found as the guest finds it: the sandbox's, a CRI
// container's by name, else by container id.
func TestPullRule(t *testing.T) {
	doc := []byte(`version = "0.1"
[policy.sandbox]
image = "pause"
args = ["/pause"]
working_dir = "/"
uid = 0
gid = 0
[policy.containers.app]
image = "app"
args = ["/app"]
working_dir = "/"
uid = 0
gid = 0
pull = "registry:5000/app@sha256:` + strings.Repeat("a", 64) + `"
pull_plain_http = true
`)
	spec := func(typ, name string) *specs.Spec {
		return &specs.Spec{Annotations: map[string]string{ContainerTypeAnnotation: typ, ContainerNameAnnotation: name}}
	}
	if r := pullRule(doc, "x", spec("container", "app")); r == nil || r.Pull == "" {
		t.Fatalf("CRI container app: %+v", r)
	}
	if r := pullRule(doc, "app", &specs.Spec{}); r == nil || r.Pull == "" {
		t.Fatalf("container id app: %+v", r)
	}
	if r := pullRule(doc, "app", spec("sandbox", "")); r == nil || r.Pull != "" {
		t.Fatalf("sandbox: %+v", r)
	}
	if r := pullRule(doc, "x", spec("container", "db")); r != nil {
		t.Fatalf("container db: %+v", r)
	}
	if r := pullRule(nil, "app", &specs.Spec{}); r != nil {
		t.Fatal("no init data, a rule")
	}
}
