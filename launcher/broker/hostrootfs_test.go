package broker

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	guestkbs "github.com/c8s-dev/c8s/guest/kbs"
)

// A rule without pinned layers runs the root file system the host
// attaches, and so the host's binaries under the owner's argv: refused by
// default, naming the rule and what to pin. The owner's opt-out,
// AllowHostRootfsPods, releases to it, and to nothing else the host could
// run code under (audit mode, a shell script of the host's).
func TestHostRootfsRefused(t *testing.T) {
	f := newFixture(t)
	f.launch(f.doc(hostRootfsInitData))
	c := f.client()
	_, err := c.Fetch(context.Background(), []string{dbPassword})
	var e *guestkbs.Error
	if !errors.As(err, &e) || e.Status != http.StatusUnauthorized {
		t.Fatalf("err = %v, want a 401", err)
	}
	for _, want := range []string{`rule "app" does not pin its image's layers ([[policy.containers.app.layers]])`, "the host supplies its root file system", "c8s-measure policy --image", "allow_host_rootfs = true", "--allow-host-rootfs-pods"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v: does not say %q", err, want)
		}
	}
	f.broker.AllowHostRootfsPods = true
	if got, err := c.Fetch(context.Background(), []string{dbPassword}); err != nil || string(got[0]) != secret {
		t.Fatalf("with AllowHostRootfsPods: %q, %v", got, err)
	}
	for name, doc := range map[string]string{
		"audit mode":             strings.Replace(hostRootfsInitData, "[policy]\n", "[policy]\naudit = true\n", 1),
		"a script of the host's": hostRootfsInitData + "exec = [[\"sh\", \"-c\", \"re:.*\"]]\n",
	} {
		f.launch(f.doc(doc))
		if _, err := f.client().Fetch(context.Background(), []string{dbPassword}); err == nil {
			t.Errorf("%s: released under AllowHostRootfsPods", name)
		}
	}
}

// The narrower opt-out: a workload of the owner's resource policy with
// allow_host_rootfs accepts its own documents only.
func TestHostRootfsWorkload(t *testing.T) {
	f := newFixture(t)
	doc := f.doc(hostRootfsInitData)
	f.launch(doc)
	policy := func(allow bool, digest []byte) *ResourcePolicy {
		p, err := ParseResourcePolicy(fmt.Appendf(nil, "[workloads.app]\ninit_data = [%q]\nallow_host_rootfs = %v\n\n[[resources]]\npath = %q\nworkloads = [\"app\"]\n", hex.EncodeToString(digest), allow, dbPassword), false, "")
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	own := initdata.Digest([]byte(doc))
	other := initdata.Digest([]byte(f.doc(podInitData)))
	f.broker.InitData = append(f.broker.InitData, []byte(f.doc(podInitData)))
	for name, tc := range map[string]struct {
		p    *ResourcePolicy
		want string // "" = released
	}{
		"the workload allows it":     {policy(true, own[:]), ""},
		"the workload does not":      {policy(false, own[:]), `rule "app" does not pin its image's layers`},
		"another workload's opt-out": {policy(true, other[:]), `rule "app" does not pin its image's layers`},
	} {
		f.broker.ResourcePolicy = tc.p
		_, err := f.client().Fetch(context.Background(), []string{dbPassword})
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err = %v, want %q", name, err, tc.want)
		}
	}
	if _, err := ParseResourcePolicy([]byte("[workloads.app]\nmeasurements = [\""+strings.Repeat("ab", 48)+"\"]\nallow_host_rootfs = true\n[[resources]]\npath = \"a/b/c\"\nworkloads = [\"app\"]\n"), false, ""); err == nil || !strings.Contains(err.Error(), "allow_host_rootfs") {
		t.Errorf("allow_host_rootfs without init data: err = %v", err)
	}
}

// TestHostRootfsOptOutIsTheWorkloadsOwn: the owner opts one workload into
// the node's root file systems (allow_host_rootfs with its document). A
// second workload pins only the launch measurement, which every pod of
// the image shares, and holds the secret. The host launches the first
// workload's document: the broker accepts it, through the first
// workload's opt-out, but the second workload never opted in, so its
// rule gives the pod nothing.
func TestHostRootfsOptOutIsTheWorkloadsOwn(t *testing.T) {
	f := newFixture(t)
	doc := f.doc(hostRootfsInitData)
	f.launch(doc)
	own := initdata.Digest([]byte(doc))
	p, err := ParseResourcePolicy(fmt.Appendf(nil, `[workloads.opted]
init_data = [%q]
allow_host_rootfs = true

[workloads.broad]
measurements = [%q]

[[resources]]
path = "default/other/x"
workloads = ["opted"]

[[resources]]
path = %q
workloads = ["broad"]
`, hex.EncodeToString(own[:]), hex.EncodeToString(f.measurement[:]), dbPassword), false, "")
	if err != nil {
		t.Fatal(err)
	}
	f.broker.ResourcePolicy = p
	_, err = f.client().Fetch(context.Background(), []string{dbPassword})
	if err == nil || !strings.Contains(err.Error(), "does not set allow_host_rootfs") {
		t.Fatalf("a measurement-only workload's secret for a document accepted through another's opt-out: err = %v", err)
	}
	// The workload that opted in is the pod, for what it is given.
	p.Workloads["broad"].AllowHostRootfs = true
	if got, err := f.client().Fetch(context.Background(), []string{dbPassword}); err != nil || string(got[0]) != secret {
		t.Fatalf("once the workload opts in too: %q, %v", got, err)
	}
}
