package labels

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
)

var defaultTaint = &Taint{Key: "c8s.io/confidential", Value: "true", Effect: "NoSchedule"}

func known(n int64) discovery.Capacity { return discovery.Capacity{Total: n, Known: true} }

var (
	snpHost = discovery.Result{
		SNP: discovery.SNPInfo{Enabled: true, ASIDs: known(99)},
		KVM: discovery.KVMInfo{Device: true},
		Sim: discovery.SimInfo{Slots: 4},
	}
	tdxHost = discovery.Result{
		TDX: discovery.TDXInfo{Enabled: true, Keys: known(63)},
		KVM: discovery.KVMInfo{Device: true},
	}
	sgxHost = discovery.Result{
		SGX: discovery.SGXInfo{Enabled: true, EPCBytes: known(1 << 30)},
		KVM: discovery.KVMInfo{Device: true},
	}
	simHost = discovery.Result{Sim: discovery.SimInfo{Slots: 2}}
	// SNP enabled in the kernel, but KVM does not run guests: NFD's label
	// holds, c8s's does not.
	snpNoKVM = discovery.Result{
		SNP: discovery.SNPInfo{Enabled: true, ASIDs: known(99)},
		KVM: discovery.KVMInfo{Device: true, Probe: &accel.Result{Accel: accel.TCG}},
	}
	snpGuest = discovery.Result{NodeCVM: discovery.NodeCVMInfo{TEE: discovery.SNP, SEVGuest: true, TSMReport: true}}
	plain    = discovery.Result{KVM: discovery.KVMInfo{Device: true}}
)

func TestDesire(t *testing.T) {
	for _, tc := range []struct {
		name      string
		r         discovery.Result
		s         Settings
		labels    map[string]string
		taint     *Taint
		resources []Resource
	}{
		{
			name: "snp host with sim", r: snpHost, s: Settings{Taint: defaultTaint},
			labels: map[string]string{LabelSNP: "true", LabelSim: "true", NFDSNP: "true",
				LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "snp"},
			taint:     defaultTaint,
			resources: []Resource{{ResourceSNPASID, 99, true}, {ResourceSimSlot, 4, true}},
		},
		{
			name: "tdx host, configured pool", r: tdxHost, s: Settings{TrustPool: "prod-a", Taint: defaultTaint},
			labels: map[string]string{LabelTDX: "true", NFDTDX: "true",
				LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "prod-a"},
			taint:     defaultTaint,
			resources: []Resource{{ResourceTDXKey, 63, true}},
		},
		{
			name: "sgx host: NFD label and EPC, no pod VMs, no taint", r: sgxHost, s: Settings{Taint: defaultTaint},
			labels:    map[string]string{NFDSGX: "true"},
			resources: []Resource{{ResourceSGXEPC, 1 << 30, false}},
		},
		{
			name: "sim only", r: simHost, s: Settings{Taint: defaultTaint},
			labels: map[string]string{LabelSim: "true", LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "sim"},
			taint:  defaultTaint, resources: []Resource{{ResourceSimSlot, 2, true}},
		},
		{
			name: "sim only, taint switched off", r: simHost, s: Settings{},
			labels:    map[string]string{LabelSim: "true", LabelTrustShape: ShapePodAsCVM, LabelTrustPool: "sim"},
			resources: []Resource{{ResourceSimSlot, 2, true}},
		},
		{
			name: "snp without working KVM", r: snpNoKVM, s: Settings{Taint: defaultTaint},
			labels: map[string]string{NFDSNP: "true"},
		},
		{
			name: "node is an SNP guest", r: snpGuest, s: Settings{Taint: defaultTaint},
			labels: map[string]string{LabelTrustShape: ShapeNodeAsCVM, LabelNodeTEE: "snp", LabelTrustPool: "snp"},
		},
		{name: "plain host", r: plain, s: Settings{Taint: defaultTaint}, labels: map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Desire(tc.r, tc.s)
			if !reflect.DeepEqual(d.Labels, tc.labels) {
				t.Errorf("labels = %v\nwant     %v", d.Labels, tc.labels)
			}
			if !reflect.DeepEqual(d.Taint, tc.taint) {
				t.Errorf("taint = %v, want %v", d.Taint, tc.taint)
			}
			if !reflect.DeepEqual(d.Resources, tc.resources) {
				t.Errorf("resources = %v, want %v", d.Resources, tc.resources)
			}
		})
	}
}

// TestDesireFromFixtureTrees runs discovery on its fixture trees and
// checks the TEE labels each kind of node ends up with.
func TestDesireFromFixtureTrees(t *testing.T) {
	for fixture, want := range map[string][]string{
		"snp-host":  {LabelSNP, LabelSim, NFDSNP, LabelTrustShape, LabelTrustPool},
		"tdx-host":  {LabelTDX, LabelSim, NFDTDX, LabelTrustShape, LabelTrustPool},
		"sgx-host":  {LabelSim, NFDSGX, LabelTrustShape, LabelTrustPool},
		"snp-guest": {LabelSim, LabelTrustShape, LabelNodeTEE, LabelTrustPool},
	} {
		r, err := discovery.Discover(discovery.Options{Root: filepath.Join("..", "discovery", "testdata", fixture)})
		if err != nil {
			t.Fatal(err)
		}
		d := Desire(r, Settings{})
		var got []string
		for k := range d.Labels {
			got = append(got, k)
		}
		if strings.Join(sorted(got), " ") != strings.Join(sorted(want), " ") {
			t.Errorf("%s: labels %v, want keys %v", fixture, d.Labels, want)
		}
	}
}

func TestParseTaint(t *testing.T) {
	for in, want := range map[string]*Taint{
		"":                                    nil,
		"c8s.io/confidential=true:NoSchedule": defaultTaint,
		"dedicated:NoExecute":                 {Key: "dedicated", Effect: "NoExecute"},
		"tee=snp:PreferNoSchedule":            {Key: "tee", Value: "snp", Effect: "PreferNoSchedule"},
	} {
		got, err := ParseTaint(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("ParseTaint(%q) = %v, %v; want %v", in, got, err, want)
		}
		if got != nil && got.String() != in {
			t.Errorf("String() = %q, want %q", got.String(), in)
		}
	}
	for in, msg := range map[string]string{
		"c8s.io/confidential=true":                     "has no effect",
		"c8s.io/confidential=true:NoRun":               "effect \"NoRun\"",
		"bad key=true:NoSchedule":                      "not a valid key",
		"k=" + strings.Repeat("v", 64) + ":NoSchedule": "not a valid value",
		"-k=v:NoSchedule":                              "not a valid key",
	} {
		if _, err := ParseTaint(in); err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseTaint(%q) error = %v, want %q", in, err, msg)
		}
	}
}

func TestNewSettings(t *testing.T) {
	s, err := NewSettings("prod-a", "c8s.io/confidential=true:NoSchedule")
	if err != nil || s.TrustPool != "prod-a" || !reflect.DeepEqual(s.Taint, defaultTaint) {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := NewSettings("prod a", ""); err == nil || !strings.Contains(err.Error(), "node.trust_pool") {
		t.Fatalf("bad pool: %v", err)
	}
	if _, err := NewSettings("", "x"); err == nil || !strings.Contains(err.Error(), "node.taint") {
		t.Fatalf("bad taint: %v", err)
	}
}

func sorted(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

func mustJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

func TestSettingsFromConfig(t *testing.T) {
	c, err := config.Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := SettingsFromConfig(c.Node)
	if err != nil || s.TrustPool != "" || !reflect.DeepEqual(s.Taint, defaultTaint) {
		t.Fatalf("defaults: %+v %v", s, err)
	}
	c.Node.Taint = ""
	if s, err := SettingsFromConfig(c.Node); err != nil || s.Taint != nil {
		t.Fatalf("no taint: %+v %v", s, err)
	}
}
