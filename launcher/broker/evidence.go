package broker

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
)

// The fields serde requires in Trustee's SnpEvidence (deps/verifier/src/
// snp) and sev's AttestationReport, TcbVersion, Version and Signature: all
// but the Options (cpuid_*, *_mit_vector, fmc), which may be absent.
var (
	snpEvidenceFields = []string{"attestation_report"}
	snpReportFields   = []string{"version", "guest_svn", "policy", "family_id", "image_id", "vmpl", "sig_algo",
		"current_tcb", "plat_info", "key_info", "report_data", "measurement", "host_data", "id_key_digest",
		"author_key_digest", "report_id", "report_id_ma", "reported_tcb", "chip_id", "committed_tcb",
		"current", "committed", "launch_tcb", "signature"}
	tcbFields     = []string{"bootloader", "tee", "snp", "microcode"}
	versionFields = []string{"major", "minor", "build"}
	sigFields     = []string{"r", "s"}
	certFields    = []string{"cert_type", "data"}
)

// requireFields checks that the JSON object obj has every name in want.
func requireFields(what string, obj json.RawMessage, want []string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(obj, &m); err != nil {
		return nil, fmt.Errorf("%s: want a JSON object: %w", what, err)
	}
	var missing []string
	for _, k := range want {
		if _, ok := m[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%s: missing %s", what, strings.Join(missing, ", "))
	}
	return m, nil
}

// checkSNPShape refuses snp evidence Trustee's deserializer would refuse
// for a missing field.
func checkSNPShape(raw json.RawMessage) error {
	ev, err := requireFields("snp evidence", raw, snpEvidenceFields)
	if err != nil {
		return err
	}
	rep, err := requireFields("snp evidence attestation_report", ev["attestation_report"], snpReportFields)
	if err != nil {
		return err
	}
	for _, k := range []string{"current_tcb", "reported_tcb", "committed_tcb", "launch_tcb"} {
		if _, err := requireFields("snp attestation_report "+k, rep[k], tcbFields); err != nil {
			return err
		}
	}
	for _, k := range []string{"current", "committed"} {
		if _, err := requireFields("snp attestation_report "+k, rep[k], versionFields); err != nil {
			return err
		}
	}
	if _, err := requireFields("snp attestation_report signature", rep["signature"], sigFields); err != nil {
		return err
	}
	if c := ev["cert_chain"]; len(c) > 0 && !bytes.Equal(c, []byte("null")) {
		var entries []json.RawMessage
		if err := json.Unmarshal(c, &entries); err != nil {
			return fmt.Errorf("snp evidence cert_chain: want an array or null: %w", err)
		}
		for i, e := range entries {
			if _, err := requireFields(fmt.Sprintf("snp evidence cert_chain[%d]", i), e, certFields); err != nil {
				return err
			}
		}
	}
	return nil
}

// decodeSNP reads snp primary evidence in the encoding of Trustee's SNP
// verifier and returns the report as the verifier re-encodes it before
// checking its signature, and the certificate table.
func decodeSNP(raw json.RawMessage) (report, certTable []byte, err error) {
	if err := checkSNPShape(raw); err != nil {
		return nil, nil, err
	}
	var ev kbsapi.SNPEvidence
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, nil, fmt.Errorf("snp evidence: %w", err)
	}
	report, certTable, err = ev.Raw()
	if err != nil {
		return nil, nil, fmt.Errorf("snp evidence: %w", err)
	}
	return report, certTable, nil
}

// decodeTDX reads tdx primary evidence in the encoding of Trustee's TDX
// verifier and returns the quote and the CC event log, if any (the
// verifier replays it to the quote's RTMRs).
func decodeTDX(raw json.RawMessage) (quote, eventLog []byte, err error) {
	m, err := requireFields("tdx evidence", raw, []string{"quote"})
	if err != nil {
		return nil, nil, err
	}
	if !slices.Contains([]string{"", "null"}, string(m["cc_eventlog"])) {
		var el string
		if err := json.Unmarshal(m["cc_eventlog"], &el); err != nil {
			return nil, nil, fmt.Errorf("tdx evidence cc_eventlog: want a base64 string or null: %w", err)
		}
		// The CC event log, which the verifier replays to the quote's
		// RTMRs.
		if eventLog, err = base64.StdEncoding.DecodeString(el); err != nil {
			return nil, nil, fmt.Errorf("tdx evidence cc_eventlog: not standard base64: %w", err)
		}
	}
	var ev kbsapi.TDXEvidence
	if err := json.Unmarshal(raw, &ev); err != nil {
		return nil, nil, fmt.Errorf("tdx evidence: %w", err)
	}
	if ev.Quote == "" {
		return nil, nil, fmt.Errorf("tdx evidence: the quote is empty")
	}
	q, err := base64.StdEncoding.DecodeString(ev.Quote)
	if err != nil {
		return nil, nil, fmt.Errorf("tdx evidence quote: not standard base64: %w", err)
	}
	return q, eventLog, nil
}
