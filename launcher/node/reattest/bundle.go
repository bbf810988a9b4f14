package reattest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-sev-guest/kds"

	"github.com/c8s-dev/c8s/launcher/attest"
)

// What a pod that fails the policy gets (Bundle.OnFailure).
const (
	// OnFailureReport reports the pod (condition, event) and leaves it
	// running.
	OnFailureReport = "report"
	// OnFailureStop reports the pod and stops its sandbox.
	OnFailureStop = "stop"
)

// Sizes of the digests a bundle names.
const (
	chipIDSize      = 64 // SNP CHIP_ID
	measurementSize = 48 // SNP MEASUREMENT, TDX MRTD
	hostDataSize    = 32 // SNP HOST_DATA: SHA-256 of the init data
	mrConfigIDSize  = 48 // TDX MRCONFIGID: SHA-384 of the init data
)

// Bundle is the owner's current word on what a pod VM must show: the
// reference values, the minimum TCB and what is revoked. The owner signs
// it (Sign); the node agent takes only a bundle that verifies with one of
// the owner keys it is configured with, and only one newer than the one
// in force (Serial).
//
//	{
//	  "serial": 7,
//	  "issued": "2025-06-01T12:00:00Z",
//	  "expires": "2025-07-01T12:00:00Z",
//	  "on_failure": "stop",
//	  "reference": {"sim": {"measurements": {"1": "9c1e…", "2": "3f2a…"}}, "tdx": {"mrtd": "…"}},
//	  "min_tcb": "0x7308000000000004",
//	  "revoked": {
//	    "chip_ids": ["…"], "tcb_versions": ["0x7308000000000003"],
//	    "init_data_digests": ["…"], "measurements": ["…"]
//	  }
//	}
type Bundle struct {
	// Serial orders the owner's bundles: a node takes a bundle only when
	// its serial is higher than the one in force, so the host cannot put
	// an older bundle (one without a revocation) back. Required, from 1.
	Serial uint64 `json:"serial"`
	// Issued is when the owner signed it (informational).
	Issued time.Time `json:"issued,omitzero"`
	// Expires, when set, is when the bundle stops vouching for anything:
	// after it every pod fails with BundleExpired until a newer bundle
	// arrives. It bounds how long a node that no longer receives the
	// owner's bundles keeps passing pods.
	Expires time.Time `json:"expires,omitzero"`
	// OnFailure is OnFailureReport or OnFailureStop; empty keeps the node's
	// configured default.
	OnFailure string `json:"on_failure,omitempty"`
	// Reference are the accepted launch digests by TEE ("sim", "snp",
	// "tdx"). A TEE listed here is checked against these only, not against
	// the node's image manifest; a TEE not listed keeps the manifest's.
	Reference map[string]Reference `json:"reference,omitempty"`
	// MinTCB is the minimum SNP (and sim) TCB_VERSION, compared component
	// by component with the report's REPORTED_TCB; the node's own
	// attestation.min_tcb still applies as well.
	MinTCB TCB `json:"min_tcb,omitempty"`
	// Revoked lists what no pod may show any more.
	Revoked Revoked `json:"revoked,omitzero"`
}

// Reference are the launch digests one TEE's pod VMs may have.
type Reference struct {
	// Measurements are the SNP (and sim) launch digests by vCPU count.
	Measurements map[int]attest.Hex `json:"measurements,omitempty"`
	// MRTD is the TDX MRTD.
	MRTD attest.Hex `json:"mrtd,omitempty"`
}

// Revoked are the revocations.
type Revoked struct {
	// ChipIDs are SNP CHIP_IDs (64 bytes): chips whose evidence no longer
	// counts. A node whose own chip is listed stops advertising capacity.
	ChipIDs []attest.Hex `json:"chip_ids,omitempty"`
	// TCBs are SNP TCB_VERSIONs that no longer count, exactly as
	// REPORTED_TCB shows them (min_tcb covers everything below a version).
	TCBs []TCB `json:"tcb_versions,omitempty"`
	// InitData are init data digests: SHA-256 (SNP HOST_DATA, 32 bytes) or
	// SHA-384 (TDX MRCONFIGID, 48 bytes), as c8s-measure prints them.
	InitData []attest.Hex `json:"init_data_digests,omitempty"`
	// Measurements are launch digests (SNP MEASUREMENT or TDX MRTD, 48
	// bytes) of images that no longer count.
	Measurements []attest.Hex `json:"measurements,omitempty"`
}

// TCB is an SNP TCB_VERSION. In JSON it is a number or a string, hex with
// 0x (as `c8s-launcher attest` prints reported_tcb) or decimal.
type TCB uint64

// MarshalJSON writes the TCB as a 0x hex string.
func (t TCB) MarshalJSON() ([]byte, error) { return json.Marshal(t.String()) }

func (t TCB) String() string { return fmt.Sprintf("%#016x", uint64(t)) }

// UnmarshalJSON reads a number or a hex or decimal string.
func (t *TCB) UnmarshalJSON(b []byte) error {
	s := string(b)
	if strings.HasPrefix(s, `"`) {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
	}
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil {
		return fmt.Errorf("TCB version %s: want a 64-bit number, 0x hex or decimal", b)
	}
	*t = TCB(v)
	return nil
}

// Parts are the TCB's security patch levels (Milan and Genoa layout).
func (t TCB) Parts() kds.TCBParts { return kds.DecomposeTCBVersion(kds.TCBVersion(t)) }

// tcbString names a TCB's parts for messages.
func tcbString(t TCB) string {
	p := t.Parts()
	return fmt.Sprintf("%s (bl=%d tee=%d snp=%d ucode=%d)", t, p.BlSpl, p.TeeSpl, p.SnpSpl, p.UcodeSpl)
}

// ParseBundle decodes a bundle's JSON and checks it. Unknown fields are
// refused: a revocation this node does not understand must not be dropped
// silently.
func ParseBundle(b []byte) (*Bundle, error) {
	var out Bundle
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&out); err != nil {
		return nil, fmt.Errorf("trust bundle: %w (a field this c8s does not know is refused: update c8s before using it)", err)
	}
	if dec.More() {
		return nil, errors.New("trust bundle: data after the JSON object")
	}
	if err := out.validate(); err != nil {
		return nil, fmt.Errorf("trust bundle: %w", err)
	}
	return &out, nil
}

func (b *Bundle) validate() error {
	if b.Serial == 0 {
		return errors.New("no serial: number the owner's bundles from 1, higher for each new one")
	}
	switch b.OnFailure {
	case "", OnFailureReport, OnFailureStop:
	default:
		return fmt.Errorf("on_failure %q: want %q or %q", b.OnFailure, OnFailureReport, OnFailureStop)
	}
	var errs []error
	size := func(what string, v attest.Hex, sizes ...int) {
		for _, n := range sizes {
			if len(v) == n {
				return
			}
		}
		errs = append(errs, fmt.Errorf("%s %s is %d bytes, want %v", what, v, len(v), sizes))
	}
	for tee, r := range b.Reference {
		switch tee {
		case "sim", "snp":
			if len(r.MRTD) != 0 || len(r.Measurements) == 0 {
				errs = append(errs, fmt.Errorf("reference.%s: give measurements (by vCPU count), no mrtd", tee))
			}
			for n, m := range r.Measurements {
				if n < 1 {
					errs = append(errs, fmt.Errorf("reference.%s.measurements: vCPU count %d", tee, n))
				}
				size(fmt.Sprintf("reference.%s.measurements[%d]", tee, n), m, measurementSize)
			}
		case "tdx":
			if len(r.Measurements) != 0 {
				errs = append(errs, errors.New("reference.tdx: give mrtd, no measurements"))
			}
			size("reference.tdx.mrtd", r.MRTD, measurementSize)
		default:
			errs = append(errs, fmt.Errorf("reference.%s: unknown TEE (want sim, snp or tdx)", tee))
		}
	}
	for _, c := range b.Revoked.ChipIDs {
		size("revoked.chip_ids", c, chipIDSize)
	}
	for _, d := range b.Revoked.InitData {
		size("revoked.init_data_digests", d, hostDataSize, mrConfigIDSize)
	}
	for _, m := range b.Revoked.Measurements {
		size("revoked.measurements", m, measurementSize)
	}
	if !b.Expires.IsZero() && !b.Issued.IsZero() && !b.Expires.After(b.Issued) {
		errs = append(errs, fmt.Errorf("expires %s is not after issued %s", b.Expires.Format(time.RFC3339), b.Issued.Format(time.RFC3339)))
	}
	return errors.Join(errs...)
}

// expired says whether the bundle no longer vouches at now.
func (b *Bundle) expired(now time.Time) bool {
	return b != nil && !b.Expires.IsZero() && !now.Before(b.Expires)
}
