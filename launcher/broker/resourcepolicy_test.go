package broker

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	guestkbs "github.com/c8s-dev/c8s/guest/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/snpext"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// appPolicy gives db-password to workload app, every field of which is
// what the fixture's pod shows ($INIT its init data digest, $MEAS its
// launch measurement; the sim SP's TCB is bl=3 tee=0 snp=20 ucode=200).
const appPolicy = `
[workloads.app]
tee = ["sim"]
init_data = ["$INIT"]
measurements = ["$MEAS"]
min_tcb = { bl = 3, tee = 0, snp = 20, ucode = 200 }

[[resources]]
name = "db-password"
path = "default/key/db-password"
workloads = ["app"]
`

// otherDoc is another pod's init data: another workload.
const otherDoc = podInitData + "# another pod\n"

// expand fills in the fixture pod's values.
func (f *fixture) expand(policy string) string {
	init := initdata.Digest(f.initData)
	other := initdata.Digest([]byte(otherDoc))
	return strings.NewReplacer("$INIT", hex.EncodeToString(init[:]), "$MEAS", hex.EncodeToString(f.measurement[:]),
		"$OTHER", hex.EncodeToString(other[:])).Replace(policy)
}

// setPolicy gives the broker a resource policy (TOML) with the fixture
// pod's values filled in.
func (f *fixture) setPolicy(t *testing.T, policy string) {
	t.Helper()
	p, err := ParseResourcePolicy([]byte(f.expand(policy)), false, t.TempDir())
	if err != nil {
		t.Fatalf("resource policy: %v\n%s", err, f.expand(policy))
	}
	f.broker.ResourcePolicy = p
}

// refused fetches resource and wants a 403 whose message says each of want.
func (f *fixture) refused(t *testing.T, resource string, want ...string) {
	t.Helper()
	_, err := f.client().Fetch(context.Background(), []string{resource})
	var e *guestkbs.Error
	if !errors.As(err, &e) || e.Op != "resource "+resource || e.Status != http.StatusForbidden || e.Info.Type != "https://github.com/confidential-containers/kbs/errors/PolicyDeny" {
		t.Fatalf("err = %v, want the attested session refused the resource (403 PolicyDeny)", err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), f.expand(w)) {
			t.Errorf("err = %v\ndoes not say %q", err, f.expand(w))
		}
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatal("the refusal carries the secret")
	}
	if logs := f.logs.String(); !strings.Contains(logs, "kbs: refused "+resource) || strings.Contains(logs, "kbs: released") {
		t.Fatalf("broker log %q: want the refusal logged and nothing released", logs)
	}
}

// The owner's resource policy releases db-password to the workload the
// pod is, and each field of the workload refuses a pod that differs in it
// alone.
func TestResourcePolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		policy string         // replaces appPolicy's line from -> to
		from   string         // "" = appPolicy as is
		setup  func(*fixture) // changes the pod or the broker
		want   []string       // nil = released
	}{
		"the workload": {},
		// The "done when": the rule gives db-password to another
		// pod's init data; this pod's is pinned too, so it attests.
		"another init data digest": {from: `init_data = ["$INIT"]`, policy: `init_data = ["$OTHER"]`, setup: func(f *fixture) {
			f.broker.InitData = append(f.broker.InitData, []byte(otherDoc))
		}, want: []string{`init data digest $INIT (HOST_DATA): not one of the workload's init_data: not in resource policy rule "db-password" (workload "app")`}},
		"a lower TCB": {from: "snp = 20", policy: "snp = 21",
			want: []string{"TCB bl=3 tee=0 snp=20 ucode=200: below the workload's min_tcb bl=3 tee=0 snp=21 ucode=200", `rule "db-password"`}},
		"another measurement": {from: `measurements = ["$MEAS"]`, policy: `measurements = ["` + strings.Repeat("ab", 48) + `"]`,
			want: []string{"launch measurement $MEAS: not one of the workload's measurements", `rule "db-password"`}},
		"another TEE": {from: `tee = ["sim"]`, policy: `tee = ["snp"]`,
			want: []string{"TEE sim: the workload runs on snp", `rule "db-password"`}},
		"a TDX workload": {from: `measurements = ["$MEAS"]`, policy: "tdx = [{ mrtd = \"" + strings.Repeat("cd", 48) + "\" }]",
			want: []string{"TEE sim: the workload pins TDX identities"}},
		"a debug guest": {setup: func(f *fixture) {
			f.guestPolicy = sim.DefaultGuestPolicy | snpPolicyDebug
			f.broker.Policy.AllowDebug = true // the attestation policy lets it through
		}, want: []string{"a debug guest (the host can read its memory): the workload does not set allow_debug"}},
		"a debug guest, allowed": {from: `tee = ["sim"]`, policy: "tee = [\"sim\"]\nallow_debug = true", setup: func(f *fixture) {
			f.guestPolicy = sim.DefaultGuestPolicy | snpPolicyDebug
			f.broker.Policy.AllowDebug = true
		}},
		// Launch bits the host chose, outside the measurement.
		"SMT where the workload forbids it": {from: `tee = ["sim"]`, policy: "tee = [\"sim\"]\nsnp_guest_policy = 0x20000",
			want: []string{"guest policy SMT bit: expected 0, got 1 (POLICY=0x30000)", "below the workload's snp_guest_policy 0x20000", `rule "db-password"`}},
		"no SMT, as the workload requires": {from: `tee = ["sim"]`, policy: "tee = [\"sim\"]\nsnp_guest_policy = 0x20000", setup: func(f *fixture) {
			f.guestPolicy = 0x20000
		}},
		"TDX launch attributes on an SNP pod": {from: `tee = ["sim"]`, policy: "tee = [\"sim\"]\ntd_attributes = \"0000001000000000\"",
			want: []string{"TEE sim: the workload's td_attributes and xfam are TDX launch attributes"}},
		"no rule for the resource": {from: `path = "default/key/db-password"`, policy: `path = "default/key/other"`,
			want: []string{"resource default/key/db-password refused: no rule in the resource policy covers it (default deny)"}},
		"a pattern that covers it":   {from: `path = "default/key/db-password"`, policy: `path = "default/*/db-password"`},
		"a pattern for any resource": {from: `path = "default/key/db-password"`, policy: `path = "*/*/*"`},
		"a pattern that does not cover it": {from: `path = "default/key/db-password"`, policy: `path = "default/*/db"`,
			want: []string{"no rule in the resource policy covers it (default deny)"}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			if tc.setup != nil {
				tc.setup(f)
			}
			policy := appPolicy
			if tc.from != "" {
				if !strings.Contains(policy, tc.from) {
					t.Fatalf("appPolicy has no %q", tc.from)
				}
				policy = strings.Replace(policy, tc.from, tc.policy, 1)
			}
			f.setPolicy(t, policy)
			if tc.want != nil {
				f.refused(t, dbPassword, tc.want...)
				return
			}
			got, err := f.client().Fetch(context.Background(), []string{dbPassword})
			if err != nil || string(got[0]) != secret {
				t.Fatalf("Fetch = %q, %v: want the secret released to the workload", got, err)
			}
		})
	}
}

// A rule naming several workloads says why each refused.
func TestResourcePolicyNamesEachWorkload(t *testing.T) {
	f := newFixture(t)
	f.setPolicy(t, `
[workloads.frontend]
init_data = ["$OTHER"]
[workloads.batch]
tee = ["tdx"]
init_data = ["$INIT"]
[[resources]]
name = "db"
path = "default/key/*"
workloads = ["frontend", "batch"]
`)
	f.refused(t, dbPassword, `init data digest $INIT (HOST_DATA): not one of the workload's init_data: not in resource policy rule "db" (workload "frontend")`,
		`TEE sim: the workload runs on tdx: not in resource policy rule "db" (workload "batch")`)
}

// The second binding: a resource the pod's measured init data does not
// name in [[kbs.secrets]] is refused, even where the owner's policy would
// release it to the workload (a broad pattern), and without a policy.
func TestResourceNotInTheInitDataRefused(t *testing.T) {
	f := newFixture(t)
	f.broker.Resources = Map{dbPassword: []byte(secret), "default/key/other": []byte("other secret")}
	f.refused(t, "default/key/other", "resource default/key/other refused: not among the [[kbs.secrets]] of the pod's measured init data (digest $INIT)")
	f.setPolicy(t, strings.Replace(appPolicy, `path = "default/key/db-password"`, `path = "*/*/*"`, 1))
	f.refused(t, "default/key/other", "not among the [[kbs.secrets]]")
	// The control: what the document names is released under the same rule.
	if got, err := f.client().Fetch(context.Background(), []string{dbPassword}); err != nil || string(got[0]) != secret {
		t.Fatalf("Fetch = %q, %v", got, err)
	}
}

// Workloads can name their documents instead of digests; the broker then
// pins them, as --init-data does.
func TestResourcePolicyInitDataFiles(t *testing.T) {
	f := newFixture(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "app.toml"), f.initData, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := ParseResourcePolicy([]byte(`
[workloads.app]
init_data_files = ["app.toml"]
[[resources]]
path = "default/key/db-password"
workloads = ["app"]
`), false, dir)
	if err != nil {
		t.Fatal(err)
	}
	f.broker.ResourcePolicy, f.broker.InitData = p, nil
	if got, err := f.client().Fetch(context.Background(), []string{dbPassword}); err != nil || string(got[0]) != secret {
		t.Fatalf("Fetch = %q, %v", got, err)
	}
	d := initdata.DigestTDX(f.initData)
	if pins := f.broker.pins("tdx"); len(pins) != 1 || string(pins[0]) != string(d[:]) {
		t.Fatalf("TDX pins %v, want the document's MRCONFIGID", pins)
	}
}

func TestRulePatterns(t *testing.T) {
	for _, tc := range []struct {
		pattern, resource string
		match             bool
	}{
		{"a/*/c", "a/b/c", true},
		{"a/*/c", "a/b/c/d", false},
		{"a/*/c", "a/c", false},
		{"a/*/c", "a/b/d", false},
		{"a/*/c", "x/b/c", false},
		{"*/*/*", "a/b/c", true},
		{"a/b/c", "a/b/c", true},
		{"a/b/c", "a/b/cd", false},
	} {
		if got := (&Rule{Path: tc.pattern}).matches(tc.resource); got != tc.match {
			t.Errorf("%s matches %s = %v, want %v", tc.pattern, tc.resource, got, tc.match)
		}
	}
}

func TestResourcePolicyRefusedWhenMalformed(t *testing.T) {
	good := strings.Replace(appPolicy, "$INIT", strings.Repeat("11", 32), 1)
	good = strings.Replace(good, "$MEAS", strings.Repeat("22", 48), 1)
	if _, err := ParseResourcePolicy([]byte(good), false, ""); err != nil {
		t.Fatalf("the base policy: %v", err)
	}
	for name, tc := range map[string]struct{ from, to, want string }{
		"partial wildcard":            {`path = "default/key/db-password"`, `path = "default/key/db-*"`, `"*" stands for a whole segment only`},
		"two segments":                {`path = "default/key/db-password"`, `path = "default/db-password"`, "three segments"},
		"unknown workload":            {`workloads = ["app"]`, `workloads = ["ap"]`, `workload "ap" is not defined`},
		"no workloads":                {`workloads = ["app"]`, `workloads = []`, "no workloads"},
		"misspelt key":                {"min_tcb", "mintcb", "unknown key workloads.app.mintcb (line 6)"},
		"unknown TEE":                 {`tee = ["sim"]`, `tee = ["sev"]`, `tee "sev"`},
		"short init data":             {strings.Repeat("11", 32), "1111", "want 32 (SNP HOST_DATA) or 48 (TDX MRCONFIGID)"},
		"short measurement":           {strings.Repeat("22", 48), "2222", "want 48"},
		"no identity":                 {"init_data = [\"" + strings.Repeat("11", 32) + "\"]\nmeasurements = [\"" + strings.Repeat("22", 48) + "\"]", "", "pins neither init data nor a launch measurement"},
		"missing document file":       {`tee = ["sim"]`, `init_data_files = ["nope.toml"]`, "init_data_files"},
		"guest policy without bit 17": {`tee = ["sim"]`, "tee = [\"sim\"]\nsnp_guest_policy = 0x10000", "lacks bit 17"},
		"guest policy with DEBUG":     {`tee = ["sim"]`, "tee = [\"sim\"]\nsnp_guest_policy = 0xb0000", "allow_debug decides"},
		"short td_attributes":         {`tee = ["sim"]`, "tee = [\"sim\"]\ntd_attributes = \"00000010\"", "td_attributes is 4 bytes, want 8"},
		"short xfam":                  {`tee = ["sim"]`, "tee = [\"sim\"]\nxfam = \"e7\"", "xfam is 1 bytes, want 8"},
	} {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(good, tc.from) {
				t.Fatalf("no %q in the policy", tc.from)
			}
			_, err := ParseResourcePolicy([]byte(strings.Replace(good, tc.from, tc.to, 1)), false, t.TempDir())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// The same policy reads as JSON.
func TestResourcePolicyJSON(t *testing.T) {
	f := newFixture(t)
	p, err := ParseResourcePolicy([]byte(f.expand(`{
  "workloads": {"app": {"tee": ["sim"], "init_data": ["$INIT"], "min_tcb": {"bl": 3, "snp": 20, "ucode": 200}}},
  "resources": [{"name": "db-password", "path": "default/key/db-password", "workloads": ["app"]}]
}`)), true, "")
	if err != nil {
		t.Fatal(err)
	}
	f.broker.ResourcePolicy = p
	if got, err := f.client().Fetch(context.Background(), []string{dbPassword}); err != nil || string(got[0]) != secret {
		t.Fatalf("Fetch = %q, %v", got, err)
	}
	if _, err := ParseResourcePolicy([]byte(`{"workloads": {}, "resources": [], "extra": 1}`), true, ""); err == nil || !strings.Contains(err.Error(), "extra") {
		t.Fatalf("unknown JSON key: err = %v", err)
	}
}

// TDX workloads, checked on what a TDX session attests as (no TDX sim:
// the claims are written out).
func TestWorkloadTDX(t *testing.T) {
	h := func(b byte, n int) attest.Hex { return attest.Hex(strings.Repeat(string([]byte{b}), n)) }
	mrtd, r1, r2, cfg := h(1, 48), h(2, 48), h(3, 48), h(4, 48)
	svn := attest.Hex{3, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	attrs, xfam := attest.Hex{0, 0, 0, 0x10, 0, 0, 0, 0}, attest.Hex{0xe7, 0x1a, 0x06, 0, 0, 0, 0, 0}
	pod := func() *Attested {
		return &Attested{TEE: "tdx", MRTD: mrtd, RTMRs: []attest.Hex{h(9, 48), r1, r2, h(9, 48)}, InitDataDigest: cfg, TeeTCBSVN: slicesClone(svn),
			TDAttributes: slicesClone(attrs), XFAM: slicesClone(xfam)}
	}
	w := &Workload{TEE: []string{"tdx"}, TDX: []TDXIdentity{{MRTD: mrtd, RTMRs: []attest.Hex{nil, r1, r2}}}, InitData: []attest.Hex{cfg},
		MinTeeTCBSVN: attest.Hex{3, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, TDAttributes: attrs, XFAM: xfam}
	if err := w.validate(""); err != nil {
		t.Fatal(err)
	}
	if why := w.check(pod()); why != "" {
		t.Fatalf("the workload's own TD refused: %s", why)
	}
	for name, tc := range map[string]struct {
		change func(a *Attested)
		want   string
	}{
		"another kernel (RTMR1)": {func(a *Attested) { a.RTMRs[1] = h(7, 48) }, "not one of the workload's tdx identities"},
		"another MRTD":           {func(a *Attested) { a.MRTD = h(7, 48) }, "not one of the workload's tdx identities"},
		"another MRCONFIGID":     {func(a *Attested) { a.InitDataDigest = h(7, 48) }, "(MRCONFIGID): not one of the workload's init_data"},
		"an older TDX module":    {func(a *Attested) { a.TeeTCBSVN[2] = 3 }, "component 2 is below the workload's min_tee_tcb_svn"},
		"a debug TD":             {func(a *Attested) { a.Debug = true }, "a debug guest"},
		"no SEPT_VE_DISABLE":     {func(a *Attested) { a.TDAttributes[3] = 0 }, "TD_ATTRIBUTES mismatch: expected 0000001000000000, got 0000000000000000 (the TD was launched with other attributes: SEPT_VE_DISABLE clear"},
		"PERFMON on":             {func(a *Attested) { a.TDAttributes[7] = 0x80 }, "PERFMON set"},
		"other CPU features":     {func(a *Attested) { a.XFAM[0] = 0x03 }, "XFAM mismatch: expected e71a060000000000, got 031a060000000000"},
	} {
		a := pod()
		tc.change(a)
		if why := w.check(a); !strings.Contains(why, tc.want) {
			t.Errorf("%s: %q, want %q", name, why, tc.want)
		}
	}
	// A field of the other TEE refuses rather than being skipped.
	snpOnly := &Workload{InitData: []attest.Hex{cfg}, MinTCB: &TCB{SNP: 1}}
	if why := snpOnly.check(pod()); !strings.Contains(why, "min_tcb is an SNP TCB") {
		t.Errorf("min_tcb on a TD: %q", why)
	}
	snpPolicy := &Workload{InitData: []attest.Hex{cfg}, SNPGuestPolicy: 0x20000}
	if why := snpPolicy.check(pod()); !strings.Contains(why, "snp_guest_policy is an SNP guest policy") {
		t.Errorf("snp_guest_policy on a TD: %q", why)
	}
}

func slicesClone(h attest.Hex) attest.Hex { return append(attest.Hex(nil), h...) }

// A workload's min_tcb is judged in the evidence's own product line's
// layout: on Turin, snp is byte 3 and fmc byte 0, which the Milan layout
// reads as reserved and as bl; and at launch too (LAUNCH_TCB), not only
// at the firmware level the host has updated to since.
func TestWorkloadMinTCBByProductLine(t *testing.T) {
	turin := func(fmc, bl, snp, ucode uint8) uint64 {
		return snpext.TCB{Line: snpext.Turin, FMC: fmc, Bootloader: bl, SNP: snp, Microcode: ucode}.Raw()
	}
	meas := attest.Hex(strings.Repeat("\x01", 48))
	w := &Workload{TEE: []string{"snp"}, Measurements: []attest.Hex{meas}, MinTCB: &TCB{FMC: 1, BL: 3, SNP: 8, UCode: 71}}
	if err := w.validate(""); err != nil {
		t.Fatal(err)
	}
	pod := func(reported, launch uint64) *Attested {
		return &Attested{TEE: "snp", Measurement: meas, TCB: reported, LaunchTCB: launch, TCBLine: snpext.Turin}
	}
	if why := w.check(pod(turin(1, 3, 8, 71), turin(1, 3, 8, 71))); why != "" {
		t.Fatalf("a Turin pod at the minimum refused: %s", why)
	}
	for name, tc := range map[string]struct {
		a    *Attested
		want string
	}{
		"snp below (Turin's byte 3)": {pod(turin(1, 3, 1, 71), turin(1, 3, 1, 71)), "TCB fmc=1 bl=3 tee=0 snp=1 ucode=71: below the workload's min_tcb"},
		"fmc below":                  {pod(turin(0, 3, 8, 71), turin(0, 3, 8, 71)), "below the workload's min_tcb fmc=1 bl=3"},
		"launched below":             {pod(turin(1, 3, 8, 71), turin(1, 3, 2, 71)), "LAUNCH_TCB fmc=1 bl=3 tee=0 snp=2 ucode=71: below"},
	} {
		if why := w.check(tc.a); !strings.Contains(why, tc.want) {
			t.Errorf("%s: %q, want %q", name, why, tc.want)
		}
	}
	// Milan evidence has no fmc: the minimum's fmc does not apply to it.
	milan := snpext.TCB{Line: snpext.Milan, Bootloader: 3, SNP: 8, Microcode: 71}.Raw()
	milanPod := &Attested{TEE: "snp", Measurement: meas, TCB: milan, LaunchTCB: milan, TCBLine: snpext.Milan}
	if why := w.check(milanPod); why != "" {
		t.Errorf("a Milan pod at the minimum refused: %s", why)
	}

	// A fleet of lines: each its own minimum (Milan's snp=8 would pass
	// an old Turin at snp=2 if one value served both).
	w = &Workload{TEE: []string{"snp"}, Measurements: []attest.Hex{meas}, MinTCBByLine: map[string]*TCB{
		snpext.Milan: {BL: 3, SNP: 8, UCode: 115}, snpext.Turin: {BL: 1, SNP: 2, UCode: 71}}}
	if err := w.validate(""); err != nil {
		t.Fatal(err)
	}
	if why := w.check(pod(turin(0, 1, 2, 71), turin(0, 1, 2, 71))); why != "" {
		t.Errorf("a Turin pod at its line's minimum refused: %s", why)
	}
	if why := w.check(milanPod); !strings.Contains(why, "below the workload's min_tcb_by_line.Milan bl=3 tee=0 snp=8 ucode=115") {
		t.Errorf("a Milan pod below its line's minimum: %q", why)
	}
	genoa := snpext.TCB{Line: snpext.Genoa, Bootloader: 10, SNP: 23, Microcode: 84}.Raw()
	if why := w.check(&Attested{TEE: "snp", Measurement: meas, TCB: genoa, LaunchTCB: genoa, TCBLine: snpext.Genoa}); !strings.Contains(why, "names no minimum for Genoa") {
		t.Errorf("a Genoa pod, no minimum for its line: %q", why)
	}
	w.MinTCBByLine["Bergamo"] = &TCB{}
	if err := w.validate(""); err == nil || !strings.Contains(err.Error(), "min_tcb_by_line.Bergamo") {
		t.Errorf("an unknown line: %v", err)
	}
}

// What a workload judges is copied from the verified claims, every field.
func TestAttestedFromClaims(t *testing.T) {
	h := func(b byte, n int) attest.Hex { return attest.Hex(strings.Repeat(string([]byte{b}), n)) }
	var a Attested
	a.setTDX(&attest.TDXClaims{MRTD: h(1, 48), RTMRs: []attest.Hex{h(2, 48)}, MRConfigID: h(3, 48), TeeTCBSVN: h(4, 16),
		TDAttributes: attest.Hex{1, 0, 0, 0x10, 0, 0, 0, 0}, XFAM: h(5, 8)})
	want := Attested{MRTD: h(1, 48), RTMRs: []attest.Hex{h(2, 48)}, InitDataDigest: h(3, 48), TeeTCBSVN: h(4, 16), Debug: true,
		TDAttributes: attest.Hex{1, 0, 0, 0x10, 0, 0, 0, 0}, XFAM: h(5, 8)}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("from TDX claims: %+v\nwant %+v", a, want)
	}
	a = Attested{}
	a.setSNP(&attest.SNPClaims{Measurement: h(1, 48), HostData: h(2, 32), ReportedTCB: 7, LaunchTCB: 6, ProductLine: "Genoa",
		GuestPolicy: 0x30000 | snpPolicyDebug, PlatformInfo: 0x25})
	want = Attested{Measurement: h(1, 48), InitDataDigest: h(2, 32), TCB: 7, LaunchTCB: 6, TCBLine: "Genoa", Debug: true,
		GuestPolicy: 0x30000 | snpPolicyDebug, PlatformInfo: 0x25}
	if !reflect.DeepEqual(a, want) {
		t.Errorf("from SNP claims: %+v\nwant %+v", a, want)
	}
}
