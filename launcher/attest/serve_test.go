package attest

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
)

// c8s-verify's contract with the shim: a request on stdin, one JSON verdict on stdout,
// the claims of evidence that verifies, the typed refusal of evidence that
// does not (exit status 0 either way), an error for a request it cannot
// read.
func TestServeVerdict(t *testing.T) {
	dir := t.TempDir()
	good := strings.Repeat("11", 48)
	m := manifest.Manifest{
		Schema: manifest.Schema, Kernel: manifest.Kernel{Package: "linux-image-x", Version: "1", Release: "6.12"},
		Cmdline: "console=ttyS0", AgentSHA256: strings.Repeat("ab", 32),
		Artifacts: map[string]manifest.Artifact{
			manifest.RoleKernel: {File: "vmlinuz", Size: 1, SHA256: strings.Repeat("cd", 32)},
			manifest.RoleInitrd: {File: "initrd.img", Size: 1, SHA256: strings.Repeat("ef", 32)},
		},
	}
	if err := m.SetSim(manifest.SimDigests{ByVCPUs: map[string]string{"1": good}}); err != nil {
		t.Fatal(err)
	}
	data, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sp, err := sim.Open(filepath.Join(dir, "sp"))
	if err != nil {
		t.Fatal(err)
	}
	chain, err := os.ReadFile(filepath.Join(dir, "sp", sim.CertChainFile))
	if err != nil {
		t.Fatal(err)
	}
	hostData := bytes.Repeat([]byte{0x5a}, 32)
	request := func(measurement string) []byte {
		var sr sim.Request
		mb, _ := hex.DecodeString(measurement)
		copy(sr.Measurement[:], mb)
		copy(sr.HostData[:], hostData)
		rd := bytes.Repeat([]byte{7}, 64)
		copy(sr.ReportData[:], rd)
		report, err := sp.Report(sr)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(verdict.Request{
			Evidence: verdict.Evidence{Kind: "snp", Provider: "sim", Report: report, CertTable: sp.CertTable()},
			TEE:      "sim", Manifest: filepath.Join(dir, "manifest.json"), VCPUs: 1,
			HostData: hostData, ReportData: rd,
			Trusts: []verdict.Trust{{Mode: verdict.ModeSim, SimCertChain: chain}},
		})
		return b
	}
	run := func(in []byte) (*verdict.Verdict, error) {
		var out bytes.Buffer
		if err := ServeVerdict(bytes.NewReader(in), &out); err != nil {
			return nil, err
		}
		var v verdict.Verdict
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatalf("stdout %q: %v", out.String(), err)
		}
		return &v, nil
	}

	v, err := run(request(good))
	if err != nil || v.Err() != nil || v.SNP == nil || !v.SNP.Simulated || v.SNP.VCPUs != 1 || !bytes.Equal(v.SNP.HostData, hostData) {
		t.Fatalf("the manifest's VM: verdict %+v, %v", v, err)
	}

	v, err = run(request(strings.Repeat("22", 48)))
	if err != nil {
		t.Fatal(err)
	}
	var e *verdict.Error
	if !errors.As(v.Err(), &e) || e.Kind != verdict.KindMismatch || e.Field != "measurement" || e.Expected != good {
		t.Fatalf("another VM's digest: refusal %#v", v.Err())
	}

	if _, err := run([]byte(`{"evidence": {}, "pin_everything": true}`)); err == nil || !strings.Contains(err.Error(), "pin_everything") {
		t.Fatalf("a request with a field the verifier does not know: %v", err)
	}
}
