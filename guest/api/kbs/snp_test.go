package kbs

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
	spb "github.com/google/go-sev-guest/proto/sevsnp"
	"github.com/google/go-sev-guest/verify"
	"github.com/google/go-sev-guest/verify/trust"
	"github.com/google/uuid"

	"github.com/c8s-dev/c8s/internal/golden"
)

// pattern returns n bytes counting up from start.
func pattern(n int, start byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = start + byte(i)
	}
	return b
}

// fixedMilanReport is a version 3 report from a Milan processor, laid out
// by go-sev-guest's encoder (independent of ParseSNPReport/Marshal), with
// every field a distinct value.
func fixedMilanReport(t *testing.T) (*spb.Report, []byte) {
	t.Helper()
	tcb, err := kds.ComposeTCBParts(kds.TCBParts{BlSpl: 3, TeeSpl: 0, SnpSpl: 8, UcodeSpl: 115})
	if err != nil {
		t.Fatal(err)
	}
	committed, _ := kds.ComposeTCBParts(kds.TCBParts{BlSpl: 2, TeeSpl: 1, SnpSpl: 7, UcodeSpl: 114})
	sig := make([]byte, abi.SignatureSize)
	copy(sig, pattern(72, 0x40))
	copy(sig[72:], pattern(72, 0x90))
	r := &spb.Report{
		Version:         3,
		GuestSvn:        7,
		Policy:          0x30000,
		FamilyId:        pattern(16, 0x10),
		ImageId:         pattern(16, 0x20),
		Vmpl:            0,
		SignatureAlgo:   abi.SignEcdsaP384Sha384,
		CurrentTcb:      uint64(tcb),
		PlatformInfo:    0x25,
		SignerInfo:      0,
		ReportData:      pattern(64, 0x30),
		Measurement:     pattern(48, 0x70),
		HostData:        pattern(32, 0xA0),
		IdKeyDigest:     pattern(48, 0x01),
		AuthorKeyDigest: pattern(48, 0x02),
		ReportId:        pattern(32, 0x03),
		ReportIdMa:      bytes.Repeat([]byte{0xff}, 32),
		ReportedTcb:     uint64(tcb),
		Cpuid1EaxFms:    abi.FmsToCpuid1Eax(0x19, 0x01, 0x01),
		ChipId:          pattern(64, 0xC0),
		CommittedTcb:    uint64(committed),
		CurrentBuild:    21,
		CurrentMinor:    55,
		CurrentMajor:    1,
		CommittedBuild:  20,
		CommittedMinor:  54,
		CommittedMajor:  1,
		LaunchTcb:       uint64(committed),
		Signature:       sig,
	}
	raw, err := abi.ReportToAbiBytes(r)
	if err != nil {
		t.Fatal(err)
	}
	return r, raw
}

// fixedCertTable is a certificate table as an extended report returns it:
// VCEK, ASK, ARK and one GUID sev has no name for.
func fixedCertTable() []byte {
	t := abi.CertTable{Entries: []abi.CertTableEntry{
		{GUID: uuid.MustParse(certGUIDs["VCEK"]), RawCert: []byte("vcek-der")},
		{GUID: uuid.MustParse(certGUIDs["ASK"]), RawCert: []byte("ask-der")},
		{GUID: uuid.MustParse(certGUIDs["ARK"]), RawCert: []byte("ark-der")},
		{GUID: uuid.MustParse("11111111-2222-3333-4444-555555555555"), RawCert: []byte{0, 255}},
	}}
	return t.Marshal()
}

// The evidence JSON of a fixed report is pinned, and reading it back gives
// the report and table byte for byte.
func TestSNPEvidenceGolden(t *testing.T) {
	_, raw := fixedMilanReport(t)
	table := fixedCertTable()
	ev, err := NewSNPEvidence(raw, table)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "snp-evidence-milan-v3.json", got)

	var back SNPEvidence
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatal(err)
	}
	r2, t2, err := back.Raw()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r2, raw) {
		t.Fatal("the report read back from the evidence JSON differs from the original")
	}
	if !bytes.Equal(t2, table) {
		t.Fatal("the certificate table read back from the evidence JSON differs from the original")
	}
}

// The JSON carries each field under sev's name with serde's encodings:
// checked against go-sev-guest's own parse of the same bytes.
func TestSNPEvidenceFieldsMatchGoSevGuest(t *testing.T) {
	want, raw := fixedMilanReport(t)
	ev, err := NewSNPEvidence(raw, fixedCertTable())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(ev)
	var doc struct {
		Report    map[string]json.RawMessage `json:"attestation_report"`
		CertChain []map[string]any           `json:"cert_chain"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	num := func(k string) uint64 {
		var n uint64
		if err := json.Unmarshal(doc.Report[k], &n); err != nil {
			t.Fatalf("%s = %s: not a number", k, doc.Report[k])
		}
		return n
	}
	arr := func(k string) []byte {
		var ns []int
		if err := json.Unmarshal(doc.Report[k], &ns); err != nil {
			t.Fatalf("%s = %s: not an array of numbers", k, doc.Report[k])
		}
		out := make([]byte, len(ns))
		for i, n := range ns {
			out[i] = byte(n)
		}
		return out
	}
	for k, w := range map[string]uint64{"version": uint64(want.Version), "guest_svn": uint64(want.GuestSvn), "policy": want.Policy,
		"vmpl": uint64(want.Vmpl), "sig_algo": uint64(want.SignatureAlgo), "plat_info": want.PlatformInfo, "key_info": uint64(want.SignerInfo),
		"cpuid_fam_id": 0x19, "cpuid_mod_id": 0x01, "cpuid_step": 0x01} {
		if g := num(k); g != w {
			t.Errorf("%s = %d, want %d", k, g, w)
		}
	}
	for k, w := range map[string][]byte{"family_id": want.FamilyId, "image_id": want.ImageId, "report_data": want.ReportData,
		"measurement": want.Measurement, "host_data": want.HostData, "id_key_digest": want.IdKeyDigest,
		"author_key_digest": want.AuthorKeyDigest, "report_id": want.ReportId, "report_id_ma": want.ReportIdMa, "chip_id": want.ChipId} {
		if g := arr(k); !bytes.Equal(g, w) {
			t.Errorf("%s = %x, want %x", k, g, w)
		}
	}
	for k, w := range map[string]uint64{"current_tcb": want.CurrentTcb, "reported_tcb": want.ReportedTcb, "committed_tcb": want.CommittedTcb, "launch_tcb": want.LaunchTcb} {
		var tcb map[string]*int
		if err := json.Unmarshal(doc.Report[k], &tcb); err != nil {
			t.Fatal(err)
		}
		p := kds.DecomposeTCBVersion(kds.TCBVersion(w))
		if tcb["fmc"] != nil || *tcb["bootloader"] != int(p.BlSpl) || *tcb["tee"] != int(p.TeeSpl) || *tcb["snp"] != int(p.SnpSpl) || *tcb["microcode"] != int(p.UcodeSpl) {
			t.Errorf("%s = %s, want %+v and fmc null (Milan)", k, doc.Report[k], p)
		}
	}
	var cur map[string]int
	_ = json.Unmarshal(doc.Report["current"], &cur)
	if cur["major"] != 1 || cur["minor"] != 55 || cur["build"] != 21 {
		t.Errorf("current = %v", cur)
	}
	for _, k := range []string{"launch_mit_vector", "current_mit_vector"} {
		if string(doc.Report[k]) != "null" {
			t.Errorf("%s = %s: want null in a version 3 report", k, doc.Report[k])
		}
	}
	var sig struct{ R, S []int }
	_ = json.Unmarshal(doc.Report["signature"], &sig)
	if len(sig.R) != 72 || len(sig.S) != 72 || byte(sig.R[0]) != want.Signature[0] || byte(sig.S[0]) != want.Signature[72] {
		t.Errorf("signature = %s", doc.Report["signature"])
	}
	types := []any{}
	for _, c := range doc.CertChain {
		types = append(types, c["cert_type"])
	}
	if len(types) != 4 || types[0] != "VCEK" || types[1] != "ASK" || types[2] != "ARK" ||
		types[3].(map[string]any)["OTHER"] != "11111111-2222-3333-4444-555555555555" {
		t.Errorf("cert types = %v, want VCEK, ASK, ARK, {OTHER: guid}", types)
	}
	if d, _ := json.Marshal(doc.CertChain[0]["data"]); string(d) != "[118,99,101,107,45,100,101,114]" {
		t.Errorf("VCEK data = %s: want the DER bytes as an array of numbers", d)
	}
}

// publishedReportKeys are the keys of attestation_report, in order, in the
// SNP evidence Trustee publishes as test data
// (confidential-containers/trustee attestation-service/tests/e2e/
// evidence.json, read by deps/verifier/src/snp's tests), serialized by an
// sev release before the mitigation vectors; sev 7.1, which Trustee's
// verifier pins, adds launch_mit_vector and current_mit_vector before the
// signature.
var publishedReportKeys = []string{"version", "guest_svn", "policy", "family_id", "image_id", "vmpl", "sig_algo",
	"current_tcb", "plat_info", "key_info", "report_data", "measurement", "host_data", "id_key_digest",
	"author_key_digest", "report_id", "report_id_ma", "reported_tcb", "cpuid_fam_id", "cpuid_mod_id", "cpuid_step",
	"chip_id", "committed_tcb", "current", "committed", "launch_tcb", "signature"}

// objectKeys returns the keys of a JSON object in document order.
func objectKeys(t *testing.T, obj []byte) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %s", obj)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func TestSNPEvidenceKeyOrderMatchesPublished(t *testing.T) {
	_, raw := fixedMilanReport(t)
	ev, _ := NewSNPEvidence(raw, nil)
	b, _ := json.Marshal(ev)
	if k := objectKeys(t, b); !slices.Equal(k, []string{"attestation_report", "cert_chain"}) {
		t.Fatalf("evidence keys %v", k)
	}
	if !strings.HasSuffix(string(b), `"cert_chain":null}`) {
		t.Error("no certificate table must give cert_chain null (the verifier then asks AMD's KDS)")
	}
	var doc struct {
		Report json.RawMessage `json:"attestation_report"`
	}
	_ = json.Unmarshal(b, &doc)
	want := slices.Insert(slices.Clone(publishedReportKeys), len(publishedReportKeys)-1, "launch_mit_vector", "current_mit_vector")
	if k := objectKeys(t, doc.Report); !slices.Equal(k, want) {
		t.Fatalf("report keys\n%v\nwant\n%v", k, want)
	}
}

// A published-style document without the mitigation vector keys (as
// Trustee's test data and sev 6 serialize it) reads as a version 3 report.
func TestSNPEvidenceWithoutMitVectors(t *testing.T) {
	_, raw := fixedMilanReport(t)
	ev, _ := NewSNPEvidence(raw, fixedCertTable())
	b, _ := json.Marshal(ev)
	old := strings.Replace(string(b), `"launch_mit_vector":null,"current_mit_vector":null,`, "", 1)
	if old == string(b) {
		t.Fatal("the mitigation vectors were not in the JSON")
	}
	var back SNPEvidence
	if err := json.Unmarshal([]byte(old), &back); err != nil {
		t.Fatal(err)
	}
	r2, _, err := back.Raw()
	if err != nil || !bytes.Equal(r2, raw) {
		t.Fatalf("report read back differs (err %v)", err)
	}
}

// A Turin version 5 report: the TCB carries FMC first, and the
// mitigation vectors are numbers.
func TestSNPReportTurinV5(t *testing.T) {
	raw := make([]byte, abi.ReportSize)
	le := binary.LittleEndian
	le.PutUint32(raw[0:], 5)
	for _, off := range []int{0x38, 0x180, 0x1E0, 0x1F0} {
		copy(raw[off:], []byte{9, 4, 1, 23, 0, 0, 0, 72}) // FMC, BL, TEE, SNP, -, -, -, ucode
	}
	raw[0x188], raw[0x189], raw[0x18A] = 0x1A, 0x02, 0x01
	copy(raw[0x1A0:], pattern(8, 0x51)) // Turin CHIP_ID: 8 bytes
	le.PutUint64(raw[0x1F8:], 0x11)
	le.PutUint64(raw[0x200:], 0x13)
	r, err := ParseSNPReport(raw)
	if err != nil {
		t.Fatal(err)
	}
	if r.ReportedTCB.FMC == nil || *r.ReportedTCB.FMC != 9 || r.ReportedTCB.Bootloader != 4 || r.ReportedTCB.TEE != 1 || r.ReportedTCB.SNP != 23 || r.ReportedTCB.Microcode != 72 {
		t.Fatalf("Turin TCB = %+v", r.ReportedTCB)
	}
	if r.LaunchMitVector == nil || *r.LaunchMitVector != 0x11 || r.CurrentMitVector == nil || *r.CurrentMitVector != 0x13 {
		t.Fatal("mitigation vectors not read from a version 5 report")
	}
	back, err := r.Marshal()
	if err != nil || !bytes.Equal(back, raw) {
		t.Fatalf("Turin report does not round-trip (err %v)", err)
	}
	raw[0x188] = 0x17 // not an SNP processor family
	if _, err := ParseSNPReport(raw); err == nil || !strings.Contains(err.Error(), "family") {
		t.Fatalf("unknown CPU family: err %v", err)
	}
}

// Reserved bytes do not survive, as in sev: a report whose reserved bytes
// are set re-encodes differently (and would not verify).
func TestSNPReportReservedDropped(t *testing.T) {
	_, raw := fixedMilanReport(t)
	raw[0x4C] = 1 // reserved after KEY_INFO
	r, err := ParseSNPReport(raw)
	if err != nil {
		t.Fatal(err)
	}
	back, _ := r.Marshal()
	if back[0x4C] != 0 || bytes.Equal(back, raw) {
		t.Fatal("a reserved byte survived the round trip")
	}
}

func TestCertTypeJSON(t *testing.T) {
	for _, bad := range []string{`"VCEKX"`, `{"OTHER":"not-a-uuid"}`, `{"X":"11111111-2222-3333-4444-555555555555"}`, `7`} {
		var c CertType
		if err := json.Unmarshal([]byte(bad), &c); err == nil {
			t.Errorf("cert_type %s accepted", bad)
		}
	}
	var b Bytes
	if err := json.Unmarshal([]byte(`[1,256]`), &b); err == nil {
		t.Error("data element 256 accepted")
	}
	if err := json.Unmarshal([]byte(`"AQI="`), &b); err == nil {
		t.Error("base64 data accepted: serde's Vec<u8> is an array of numbers")
	}
}

var trusteeEvidence = flag.String("trustee-evidence", "", "also decode this SNP evidence JSON (e.g. trustee's attestation-service/tests/e2e/evidence.json) and verify its report signature with go-sev-guest against AMD's embedded roots")

// The sample evidence Trustee publishes decodes, and the report re-encoded
// from it verifies under its VCEK and AMD's roots: the encoding is the
// one a real Trustee and a real SNP machine use. The sample is not kept in
// this repository; pass it with -trustee-evidence. Without it, a document
// shaped like it (no mitigation vectors, a VCEK entry) built from the
// fixed report is decoded instead.
func TestDecodeTrusteeSampleEvidence(t *testing.T) {
	doc := []byte(nil)
	if *trusteeEvidence != "" {
		var err error
		if doc, err = os.ReadFile(*trusteeEvidence); err != nil {
			t.Fatal(err)
		}
	} else {
		_, raw := fixedMilanReport(t)
		ev, _ := NewSNPEvidence(raw, fixedCertTable())
		b, _ := json.Marshal(ev)
		doc = []byte(strings.Replace(string(b), `"launch_mit_vector":null,"current_mit_vector":null,`, "", 1))
	}
	var ev SNPEvidence
	if err := json.Unmarshal(doc, &ev); err != nil {
		t.Fatal(err)
	}
	report, table, err := ev.Raw()
	if err != nil {
		t.Fatal(err)
	}
	if len(ev.CertChain) == 0 || ev.CertChain[0].CertType.Name != "VCEK" {
		t.Fatalf("cert_chain %v: want a VCEK first", ev.CertChain)
	}
	// Written back, the document is the same bytes, but for the two
	// mitigation vector keys sev 7.1 writes (null for version 3).
	again, _ := json.Marshal(&ev)
	again = bytes.Replace(again, []byte(`"launch_mit_vector":null,"current_mit_vector":null,`), nil, 1)
	if !bytes.Equal(again, bytes.TrimSpace(doc)) {
		t.Fatalf("the evidence written back differs from the document:\n%s", again)
	}
	if *trusteeEvidence == "" {
		return // the fixed report is not signed by AMD
	}
	proto, err := abi.ReportToProto(report)
	if err != nil {
		t.Fatal(err)
	}
	var certs abi.CertTable
	if err := certs.Unmarshal(table); err != nil {
		t.Fatal(err)
	}
	vcek, err := certs.GetByGUIDString(abi.VcekGUID)
	if err != nil {
		t.Fatal(err)
	}
	att := &spb.Attestation{Report: proto, CertificateChain: &spb.CertificateChain{VcekCert: vcek}}
	opts := verify.DefaultOptions()
	opts.DisableCertFetching = true
	if gen, _ := generation(*ev.AttestationReport.CPUIDFamID, *ev.AttestationReport.CPUIDModID); gen == genGenoa {
		// go-sev-guest v0.15 does not know every model sev counts as
		// Genoa (0xA0-0xAF) and calls it "Unknown": trust AMD's Genoa
		// roots for it.
		genoa, err := trust.GetDefaultRootCerts("Genoa")
		if err != nil {
			t.Fatal(err)
		}
		opts.TrustedRoots = map[string][]*trust.AMDRootCerts{"Unknown": {genoa}, "Genoa": {genoa}}
	}
	if err := verify.SnpAttestation(att, opts); err != nil {
		t.Fatalf("the published report, re-encoded from its JSON, does not verify: %v", err)
	}
	t.Logf("published evidence: version %d report, measurement %x, signature verified", proto.GetVersion(), proto.GetMeasurement())
}
