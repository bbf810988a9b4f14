package broker

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/broker/nvidia"
)

// GPU evidence. A pod with confidential GPUs sends, beside its CPU
// evidence, each GPU's attestation report in the KBS protocol's composite
// form: tee-evidence.additional_evidence is a JSON string mapping a TEE
// type to its evidence, here
//
//	{"nvidia": {"device_evidence_list": [
//	    {"arch": "HOPPER", "uuid": "GPU-…", "evidence": "<hex or base64 report>",
//	     "certificate": "<base64 of the PEM certificate chain>"}]}}
//
// as Trustee's KBS and NVIDIA verifier read it. The CPU evidence binds that
// string (kbsapi.PrimaryRuntimeData), so the host cannot swap the GPU
// evidence of a verified pod; each GPU report binds the session through
// its SPDM nonce: the first 32 bytes of the hash of the runtime data
// {nonce, tee-pubkey} (without additional-evidence), as Trustee computes
// it. Whatever GPU evidence comes is verified (a report that does not
// verify refuses the attestation); a workload of the owner's resource
// policy requires it with a [workloads.NAME.gpu] table (GPURequirement).

// TeeNVIDIA is the additional-evidence key of NVIDIA devices.
const TeeNVIDIA = "nvidia"

// maxGPUs bounds the devices one attestation may carry.
const maxGPUs = 16

// GPUEvidence is one device's entry in the device_evidence_list.
type GPUEvidence struct {
	Arch        string `json:"arch"`
	UUID        string `json:"uuid,omitempty"`
	Evidence    string `json:"evidence"`
	Certificate string `json:"certificate"`
}

// GPUClaims is a verified GPU.
type GPUClaims struct {
	nvidia.Claims
	UUID string `json:"uuid,omitempty"`
}

// GPUVerifier verifies one GPU's evidence against the 32-byte nonce the
// session expects.
type GPUVerifier interface {
	VerifyGPU(ev GPUEvidence, nonce []byte) (*GPUClaims, error)
}

// LocalGPUVerifier verifies Hopper reports on the broker
// (launcher/broker/nvidia) against NVIDIA's pinned device root. It
// refuses Blackwell and NVSwitch evidence, whose reports it does not
// parse: a broker that must accept them needs another GPUVerifier (such
// as one calling NVIDIA's remote attestation service, which needs an
// agreement with NVIDIA and is not implemented here).
type LocalGPUVerifier struct {
	// Now is the clock certificates are checked at (nil: time.Now).
	Now func() time.Time
}

// VerifyGPU implements GPUVerifier.
func (v LocalGPUVerifier) VerifyGPU(ev GPUEvidence, nonce []byte) (*GPUClaims, error) {
	if !strings.EqualFold(ev.Arch, "hopper") {
		return nil, fmt.Errorf("GPU %s: architecture %q is not verified by this broker (Hopper only)", ev.UUID, ev.Arch)
	}
	report, err := decodeReport(ev.Evidence)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: %w", ev.UUID, err)
	}
	chain, err := base64.StdEncoding.DecodeString(ev.Certificate)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: certificate: not standard base64: %w", ev.UUID, err)
	}
	o := nvidia.Options{Nonce: nonce}
	if v.Now != nil {
		o.Now = v.Now()
	}
	c, err := nvidia.VerifyHopper(report, chain, o)
	if err != nil {
		return nil, fmt.Errorf("GPU %s: %w", ev.UUID, err)
	}
	return &GPUClaims{Claims: *c, UUID: ev.UUID}, nil
}

// decodeReport reads a report in hex (the SDK's encoding) or standard
// base64 (NVIDIA's newer attestation tools).
func decodeReport(s string) ([]byte, error) {
	if b, err := hex.DecodeString(s); err == nil {
		return b, nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, errors.New("evidence: neither hex nor standard base64")
	}
	return b, nil
}

// gpuNonce is the SPDM nonce the session's GPU reports must carry.
func gpuNonce(rt kbsapi.RuntimeData, alg string) ([]byte, error) {
	doc, err := json.Marshal(map[string]json.RawMessage{"nonce": mustJSON(rt.Nonce), "tee-pubkey": rt.TeePubKey})
	if err != nil {
		return nil, err
	}
	rd, err := kbsapi.ReportData(doc, alg)
	if err != nil {
		return nil, err
	}
	return rd[:nvidia.NonceSize], nil
}

func mustJSON(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// verifyAdditional verifies the additional evidence of an attestation
// (none: nil) and returns the GPUs it shows.
func (b *Broker) verifyAdditional(att *kbsapi.Attestation, alg string) ([]GPUClaims, error) {
	raw := att.TeeEvidence.AdditionalEvidence
	if raw == "" {
		return nil, nil
	}
	var byTEE map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &byTEE); err != nil {
		return nil, fmt.Errorf("tee-evidence additional_evidence: want a JSON object of TEE type to evidence: %w", err)
	}
	for k := range byTEE {
		if k != TeeNVIDIA {
			return nil, fmt.Errorf("tee-evidence additional_evidence: %q devices are not verified by this broker (only %q)", k, TeeNVIDIA)
		}
	}
	ev, ok := byTEE[TeeNVIDIA]
	if !ok {
		return nil, nil
	}
	var list struct {
		Devices []GPUEvidence `json:"device_evidence_list"`
	}
	if err := json.Unmarshal(ev, &list); err != nil {
		return nil, fmt.Errorf("nvidia evidence: want {\"device_evidence_list\": [...]}: %w", err)
	}
	if len(list.Devices) == 0 || len(list.Devices) > maxGPUs {
		return nil, fmt.Errorf("nvidia evidence: %d devices, want 1 to %d", len(list.Devices), maxGPUs)
	}
	nonce, err := gpuNonce(att.RuntimeData, alg)
	if err != nil {
		return nil, err
	}
	v := b.GPUVerifier
	if v == nil {
		v = LocalGPUVerifier{}
	}
	var out []GPUClaims
	seen := map[string]bool{}
	for i, d := range list.Devices {
		c, err := v.VerifyGPU(d, nonce)
		if err != nil {
			return nil, fmt.Errorf("nvidia evidence, device %d: %w", i, err)
		}
		// One GPU's report twice would count it twice.
		if seen[c.Leaf] {
			return nil, fmt.Errorf("nvidia evidence, device %d: the same GPU (%s) twice", i, c.Leaf)
		}
		seen[c.Leaf] = true
		out = append(out, *c)
	}
	return out, nil
}

// GPURequirement is a workload's [workloads.NAME.gpu] table: the GPUs an
// attested session must have shown verified reports of.
//
//	[workloads.trainer.gpu]
//	count = 1                              # at least this many GPUs (default 1)
//	driver_versions = ["550.90.07"]        # each GPU's driver_version, any of
//	vbios_versions = ["96.00.9f.00.01"]    # each GPU's VBIOS version, any of
//	measurements = { 2 = "8048…" }         # measurement blocks by index, each GPU
type GPURequirement struct {
	Count          int                   `toml:"count" json:"count"`
	DriverVersions []string              `toml:"driver_versions" json:"driver_versions"`
	VBIOSVersions  []string              `toml:"vbios_versions" json:"vbios_versions"`
	Measurements   map[string]attest.Hex `toml:"measurements" json:"measurements"`
}

func (g *GPURequirement) validate() error {
	if g.Count < 0 || g.Count > maxGPUs {
		return fmt.Errorf("gpu.count %d: want 0 (one) to %d", g.Count, maxGPUs)
	}
	for k, v := range g.Measurements {
		if n, err := strconv.Atoi(k); err != nil || n < 1 || n > 255 {
			return fmt.Errorf("gpu.measurements key %q: want a measurement block index 1-255", k)
		}
		if len(v) == 0 {
			return fmt.Errorf("gpu.measurements %s is empty", k)
		}
	}
	return nil
}

// check returns why the GPUs do not meet g ("" when they do).
func (g *GPURequirement) check(gpus []GPUClaims) string {
	want := max(g.Count, 1)
	if len(gpus) < want {
		return fmt.Sprintf("GPU evidence: %d verified GPUs, the workload requires %d (the pod sent no nvidia additional evidence, or too little)", len(gpus), want)
	}
	for _, c := range gpus {
		if len(g.DriverVersions) > 0 && !slices.Contains(g.DriverVersions, c.DriverVersion) {
			return fmt.Sprintf("GPU %s: driver version %s is not one of the workload's driver_versions", c.UUID, c.DriverVersion)
		}
		if len(g.VBIOSVersions) > 0 && !slices.Contains(g.VBIOSVersions, c.VBIOSVersion) {
			return fmt.Sprintf("GPU %s: VBIOS version %s is not one of the workload's vbios_versions", c.UUID, c.VBIOSVersion)
		}
		for k, v := range g.Measurements {
			i, _ := strconv.Atoi(k)
			if c.Measurements[i] != v.String() {
				return fmt.Sprintf("GPU %s: measurement %d is %q, not the workload's %s", c.UUID, i, c.Measurements[i], v)
			}
		}
	}
	return ""
}
