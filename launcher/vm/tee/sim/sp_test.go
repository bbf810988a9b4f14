package sim

import (
	"bytes"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
)

// node is the identity the tests share: creating one costs two RSA-4096 keys.
var node struct {
	once sync.Once
	dir  string
	sp   *SP
	err  error
}

// nodeSP returns the shared identity, created by two concurrent Open calls
// on a fresh state dir (which must agree on one identity).
func nodeSP(t *testing.T) (string, *SP) {
	t.Helper()
	node.once.Do(func() {
		dir, err := os.MkdirTemp("", "c8s-simsp-test-")
		if err != nil {
			node.err = err
			return
		}
		node.dir = filepath.Join(dir, "state")
		var wg sync.WaitGroup
		sps := make([]*SP, 2)
		errs := make([]error, 2)
		for i := range sps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				sps[i], errs[i] = Open(node.dir)
			}()
		}
		wg.Wait()
		if node.err = errors.Join(errs...); node.err != nil {
			return
		}
		if sps[0].ChipID() != sps[1].ChipID() || !sps[0].VCEK().Equal(sps[1].VCEK()) {
			node.err = errors.New("two concurrent Open calls on a fresh dir returned different identities")
			return
		}
		node.sp = sps[0]
	})
	if node.err != nil {
		t.Fatal(node.err)
	}
	return node.dir, node.sp
}

func TestMain(m *testing.M) {
	code := m.Run()
	if node.dir != "" {
		os.RemoveAll(filepath.Dir(node.dir))
	}
	os.Exit(code)
}

func TestOpenPersistsAndReuses(t *testing.T) {
	dir, sp := nodeSP(t)
	st, err := os.Stat(filepath.Join(dir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600 (it holds private keys)", IdentityFile, st.Mode().Perm())
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode: %v, %v; want 0700", st.Mode().Perm(), err)
	}
	again, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.ChipID() != sp.ChipID() || !again.ARK().Equal(sp.ARK()) || !again.VCEK().Equal(sp.VCEK()) {
		t.Error("Open on an existing state dir made a new identity instead of reusing it")
	}
	if again.TCB() != DefaultTCB {
		t.Errorf("TCB %+v, want DefaultTCB %+v", again.TCB(), DefaultTCB)
	}
	chain, err := os.ReadFile(filepath.Join(dir, CertChainFile))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(chain, sp.CertChainPEM()) {
		t.Errorf("%s differs from the identity's chain", CertChainFile)
	}
	// The published chain is rewritten when missing.
	os.Remove(filepath.Join(dir, CertChainFile))
	if _, err := Load(dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, CertChainFile)); err != nil || !bytes.Equal(b, sp.CertChainPEM()) {
		t.Errorf("Load did not restore %s: %v", CertChainFile, err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(leftovers) != 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := Load(t.TempDir())
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Load on an empty dir: %v, want fs.ErrNotExist", err)
	}
}

func TestCorruptStore(t *testing.T) {
	dir, _ := nodeSP(t)
	good, err := os.ReadFile(filepath.Join(dir, IdentityFile))
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(good, &s); err != nil {
		t.Fatal(err)
	}
	edit := func(k string, v any) []byte {
		c := map[string]any{}
		for kk, vv := range s {
			c[kk] = vv
		}
		c[k] = v
		b, _ := json.Marshal(c)
		return b
	}
	for _, tc := range []struct {
		name, want string
		data       []byte
	}{
		{"truncated", "not valid JSON", good[:len(good)/2]},
		{"format", "format version 7", edit("version", 7)},
		{"chip id", "chip_id differs from the VCEK's HWID", edit("chip_id", strings.Repeat("ab", 64))},
		{"tcb", "differs from the VCEK's TCB", edit("tcb", 1)},
		{"key", "ark_key is not an RSA private key", edit("ark_key", s["vcek_key"])},
		{"swapped keys", "the ASK certificate is not for ask_key", edit("ask_key", s["ark_key"])},
		{"cert", "vcek is not a PEM certificate", edit("vcek", "junk")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := t.TempDir()
			if err := os.WriteFile(filepath.Join(d, IdentityFile), tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			for _, f := range []func(string) (*SP, error){Load, Open} {
				_, err := f(d)
				if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "is damaged") {
					t.Errorf("error %v, want one saying the store is damaged: %q", err, tc.want)
				}
			}
			// A damaged identity is never replaced silently.
			if b, _ := os.ReadFile(filepath.Join(d, IdentityFile)); !bytes.Equal(b, tc.data) {
				t.Error("the damaged identity file was overwritten")
			}
		})
	}
}

func TestChainMarkedAndAcceptedByGoSevGuest(t *testing.T) {
	_, sp := nodeSP(t)
	if sp.ARK().Subject.CommonName != ARKCommonName {
		t.Errorf("ARK CN %q, want %q", sp.ARK().Subject.CommonName, ARKCommonName)
	}
	for name, c := range map[string]*x509.Certificate{"ARK": sp.ARK(), "ASK": sp.ASK(), "VCEK": sp.VCEK()} {
		if !IsSimulated(c) {
			t.Errorf("%s is not marked as simulated", name)
		}
		if c.SignatureAlgorithm != x509.SHA384WithRSAPSS {
			t.Errorf("%s signature algorithm %v, want SHA384-RSAPSS as AMD's", name, c.SignatureAlgorithm)
		}
	}
	for _, real := range trust.DefaultRootCerts {
		if IsSimulated(real.ProductCerts.Ark) || IsSimulated(real.ProductCerts.Ask) {
			t.Error("AMD's real roots are reported as simulated")
		}
	}
	exts, err := kds.VcekCertificateExtensions(sp.VCEK())
	if err != nil {
		t.Fatal(err)
	}
	id := sp.ChipID()
	if !bytes.Equal(exts.HWID, id[:]) || exts.ProductName != ProductName {
		t.Errorf("VCEK extensions: HWID %x product %q; want chip id %x, %q", exts.HWID, exts.ProductName, id, ProductName)
	}
	if want, _ := kds.ComposeTCBParts(DefaultTCB); exts.TCBVersion != want {
		t.Errorf("VCEK TCB %#x, want %#x", exts.TCBVersion, want)
	}

	raw, err := sp.Report(Request{})
	if err != nil {
		t.Fatal(err)
	}
	att, err := abi.ReportCertsToProto(append(raw, sp.CertTable()...))
	if err != nil {
		t.Fatal(err)
	}
	root := trust.AMDRootCertsProduct(ProductLine)
	if err := root.FromKDSCertBytes(sp.CertChainPEM()); err != nil {
		t.Fatal(err)
	}
	opts := &verify.Options{DisableCertFetching: true, Now: time.Now(), TrustedRoots: map[string][]*trust.AMDRootCerts{ProductLine: {root}}}
	if err := verify.SnpAttestation(att, opts); err != nil {
		t.Errorf("go-sev-guest refuses the simulated chain it was given as trusted root: %v", err)
	}
	// With AMD's embedded roots (no TrustedRoots) the chain is refused.
	if err := verify.SnpAttestation(att, &verify.Options{DisableCertFetching: true, Now: time.Now()}); err == nil {
		t.Error("go-sev-guest accepts the simulated chain with AMD's real roots")
	}
}

func TestReportFields(t *testing.T) {
	_, sp := nodeSP(t)
	var req Request
	for i := range req.Measurement {
		req.Measurement[i] = byte(i)
	}
	copy(req.HostData[:], "host data: init data digest.....")
	copy(req.ReportData[:], "nonce from the guest")
	req.VMPL = 2
	req.Policy = DefaultGuestPolicy | 1<<19
	raw, err := sp.Report(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != abi.ReportSize {
		t.Fatalf("report is %d bytes, want %d", len(raw), abi.ReportSize)
	}
	if err := abi.ValidateReportFormat(raw); err != nil {
		t.Fatal(err)
	}
	r, err := abi.ReportToProto(raw)
	if err != nil {
		t.Fatal(err)
	}
	tcb, _ := kds.ComposeTCBParts(sp.TCB())
	id := sp.ChipID()
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"version", r.Version, uint32(ReportVersion)},
		{"measurement", r.Measurement, req.Measurement[:]},
		{"host data", r.HostData, req.HostData[:]},
		{"report data", r.ReportData, req.ReportData[:]},
		{"chip id", r.ChipId, id[:]},
		{"policy", r.Policy, req.Policy},
		{"vmpl", r.Vmpl, uint32(2)},
		{"reported tcb", r.ReportedTcb, uint64(tcb)},
		{"current tcb", r.CurrentTcb, uint64(tcb)},
		{"launch tcb", r.LaunchTcb, uint64(tcb)},
		{"product", kds.ProductLineFromFms(r.Cpuid1EaxFms), ProductLine},
	} {
		g, _ := json.Marshal(c.got)
		w, _ := json.Marshal(c.want)
		if !bytes.Equal(g, w) {
			t.Errorf("%s: got %s, want %s", c.name, g, w)
		}
	}
	if err := verify.SnpReportSignature(raw, sp.VCEK()); err != nil {
		t.Errorf("report signature does not verify with the VCEK: %v", err)
	}
	raw2, err := sp.Report(req)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(raw[0x140:0x160], raw2[0x140:0x160]) {
		t.Error("two reports share a REPORT_ID although none was given")
	}
	if _, err := sp.Report(Request{VMPL: 4}); err == nil {
		t.Error("VMPL 4 accepted")
	}
	if _, err := sp.Report(Request{Policy: 1}); err == nil || !strings.Contains(err.Error(), "guest policy") {
		t.Errorf("a policy without the must-be-one bit 17: %v", err)
	}
}
