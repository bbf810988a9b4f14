package reattest

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/manifest"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

// Status is a Kubernetes condition status.
type Status string

// The statuses of the c8s.io/Attested condition.
const (
	StatusTrue    Status = "True"
	StatusFalse   Status = "False"
	StatusUnknown Status = "Unknown"
)

// The reasons of a verdict (the condition's and the event's reason).
const (
	// ReasonVerified: the evidence satisfies the policy in force.
	ReasonVerified = "Verified"
	// ReasonEvidenceUnavailable: the shim or the guest gave no evidence
	// (Unknown: nothing was proven either way).
	ReasonEvidenceUnavailable = "EvidenceUnavailable"
	// ReasonVerifierError: the node cannot verify (its roots or manifest
	// are missing); Unknown.
	ReasonVerifierError = "VerifierError"
	// ReasonEvidenceRejected: the evidence does not verify (signature,
	// chain, freshness, init data, debug).
	ReasonEvidenceRejected = "EvidenceRejected"
	// ReasonMeasurementMismatch: the launch digest is not one of the
	// reference values.
	ReasonMeasurementMismatch = "MeasurementMismatch"
	// ReasonMeasuredBootMismatch: the event log does not replay to the
	// RTMRs, or names another kernel, command line or initrd than the
	// VM's image (tdx, and the sim TEE's modelled RTMRs).
	ReasonMeasuredBootMismatch = "MeasuredBootMismatch"
	// ReasonBundleExpired: the owner's bundle in force has expired.
	ReasonBundleExpired = "BundleExpired"
	// ReasonChipRevoked, ReasonTCBRevoked, ReasonTCBBelowMinimum: the
	// node's chip or firmware no longer counts (the node's failure too).
	ReasonChipRevoked     = "ChipRevoked"
	ReasonTCBRevoked      = "TCBRevoked"
	ReasonTCBBelowMinimum = "TCBBelowMinimum"
	// ReasonInitDataRevoked, ReasonMeasurementRevoked: the pod's init data
	// or image no longer counts.
	ReasonInitDataRevoked    = "InitDataRevoked"
	ReasonMeasurementRevoked = "MeasurementRevoked"
)

// Verdict is what one re-attestation found.
type Verdict struct {
	Status Status
	// Reason is one of the Reason constants (the first failure's);
	// Message says what failed, with the values.
	Reason, Message string
	// Node is true when the failure is the node's (its chip or TCB).
	Node bool
	// Identity is what the verified evidence showed; nil when it did not
	// verify.
	Identity *Identity
}

// Identity are the verified fields re-attestation judges.
type Identity struct {
	TEE    string
	ChipID attest.Hex
	// TCB is the SNP REPORTED_TCB and LaunchTCB its LAUNCH_TCB: the
	// firmware updated live since a launch raises only the first.
	TCB, LaunchTCB TCB
	Measurement    attest.Hex
	// InitData is the SNP HOST_DATA or the TDX MRCONFIGID.
	InitData attest.Hex
	// Boot is the measured boot the evidence's event log verified against;
	// nil when none was checked (snp, a sim image that records none).
	Boot *Boot
}

// Boot is a measured boot: the kernel, command line and initrd the event
// log must name and the RTMRs it must replay to (attest.BootPolicy).
type Boot struct {
	TDXBoot *attest.TDXBoot
	RTMRs   []attest.Hex
}

// Checker verifies a pod's evidence against the policy in force: the
// owner's bundle over the node's configuration.
type Checker struct {
	// Trusts returns the roots the evidence of a pod of TEE tee may chain
	// to, in order (the node's own first); see NodeTrusts.
	Trusts func(tee string) ([]attest.Trust, error)
	// Manifest reads the image manifest a pod was launched from, for the
	// TEEs the bundle gives no reference values for (nil: manifest.Load).
	Manifest func(path string) (*manifest.Manifest, error)
	// MinTCB and AllowDebug are the node's attestation.min_tcb and
	// attestation.allow_debug.
	MinTCB     uint64
	AllowDebug bool

	mu sync.Mutex
	// verifiers are kept per root, so that a chip's chain verified once
	// is not verified again at every pass (attest.Verifier's cache).
	verifiers map[[sha256.Size]byte]*attest.Verifier
}

// verifier returns the cached verifier of t.
func (c *Checker) verifier(t attest.Trust) (*attest.Verifier, error) {
	h := sha256.New()
	h.Write([]byte(t.Mode))
	h.Write([]byte{0})
	h.Write(t.SimCertChain)
	h.Write([]byte{0})
	h.Write(t.SNPRoots)
	if t.FetchCertificates {
		h.Write([]byte{1})
	}
	// The collateral: NodeTrusts gives the same while its files are.
	fmt.Fprintf(h, "\x00%p\x00", t.TDXCollateral)
	for _, crl := range t.AMDCRLs {
		fmt.Fprintf(h, "%d\x00", len(crl))
		h.Write(crl)
	}
	var k [sha256.Size]byte
	h.Sum(k[:0])
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.verifiers[k]; ok {
		return v, nil
	}
	v, err := attest.NewVerifier(t)
	if err != nil {
		return nil, err
	}
	if c.verifiers == nil || len(c.verifiers) >= 16 {
		c.verifiers = map[[sha256.Size]byte]*attest.Verifier{}
	}
	c.verifiers[k] = v
	return v, nil
}

// Input is what one check judges.
type Input struct {
	// Evidence is what the pod's shim returned for Nonce.
	Evidence *adminapi.EvidenceResponse
	Nonce    []byte
	// Bundle is the owner's bundle in force; nil for none (the node's
	// configuration only).
	Bundle *Bundle
	// Pinned is the launch digest (SNP MEASUREMENT, TDX MRTD) this pod
	// VM's evidence verified with before, nil at its first check. Without
	// reference values in the bundle, a VM seen before must show it again,
	// rather than match the node's image manifest, which a node image
	// upgrade replaces under running pods.
	Pinned attest.Hex
	// PinnedBoot is the measured boot the VM verified with before (nil:
	// none was checked), used, like Pinned, instead of the manifest's.
	PinnedBoot *Boot
	Now        time.Time
}

// Check verifies the evidence against the reference values (the
// bundle's for the pod's TEE, else the launch digest pinned for the VM,
// else the pod's image manifest), then its verified fields against the
// minimum TCB and the bundle's revocations.
func (c *Checker) Check(in Input) Verdict {
	ev, nonce, b, now := in.Evidence, in.Nonce, in.Bundle, in.Now
	if b.expired(now) {
		return Verdict{Status: StatusFalse, Reason: ReasonBundleExpired,
			Message: fmt.Sprintf("the owner's trust bundle (serial %d) expired at %s: publish a newer one", b.Serial, b.Expires.Format(time.RFC3339))}
	}
	p, v := c.policy(ev, b, in.Pinned)
	if p == nil {
		return v
	}
	boot, v := c.boot(ev, in)
	if v.Status != "" {
		return v
	}
	rd := reportdata.Host(nonce)
	p.Nonce = rd[:]
	if boot != nil {
		p.TDXBoot, p.RTMRs = boot.TDXBoot, boot.RTMRs
	}
	id, err := c.verify(ev, p)
	if err != nil {
		return rejection(err)
	}
	id.Boot = boot
	fails := nodeFailures(id, b, c.MinTCB)
	node := len(fails) > 0
	fails = append(fails, podFailures(id, b)...)
	if len(fails) == 0 {
		return Verdict{Status: StatusTrue, Reason: ReasonVerified, Identity: id,
			Message: fmt.Sprintf("fresh %s evidence verified: %s", id.TEE, describe(id, b, in.Pinned))}
	}
	msgs := make([]string, len(fails))
	for i, f := range fails {
		msgs[i] = f.message
	}
	return Verdict{Status: StatusFalse, Reason: fails[0].reason, Node: node, Identity: id, Message: strings.Join(msgs, "; ")}
}

// describe says what the verdict was reached on.
func describe(id *Identity, b *Bundle, pinned attest.Hex) string {
	ref := "the node's image manifest"
	if len(pinned) > 0 {
		ref = "the launch digest this VM verified with before"
	}
	if b != nil {
		if _, ok := b.Reference[id.TEE]; ok {
			ref = fmt.Sprintf("the owner's bundle serial %d", b.Serial)
		} else {
			ref = fmt.Sprintf("the owner's bundle serial %d and %s", b.Serial, ref)
		}
	}
	s := "launch digest " + id.Measurement.String()
	if id.TEE != "tdx" {
		s += ", TCB " + tcbString(id.TCB)
	}
	if id.Boot != nil {
		s += ", measured boot (the event log's kernel, command line and initrd)"
	}
	return s + ", against " + ref
}

// policy returns what ev must show, or nil and the verdict when the node
// cannot say.
func (c *Checker) policy(ev *adminapi.EvidenceResponse, b *Bundle, pinned attest.Hex) (*attest.Policy, Verdict) {
	unknown := func(format string, args ...any) (*attest.Policy, Verdict) {
		return nil, Verdict{Status: StatusUnknown, Reason: ReasonVerifierError, Message: fmt.Sprintf(format, args...)}
	}
	p := &attest.Policy{AllowDebug: c.AllowDebug}
	ref, fromBundle := Reference{}, false
	if b != nil {
		ref, fromBundle = b.Reference[ev.Tee]
	}
	switch ev.Tee {
	case "sim", "snp":
		if ev.Kind != "snp" {
			return nil, Verdict{Status: StatusFalse, Reason: ReasonEvidenceRejected, Message: fmt.Sprintf("a %s pod gave %q evidence", ev.Tee, ev.Kind)}
		}
		switch {
		case fromBundle:
		case len(pinned) > 0:
			ref.Measurements = map[int]attest.Hex{int(ev.Vcpus): pinned}
		default:
			m, err := c.manifest(ev.Manifest)
			if err != nil {
				return unknown("the pod's image manifest: %v", err)
			}
			if ref.Measurements, err = attest.ExpectedMeasurements(m, ev.Tee); err != nil {
				return unknown("%v", err)
			}
		}
		p.Measurements, p.VCPUs = ref.Measurements, int(ev.Vcpus)
		if _, ok := p.Measurements[p.VCPUs]; !ok {
			return nil, Verdict{Status: StatusFalse, Reason: ReasonMeasurementMismatch,
				Message: fmt.Sprintf("the reference values have no launch digest for the pod's vCPUs=%d shape (they have vCPUs %s)", p.VCPUs, attest.Shapes(p.Measurements))}
		}
		p.HostData = ev.HostData
	case "tdx":
		if ev.Kind != "tdx" {
			return nil, Verdict{Status: StatusFalse, Reason: ReasonEvidenceRejected, Message: fmt.Sprintf("a tdx pod gave %q evidence", ev.Kind)}
		}
		switch {
		case fromBundle:
		case len(pinned) > 0:
			ref.MRTD = pinned
		default:
			m, err := c.manifest(ev.Manifest)
			if err != nil {
				return unknown("the pod's image manifest: %v", err)
			}
			d, err := m.TDX()
			if err != nil {
				return unknown("%v", err)
			}
			if ref.MRTD, err = attest.ParseHex(d.MRTD); err != nil {
				return unknown("manifest MRTD: %v", err)
			}
		}
		p.MRTD, p.MRConfigID = ref.MRTD, ev.Mrconfigid
	default:
		return unknown("the pod's TEE %q cannot be re-attested", ev.Tee)
	}
	return p, Verdict{}
}

// boot returns the measured boot ev must show, as the shim checked it at
// the pod's start: the one the VM verified with before, else the pod's
// image manifest's (attest.BootPolicy; the bundle's reference values are
// launch digests only). Nil checks none; a verdict with a status when the
// node cannot say.
func (c *Checker) boot(ev *adminapi.EvidenceResponse, in Input) (*Boot, Verdict) {
	if ev.Tee == "snp" {
		return nil, Verdict{}
	}
	if len(in.Pinned) > 0 {
		return in.PinnedBoot, Verdict{}
	}
	m, err := c.manifest(ev.Manifest)
	if err != nil {
		return nil, Verdict{Status: StatusUnknown, Reason: ReasonVerifierError, Message: fmt.Sprintf("the pod's image manifest: %v", err)}
	}
	p, err := attest.BootPolicy(m, ev.Tee)
	if err != nil {
		return nil, Verdict{Status: StatusUnknown, Reason: ReasonVerifierError, Message: fmt.Sprintf("the measured boot of the pod's image manifest: %v", err)}
	}
	if p.TDXBoot == nil && len(p.RTMRs) == 0 {
		return nil, Verdict{}
	}
	return &Boot{TDXBoot: p.TDXBoot, RTMRs: p.RTMRs}, Verdict{}
}

func (c *Checker) manifest(path string) (*manifest.Manifest, error) {
	if c.Manifest != nil {
		return c.Manifest(path)
	}
	return manifest.Load(path)
}

// verify checks the evidence with each of the node's roots in turn, as
// the shim does at start: anything but "not this root" is the answer.
func (c *Checker) verify(ev *adminapi.EvidenceResponse, p *attest.Policy) (*Identity, error) {
	trusts, err := c.Trusts(ev.Tee)
	if err != nil {
		return nil, &attest.Error{Kind: attest.KindConfig, Field: "trust", Err: err}
	}
	var errs []error
	for _, t := range trusts {
		v, err := c.verifier(t)
		if err != nil {
			return nil, err
		}
		id, err := verifyWith(v, ev, p)
		if err == nil {
			return id, nil
		}
		var ae *attest.Error
		if len(trusts) == 1 || !errors.As(err, &ae) || (ae.Kind != attest.KindSignature && ae.Kind != attest.KindRoot) {
			return nil, err
		}
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		return nil, &attest.Error{Kind: attest.KindConfig, Field: "trust", Err: fmt.Errorf("no trusted roots for TEE %s", ev.Tee)}
	}
	return nil, fmt.Errorf("the evidence verifies against none of the node's %d trusted roots: %w", len(trusts), errors.Join(errs...))
}

func verifyWith(v *attest.Verifier, ev *adminapi.EvidenceResponse, p *attest.Policy) (*Identity, error) {
	if ev.Kind == "tdx" {
		// The CC event log is replayed to the quote's RTMRs and its
		// kernel, command line and initrd checked (p.TDXBoot).
		cl, err := v.VerifyTDXEvidence(ev.Report, ev.EventLog, p)
		if err != nil {
			return nil, err
		}
		return &Identity{TEE: ev.Tee, Measurement: cl.MRTD, InitData: cl.MRConfigID}, nil
	}
	var cl *attest.SNPClaims
	var err error
	if v.Mode() == attest.ModeSim {
		// The sim TEE's RTMR statement and boot log, as on TDX.
		cl, err = v.VerifySimEvidence(ev.Report, ev.CertTable, ev.SimRtmrs, ev.EventLog, p)
	} else {
		cl, err = v.VerifySNP(ev.Report, ev.CertTable, p)
	}
	if err != nil {
		return nil, err
	}
	return &Identity{TEE: ev.Tee, ChipID: cl.ChipID, TCB: TCB(cl.ReportedTCB), LaunchTCB: TCB(cl.LaunchTCB), Measurement: cl.Measurement, InitData: cl.HostData}, nil
}

// rejection is the verdict of evidence that did not verify.
func rejection(err error) Verdict {
	v := Verdict{Status: StatusFalse, Reason: ReasonEvidenceRejected, Message: err.Error()}
	var ae *attest.Error
	if errors.As(err, &ae) {
		switch {
		case ae.Kind == attest.KindConfig:
			v.Status, v.Reason = StatusUnknown, ReasonVerifierError
		case ae.Kind == attest.KindMismatch && (ae.Field == "measurement" || ae.Field == "MRTD"):
			v.Reason = ReasonMeasurementMismatch
		case strings.HasPrefix(ae.Field, "RTMR") || ae.Field == "CC event log" || ae.Field == "sim RTMRs":
			v.Reason = ReasonMeasuredBootMismatch
		// The platform, judged by the vendor's collateral
		// (attestation.collateral_dir): the node's failure.
		case ae.Kind == attest.KindRevoked && strings.Contains(ae.Field, "TCB status"):
			v.Reason, v.Node = ReasonTCBRevoked, true
		case ae.Kind == attest.KindRevoked:
			v.Reason, v.Node = ReasonChipRevoked, true
		case ae.Kind == attest.KindPolicy && strings.Contains(ae.Field, "TCB status"):
			v.Reason, v.Node = ReasonTCBBelowMinimum, true
		}
	}
	return v
}

type failure struct{ reason, message string }

// nodeFailures are the failures of the node's chip and firmware that id
// shows under b and the node's minimum TCB.
func nodeFailures(id *Identity, b *Bundle, nodeMin uint64) []failure {
	if id == nil || id.TEE == "tdx" {
		return nil
	}
	var out []failure
	if b != nil && slices.ContainsFunc(b.Revoked.ChipIDs, func(c attest.Hex) bool { return string(c) == string(id.ChipID) }) {
		out = append(out, failure{ReasonChipRevoked, fmt.Sprintf("CHIP_ID %s is revoked by the owner's bundle serial %d", short(id.ChipID), b.Serial)})
	}
	if b != nil && slices.Contains(b.Revoked.TCBs, id.TCB) {
		out = append(out, failure{ReasonTCBRevoked, fmt.Sprintf("REPORTED_TCB %s is revoked by the owner's bundle serial %d", tcbString(id.TCB), b.Serial)})
	}
	min, from := TCB(nodeMin), "the node's attestation.min_tcb"
	if b != nil && b.MinTCB != 0 {
		min, from = maxTCB(min, b.MinTCB), fmt.Sprintf("the owner's bundle serial %d", b.Serial)
	}
	if min != 0 && !tcbAtLeast(id.TCB, min) {
		out = append(out, failure{ReasonTCBBelowMinimum, fmt.Sprintf("REPORTED_TCB %s is below the minimum %s of %s: the node's SEV firmware or microcode needs an update", tcbString(id.TCB), tcbString(min), from)})
	} else if min != 0 && !tcbAtLeast(id.LaunchTCB, min) {
		out = append(out, failure{ReasonTCBBelowMinimum, fmt.Sprintf("LAUNCH_TCB %s is below the minimum %s of %s: the pod was launched under SEV firmware or microcode below it; relaunch it", tcbString(id.LaunchTCB), tcbString(min), from)})
	}
	return out
}

// podFailures are the revocations of the pod's own init data and image.
func podFailures(id *Identity, b *Bundle) []failure {
	if b == nil {
		return nil
	}
	var out []failure
	if len(id.InitData) > 0 && slices.ContainsFunc(b.Revoked.InitData, func(d attest.Hex) bool { return string(d) == string(id.InitData) }) {
		out = append(out, failure{ReasonInitDataRevoked, fmt.Sprintf("init data digest %s is revoked by the owner's bundle serial %d", id.InitData, b.Serial)})
	}
	if slices.ContainsFunc(b.Revoked.Measurements, func(m attest.Hex) bool { return string(m) == string(id.Measurement) }) {
		out = append(out, failure{ReasonMeasurementRevoked, fmt.Sprintf("launch digest %s is revoked by the owner's bundle serial %d", id.Measurement, b.Serial)})
	}
	return out
}

// A TCB_VERSION is eight one-byte components, each a security patch
// level or reserved (zero), at places that differ by product line (Turin
// adds FMC and moves TEE and SNP): compared byte by byte, two values of
// one line are compared component by component whatever the line.

// maxTCB is the component-wise maximum of two TCB versions.
func maxTCB(a, b TCB) TCB {
	var m TCB
	for shift := 0; shift < 64; shift += 8 {
		m |= max(a>>shift&0xff, b>>shift&0xff) << shift
	}
	return m
}

// tcbAtLeast reports whether every component of got is at least min's.
func tcbAtLeast(got, min TCB) bool {
	for shift := 0; shift < 64; shift += 8 {
		if got>>shift&0xff < min>>shift&0xff {
			return false
		}
	}
	return true
}

// short abbreviates a long digest for messages.
func short(h attest.Hex) string {
	s := h.String()
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}
