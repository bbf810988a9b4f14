package broker

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
)

// verify checks an Attestation against the session and the policy, and
// returns the ephemeral key it binds and what the evidence showed. It
// reads what Trustee's KBS reads: the composite tee-evidence of protocol
// 0.4.0, whose primary evidence binds {additional-evidence, nonce,
// tee-pubkey}, in the encoding of Trustee's verifier for the session's
// TEE.
func (b *Broker) verify(r *http.Request, s *session) (*jose.JSONWebKey, *Attested, error) {
	var att kbsapi.Attestation
	if err := readJSON(r, &att); err != nil {
		return nil, nil, fmt.Errorf("the Attestation is not the protocol's JSON: %w", err)
	}
	rt := att.RuntimeData
	if rt.Nonce != s.nonce {
		return nil, nil, errors.New("runtime-data nonce is not this session's challenge (a replayed attestation?)")
	}
	var key jose.JSONWebKey
	if err := key.UnmarshalJSON(rt.TeePubKey); err != nil {
		return nil, nil, fmt.Errorf("runtime-data tee-pubkey: %w", err)
	}
	if !key.Valid() || !key.IsPublic() {
		return nil, nil, errors.New("runtime-data tee-pubkey is not a valid public key")
	}
	if len(att.TeeEvidence.PrimaryEvidence) == 0 {
		return nil, nil, errors.New("tee-evidence has no primary_evidence")
	}
	bound, err := kbsapi.PrimaryRuntimeData(rt, att.TeeEvidence.AdditionalEvidence)
	if err != nil {
		return nil, nil, err
	}
	rd, err := kbsapi.ReportData(bound, s.hashAlg)
	if err != nil {
		return nil, nil, err
	}
	a, err := b.verifyPrimary(s.tee, att.TeeEvidence.PrimaryEvidence, rd[:], att.InitData)
	if err != nil {
		return nil, nil, err
	}
	// The device evidence, which the primary evidence binds (gpu.go).
	if a.GPUs, err = b.verifyAdditional(&att, s.hashAlg); err != nil {
		return nil, nil, err
	}
	return &key, a, nil
}

// verifyPrimary checks primary evidence of TEE tee (the KBS protocol's
// name, in the encoding of Trustee's verifier for it) whose REPORT_DATA
// must be reportData, sent with the init data document initData (nil:
// none), against the broker's verifier, reference values, attestation
// policy and init data pins, and returns what it showed. The key broker's
// sessions and the mesh CA (meshca.go) share it, each with the binding of
// its own domain.
func (b *Broker) verifyPrimary(tee string, primary json.RawMessage, reportData []byte, initData *kbsapi.InitData) (*Attested, error) {
	p := b.Policy
	p.Nonce = reportData
	body, doc, err := b.checkInitData(initData)
	if err != nil {
		return nil, err
	}
	if b.Verifier == nil {
		return nil, errors.New("the broker has no verifier")
	}
	a := &Attested{InitData: doc}
	// A document accepted through a workload's allow_host_rootfs is that
	// workload's to use: no other workload's rule (one pinning only a
	// measurement, say) gives it a resource or an identity.
	a.HostRootfs = doc != nil && !b.AllowUnconfinedHost && !b.AllowHostRootfsPods && len(doc.HostRootfsRules()) > 0
	switch tee {
	case kbsapi.TeeSNP:
		a.TEE = kbsapi.TeeSNP
		if b.Verifier.Mode() == attest.ModeSim {
			a.TEE = string(attest.ModeSim)
		}
		var sum []byte
		if body != nil {
			d := initdata.Digest(body)
			sum = d[:]
		}
		want, err := b.expectInitData("HOST_DATA", "host_data", sum, b.pins(tee))
		if err != nil {
			return nil, err
		}
		p.HostData = want
		report, certs, err := decodeSNP(primary)
		if err != nil {
			return nil, err
		}
		var claims *attest.SNPClaims
		a.Reference, err = b.eachReference(a.TEE, p, func(p *attest.Policy) (err error) {
			claims, err = b.Verifier.VerifySNP(report, certs, p)
			return err
		})
		if err != nil {
			return nil, err
		}
		a.setSNP(claims)
	case kbsapi.TeeTDX:
		a.TEE = kbsapi.TeeTDX
		var sum []byte
		if body != nil {
			d := initdata.DigestTDX(body)
			sum = d[:]
		}
		want, err := b.expectInitData("MRCONFIGID", "mrconfigid", sum, b.pins(tee))
		if err != nil {
			return nil, err
		}
		p.MRConfigID = want
		quote, eventLog, err := decodeTDX(primary)
		if err != nil {
			return nil, err
		}
		var claims *attest.TDXClaims
		a.Reference, err = b.eachReference(a.TEE, p, func(p *attest.Policy) (err error) {
			claims, err = b.Verifier.VerifyTDXEvidence(quote, eventLog, p)
			return err
		})
		if err != nil {
			return nil, err
		}
		a.setTDX(claims)
	default:
		return nil, fmt.Errorf("TEE %q is not supported", tee)
	}
	return a, nil
}

// setSNP copies what a workload judges from verified SNP claims.
func (a *Attested) setSNP(c *attest.SNPClaims) {
	a.Measurement, a.InitDataDigest, a.TCB = c.Measurement, c.HostData, c.ReportedTCB
	a.LaunchTCB, a.TCBLine = c.LaunchTCB, c.ProductLine
	a.Debug = c.GuestPolicy&snpPolicyDebug != 0
	a.GuestPolicy, a.PlatformInfo = c.GuestPolicy, c.PlatformInfo
}

// setTDX copies what a workload judges from verified TDX claims.
func (a *Attested) setTDX(c *attest.TDXClaims) {
	a.MRTD, a.RTMRs, a.InitDataDigest, a.TeeTCBSVN = c.MRTD, c.RTMRs, c.MRConfigID, c.TeeTCBSVN
	a.Debug = len(c.TDAttributes) > 0 && c.TDAttributes[0]&tdAttributesDebug != 0
	a.TDAttributes, a.XFAM = c.TDAttributes, c.XFAM
}

// snpPolicyDebug is SNP guest policy bit 19 (debugging allowed);
// tdAttributesDebug TD_ATTRIBUTES bit 0. The verifier refuses both unless
// its policy allows debug; the resource policy checks them again per
// workload.
const (
	snpPolicyDebug    = 1 << 19
	tdAttributesDebug = 0x01
)

// eachReference runs verify with the policy base under each of the
// owner's reference value sets for tee (References), and returns the
// source of the first that passes. Without References, base is used as
// it is (its own Measurements, MRTD and RTMRs). A failure other than a
// launch measurement mismatch is returned at once: another reference set
// would not change it.
func (b *Broker) eachReference(tee string, base attest.Policy, verify func(*attest.Policy) error) (string, error) {
	if len(b.References) == 0 {
		return "policy", verify(&base)
	}
	var tried []Reference
	for _, ref := range b.References {
		if ref.TEE == tee {
			tried = append(tried, ref)
		}
	}
	if len(tried) == 0 {
		return "", fmt.Errorf("the owner's reference values have none for TEE %s: give the broker its image manifest (--reference-values FILE)", tee)
	}
	var errs []string
	for _, ref := range tried {
		p := base
		p.Measurements, p.MRTD, p.RTMRs = ref.Measurements, ref.MRTD, ref.RTMRs
		err := verify(&p)
		if err == nil {
			return ref.Source, nil
		}
		if len(tried) == 1 || !launchMismatch(err) {
			return "", err
		}
		errs = append(errs, ref.Source+": "+err.Error())
	}
	return "", fmt.Errorf("the launch measurement is none of the owner's reference values: %s", strings.Join(errs, "; "))
}

// launchMismatch reports whether err is a launch measurement (SNP) or
// MRTD / RTMR (TDX) mismatch.
func launchMismatch(err error) bool {
	var e *attest.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Field == "measurement" || e.Field == "MRTD" || strings.HasPrefix(e.Field, "RTMR")
}

// pins returns the init data digests the owner pinned for a TEE: those of
// the InitData documents, of the ResourcePolicy's workloads, and the
// Policy's HostData or MRConfigID.
func (b *Broker) pins(tee string) []attest.Hex {
	var out []attest.Hex
	for _, doc := range b.InitData {
		if tee == kbsapi.TeeTDX {
			d := initdata.DigestTDX(doc)
			out = append(out, d[:])
		} else {
			d := initdata.Digest(doc)
			out = append(out, d[:])
		}
	}
	if b.ResourcePolicy != nil {
		size := hostDataSize
		if tee == kbsapi.TeeTDX {
			size = digestSize
		}
		for _, d := range b.ResourcePolicy.InitDataDigests() {
			if len(d) == size {
				out = append(out, d)
			}
		}
	}
	if pin := b.Policy.HostData; tee == kbsapi.TeeSNP && len(pin) > 0 {
		out = append(out, pin)
	}
	if pin := b.Policy.MRConfigID; tee == kbsapi.TeeTDX && len(pin) > 0 {
		out = append(out, pin)
	}
	return out
}

// expectInitData returns the init data digest the evidence must show
// (field, HOST_DATA or MRCONFIGID): sum, the digest of the document sent,
// when the owner pinned it (or AnyInitData). Without a document (only
// under AllowUnconfinedHost) it is the one pin; with several the broker
// could not say which the evidence must show, and refuses.
func (b *Broker) expectInitData(field, policyKey string, sum []byte, pins []attest.Hex) (attest.Hex, error) {
	switch {
	case sum != nil && slices.ContainsFunc(pins, func(p attest.Hex) bool { return string(p) == string(sum) }):
		return sum, nil
	case sum != nil && len(pins) > 0:
		return nil, fmt.Errorf("the init-data sent (%s %x) is not a document the broker pins: add the pod's init data to the broker (c8s-launcher kbs --init-data FILE, init_data in --resource-policy, or its %s in --policy)", field, sum, policyKey)
	case sum != nil && b.AnyInitData:
		return sum, nil
	case sum != nil:
		return nil, fmt.Errorf("the broker pins no init data, so it would trust whatever document the host launched the pod with: give it the pods' init data (c8s-launcher kbs --init-data FILE, init_data in --resource-policy, or %s in --policy)", policyKey)
	case len(pins) == 1:
		return pins[0], nil
	case len(pins) == 0:
		return nil, fmt.Errorf("the broker pins no %s and the attestation carries no init-data to bind it", field)
	}
	return nil, fmt.Errorf("the attestation carries no init-data and the broker pins %d documents: send the document, whose digest says which %s the evidence must show", len(pins), field)
}

// checkInitData reads the init data sent with the evidence (nil if none)
// and refuses one under which the host could run code of its choosing in
// the pod and read the secrets back (InitData.HostCanRunCode: no enforced
// [policy], or a rule that leaves what runs to the host, such as one
// without pinned layers), unless AllowUnconfinedHost; rules without layers
// pass where the owner accepts them (AllowHostRootfsPods, a workload's
// allow_host_rootfs for its documents). Without a document it refuses
// unless AllowUnconfinedHost (the broker could not see the pod's
// [policy]). It returns the document as sent and parsed. A session
// without a document is never released a resource (NamedSecret).
func (b *Broker) checkInitData(d *kbsapi.InitData) ([]byte, *initdata.InitData, error) {
	if d == nil {
		if b.AllowUnconfinedHost {
			return nil, nil, nil
		}
		return nil, nil, errors.New("the attestation carries no init-data: the broker releases secrets only to a pod whose measured init data has an enforced [policy] section and names them in [[kbs.secrets]], and must read it to know")
	}
	if d.Format != "toml" {
		return nil, nil, fmt.Errorf("init-data format %q: this broker, like Trustee's built-in attestation service, reads toml", d.Format)
	}
	body := []byte(d.Body)
	doc, err := initdata.Parse(body)
	if err != nil {
		return nil, nil, err
	}
	if b.AllowUnconfinedHost {
		return body, doc, nil
	}
	accept := b.AllowHostRootfsPods || b.ResourcePolicy.AllowsHostRootfs(body)
	if unconfined, reason := doc.HostCanRunCodeWith(initdata.HostCodeOptions{AcceptHostRootfs: accept}); unconfined {
		return nil, nil, fmt.Errorf("secrets go only to a pod whose measured init data has an enforced [policy] under which the host cannot run code of its choosing: %s; %s", reason, HostCodeFix(doc, accept))
	}
	return body, doc, nil
}

// HostCodeFix says how the owner makes doc one the broker releases to,
// after HostCanRunCodeWith's reason; hostRootfsAccepted is the owner's
// opt-out it was judged with.
func HostCodeFix(doc *initdata.InitData, hostRootfsAccepted bool) string {
	switch {
	case !doc.PolicyGoverns():
		return "add a [policy] section (c8s-measure policy can generate one)"
	case doc.Policy.Audit:
		return "set policy.audit = false once the policy is complete (c8s-measure policy can generate one)"
	case !hostRootfsAccepted && len(doc.HostRootfsRules()) > 0:
		return "or, if the owner trusts the node with these images' files, set allow_host_rootfs = true on the pod's workload in the resource policy (the broker's --allow-host-rootfs-pods for every pod)"
	}
	return "pin exactly what the rules named leave to the host, or drop it"
}
