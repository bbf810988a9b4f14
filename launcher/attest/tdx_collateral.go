package attest

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-tdx-guest/pcs"

	"github.com/c8s-dev/c8s/launcher/attest/verdict"
)

// The files of a TDX collateral directory, as `c8s-launcher collateral
// fetch` writes them from Intel's Provisioning Certification Service
// (PCS v4): the bodies as PCS returns them, the issuer chains from the
// response headers (PEM, URL-decoded).
const (
	// TDXTCBInfoFilePrefix + lower-case FMSPC + ".json": the body of
	// GET /tdx/certification/v4/tcb?fmspc=… ({"tcbInfo":…,"signature":…}).
	TDXTCBInfoFilePrefix = "tdx_tcb_info_"
	// TDXTCBInfoChainFile: its TCB-Info-Issuer-Chain header.
	TDXTCBInfoChainFile = "tdx_tcb_info_issuer_chain.pem"
	// TDXQEIdentityFile: GET /tdx/certification/v4/qe/identity.
	TDXQEIdentityFile = "tdx_qe_identity.json"
	// TDXQEIdentityChainFile: its SGX-Enclave-Identity-Issuer-Chain header.
	TDXQEIdentityChainFile = "tdx_qe_identity_issuer_chain.pem"
	// PCKCRLFilePrefix + "platform" or "processor" + ".der": GET
	// /sgx/certification/v4/pckcrl?ca=…&encoding=der.
	PCKCRLFilePrefix = "pck_crl_"
	// PCKCRLChainFile: its SGX-PCK-CRL-Issuer-Chain header.
	PCKCRLChainFile = "pck_crl_issuer_chain.pem"
	// IntelRootCRLFile: the Intel SGX Root CA's CRL
	// (certificates.trustedservices.intel.com/IntelSGXRootCA.der).
	IntelRootCRLFile = "intel_sgx_root_ca_crl.der"
)

// TCB statuses of Intel's TCB info and QE identity.
const (
	TCBUpToDate = "UpToDate"
	TCBRevoked  = "Revoked"
)

// TDXCollateral is Intel's collateral for verifying TDX quotes with no
// network: TCB info per FMSPC and the QE identity, each with its signing
// chain, and the PCK and root CA revocation lists. Every signature is
// checked against Intel's SGX root when a quote is verified, not when the
// files are loaded, so a directory can be loaded before its files are
// valid.
type TDXCollateral struct {
	tcbInfo      map[string][]byte // lower-case FMSPC -> response body
	tcbChain     []*x509.Certificate
	qeIdentity   []byte
	qeChain      []*x509.Certificate
	pckCRLs      map[string]*x509.RevocationList // "platform", "processor"
	pckCRLChain  []*x509.Certificate
	rootCRL      *x509.RevocationList
	loadedFrom   string
	tcbInfoFMSPC []string
}

// LoadTDXCollateral reads a collateral directory (see the file constants).
// TCB info, its chain, the QE identity, its chain and the root CA CRL are
// required; the PCK CRL of the CA that issued a quote's PCK certificate is
// required when that quote is verified.
func LoadTDXCollateral(dir string) (*TDXCollateral, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, collateralErr(dir, err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") && !strings.HasSuffix(e.Name(), ".der") && !strings.HasSuffix(e.Name(), ".pem") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, collateralErr(dir, err)
		}
		files[e.Name()] = b
	}
	return NewTDXCollateral(dir, files)
}

// NewTDXCollateral reads collateral from files, by the names of a
// collateral directory; from names where it came from, for messages.
func NewTDXCollateral(from string, files map[string][]byte) (*TDXCollateral, error) {
	c := &TDXCollateral{tcbInfo: map[string][]byte{}, pckCRLs: map[string]*x509.RevocationList{}, loadedFrom: from}
	var err error
	for name, b := range files {
		if fmspc, ok := strings.CutPrefix(name, TDXTCBInfoFilePrefix); ok && strings.HasSuffix(fmspc, ".json") {
			fmspc = strings.ToLower(strings.TrimSuffix(fmspc, ".json"))
			c.tcbInfo[fmspc] = b
			c.tcbInfoFMSPC = append(c.tcbInfoFMSPC, fmspc)
		}
		if ca, ok := strings.CutPrefix(name, PCKCRLFilePrefix); ok && strings.HasSuffix(ca, ".der") {
			crl, err := parseCRL(b, name)
			if err != nil {
				return nil, collateralErr(from, err)
			}
			c.pckCRLs[strings.TrimSuffix(ca, ".der")] = crl
		}
	}
	need := func(name string) ([]byte, error) {
		b, ok := files[name]
		if !ok {
			return nil, collateralErr(from, fmt.Errorf("%s is missing", name))
		}
		return b, nil
	}
	if len(c.tcbInfo) == 0 {
		return nil, collateralErr(from, fmt.Errorf("no TDX TCB info (%s<fmspc>.json)", TDXTCBInfoFilePrefix))
	}
	chain := func(name string) ([]*x509.Certificate, error) {
		b, err := need(name)
		if err != nil {
			return nil, err
		}
		ch, err := parseChain(b, name)
		if err != nil {
			return nil, collateralErr(from, err)
		}
		return ch, nil
	}
	if c.tcbChain, err = chain(TDXTCBInfoChainFile); err != nil {
		return nil, err
	}
	if c.qeIdentity, err = need(TDXQEIdentityFile); err != nil {
		return nil, err
	}
	if c.qeChain, err = chain(TDXQEIdentityChainFile); err != nil {
		return nil, err
	}
	rootCRL, err := need(IntelRootCRLFile)
	if err != nil {
		return nil, err
	}
	if c.rootCRL, err = parseCRL(rootCRL, IntelRootCRLFile); err != nil {
		return nil, collateralErr(from, err)
	}
	if len(c.pckCRLs) > 0 {
		if c.pckCRLChain, err = chain(PCKCRLChainFile); err != nil {
			return nil, err
		}
	}
	slices.Sort(c.tcbInfoFMSPC)
	return c, nil
}

func collateralErr(dir string, err error) *Error {
	return failure(KindConfig, "TDX collateral", fmt.Errorf("%s: %w", dir, err), "fetch it where a network exists: c8s-launcher collateral fetch --quote QUOTE --out DIR")
}

func parseChain(b []byte, what string) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, c)
	}
	if len(out) != 2 {
		return nil, fmt.Errorf("%s: %d certificates, want the signing certificate and Intel's root", what, len(out))
	}
	return out, nil
}

func parseCRL(b []byte, what string) (*x509.RevocationList, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		b = blk.Bytes
	}
	crl, err := x509.ParseRevocationList(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return crl, nil
}

// tdxPlatform is what the collateral is checked against: the quote's PCK
// chain and the fields of its TD quote body and QE report that TCB info
// and QE identity judge.
type tdxPlatform struct {
	PCK, PCKCA     *x509.Certificate
	TeeTCBSVN      []byte
	MRSignerSeam   []byte
	SeamAttributes []byte
	QE             qeReport
}

type qeReport struct {
	MiscSelect uint32
	Attributes []byte
	MRSigner   []byte
	ISVProdID  uint32
	ISVSVN     uint32
}

// TDXTCB is the verdict of the collateral on a platform (verdict.TDXTCB).
type TDXTCB = verdict.TDXTCB

// check verifies the collateral's chains, signatures, CRLs and freshness
// at now and judges the platform: PCK revocation, TCB status, QE
// identity. allowed names the statuses besides UpToDate the policy
// accepts; Revoked is never accepted.
func (c *TDXCollateral) check(root *x509.Certificate, pl tdxPlatform, now time.Time, allowed []string) (*TDXTCB, error) {
	if err := c.checkRevocation(root, pl, now); err != nil {
		return nil, err
	}
	ext, err := pcs.PckCertificateExtensions(pl.PCK)
	if err != nil {
		return nil, failure(KindFormat, "PCK certificate", err, "its SGX extensions (FMSPC, TCB) cannot be read")
	}
	fmspc := strings.ToLower(ext.FMSPC)
	info, err := c.tcbInfoFor(root, fmspc, now)
	if err != nil {
		return nil, err
	}
	if !strings.EqualFold(info.PceID, ext.PCEID) {
		return nil, mismatch("TDX TCB info PCEID", info.PceID, ext.PCEID, "the TCB info is not for this platform")
	}
	if !bytes.Equal(info.TdxModule.Mrsigner.Bytes, pl.MRSignerSeam) {
		return nil, mismatch("MRSIGNERSEAM", hex.EncodeToString(info.TdxModule.Mrsigner.Bytes), hex.EncodeToString(pl.MRSignerSeam), "the TDX module is not signed by Intel's TDX module key")
	}
	if !maskedEqual(pl.SeamAttributes, info.TdxModule.AttributesMask.Bytes, info.TdxModule.Attributes.Bytes) {
		return nil, mismatch("SEAMATTRIBUTES", hex.EncodeToString(info.TdxModule.Attributes.Bytes), hex.EncodeToString(pl.SeamAttributes), "the TDX module runs with attributes Intel's TCB info does not accept (a debug module?)")
	}
	res, err := platformStatus(info, ext.TCB.CPUSvnComponents, ext.TCB.PCESvn, pl.TeeTCBSVN)
	if err != nil {
		return nil, err
	}
	if res.QEStatus, err = c.checkQE(root, pl.QE, now); err != nil {
		return nil, err
	}
	for _, s := range []struct{ field, status string }{
		{"TDX TCB status", res.Status}, {"TDX module TCB status", res.ModuleStatus}, {"TDX QE TCB status", res.QEStatus},
	} {
		if err := judgeStatus(s.field, s.status, allowed, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// platformStatus evaluates the platform's TCB against TCB info: the TCB
// level and, with a TDX module major version in TEE_TCB_SVN, the module.
func platformStatus(info *pcs.TcbInfo, cpusvn []byte, pcesvn uint16, tee []byte) (*TDXTCB, error) {
	res := &TDXTCB{FMSPC: strings.ToLower(info.Fmspc), EvaluationDataNumber: info.TcbEvaluationDataNumber}
	level, ok := matchTCBLevel(info.TcbLevels, cpusvn, pcesvn, tee)
	if !ok {
		return nil, &Error{Kind: KindPolicy, Field: "TDX TCB status", Expected: TCBUpToDate, Actual: "no matching TCB level",
			Hint: fmt.Sprintf("the platform's TCB (CPUSVN %x, PCESVN %d, TEE_TCB_SVN %x) is below every level of Intel's TCB info for FMSPC %s (evaluation data number %d): it is older than any level Intel still rates; update the host's firmware and microcode",
				cpusvn, pcesvn, tee, res.FMSPC, info.TcbEvaluationDataNumber)}
	}
	res.Status, res.TCBDate, res.Advisories = string(level.TcbStatus), level.TcbDate, level.AdvisoryIDs
	if len(tee) > 1 && tee[1] > 0 {
		mod, err := matchModule(info.TdxModuleIdentities, tee)
		if err != nil {
			return nil, err
		}
		res.ModuleStatus = string(mod.TcbStatus)
		res.Advisories = append(res.Advisories, mod.AdvisoryIDs...)
	}
	return res, nil
}

// judgeStatus accepts UpToDate and the allowed statuses; Revoked never.
func judgeStatus(field, status string, allowed []string, res *TDXTCB) error {
	if status == "" || status == TCBUpToDate {
		return nil
	}
	if status == TCBRevoked {
		return &Error{Kind: KindRevoked, Field: field, Expected: TCBUpToDate, Actual: TCBRevoked,
			Hint: fmt.Sprintf("Intel revoked this TCB level (FMSPC %s, TCB date %s, advisories %s); no policy accepts it", res.FMSPC, res.TCBDate, strings.Join(res.Advisories, ", "))}
	}
	if slices.Contains(allowed, status) {
		return nil
	}
	return &Error{Kind: KindPolicy, Field: field, Expected: TCBUpToDate + allowedText(allowed), Actual: status,
		Hint: fmt.Sprintf("Intel's TCB info (evaluation data number %d) rates this platform %s (TCB date %s, advisories %s): update the host's firmware, microcode or TDX module, or accept the status by name in the policy's allow_tcb_status",
			res.EvaluationDataNumber, status, res.TCBDate, strings.Join(res.Advisories, ", "))}
}

func allowedText(allowed []string) string {
	if len(allowed) == 0 {
		return ""
	}
	return " or " + strings.Join(allowed, ", ")
}

// checkRevocation checks the root CRL (signed by Intel's root) and the
// PCK CRL (signed by the CA that issued the PCK certificate) and that
// neither the PCK CA nor the PCK certificate is revoked.
func (c *TDXCollateral) checkRevocation(root *x509.Certificate, pl tdxPlatform, now time.Time) error {
	if err := checkCRL("Intel SGX root CA CRL", c.rootCRL, root, now); err != nil {
		return err
	}
	if revoked(c.rootCRL, pl.PCKCA) {
		return &Error{Kind: KindRevoked, Field: "PCK CA certificate", Actual: "revoked", Err: fmt.Errorf("%s (serial %x) is on Intel's root CA CRL", pl.PCKCA.Subject.CommonName, pl.PCKCA.SerialNumber),
			Hint: "Intel revoked the CA that certified this platform"}
	}
	ca := "platform"
	if strings.Contains(pl.PCKCA.Subject.CommonName, "Processor") {
		ca = "processor"
	}
	crl := c.pckCRLs[ca]
	if crl == nil {
		return collateralErr(c.loadedFrom, fmt.Errorf("no PCK CRL of the %s CA (%s%s.der), which issued this quote's PCK certificate", ca, PCKCRLFilePrefix, ca))
	}
	if len(c.pckCRLChain) == 2 && !c.pckCRLChain[1].Equal(root) {
		return failure(KindSignature, "PCK CRL issuer chain", errors.New("its root is not Intel's SGX root"), "")
	}
	if err := checkCRL("PCK "+ca+" CA CRL", crl, pl.PCKCA, now); err != nil {
		return err
	}
	if revoked(crl, pl.PCK) {
		return &Error{Kind: KindRevoked, Field: "PCK certificate", Actual: "revoked", Err: fmt.Errorf("serial %x is on the %s CA's CRL", pl.PCK.SerialNumber, ca),
			Hint: "Intel revoked this platform's PCK certificate (a compromised or decommissioned platform)"}
	}
	return nil
}

func checkCRL(what string, crl *x509.RevocationList, issuer *x509.Certificate, now time.Time) error {
	if err := crl.CheckSignatureFrom(issuer); err != nil {
		return failure(KindSignature, what, err, "the CRL is not signed by "+issuer.Subject.CommonName)
	}
	if now.After(crl.NextUpdate) {
		return &Error{Kind: KindConfig, Field: what, Expected: "next update after " + now.UTC().Format(time.RFC3339), Actual: crl.NextUpdate.UTC().Format(time.RFC3339),
			Hint: "the CRL is stale: fetch fresh collateral (c8s-launcher collateral fetch)"}
	}
	return nil
}

func revoked(crl *x509.RevocationList, c *x509.Certificate) bool {
	return slices.ContainsFunc(crl.RevokedCertificateEntries, func(e x509.RevocationListEntry) bool {
		return e.SerialNumber != nil && e.SerialNumber.Cmp(c.SerialNumber) == 0
	})
}

// checkSigned verifies a PCS response body: its signing chain ends in
// Intel's root, the signing certificate is valid at now and not revoked,
// and it signed the raw bytes of the body's field (ECDSA P-256, r||s).
func (c *TDXCollateral) checkSigned(what string, root *x509.Certificate, chain []*x509.Certificate, body []byte, field string, now time.Time) (json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, failure(KindFormat, what, err, "not a PCS response body")
	}
	raw, sigJSON := m[field], m["signature"]
	var sigHex string
	if raw == nil || json.Unmarshal(sigJSON, &sigHex) != nil {
		return nil, failure(KindFormat, what, fmt.Errorf("no %q and signature", field), "not a PCS response body")
	}
	signer, chainRoot := chain[0], chain[1]
	if !chainRoot.Equal(root) {
		return nil, failure(KindSignature, what+" issuer chain", errors.New("its root is not Intel's SGX root"), "")
	}
	if err := signer.CheckSignatureFrom(root); err != nil {
		return nil, failure(KindSignature, what+" signing certificate", err, "")
	}
	if now.Before(signer.NotBefore) || now.After(signer.NotAfter) {
		return nil, failure(KindSignature, what+" signing certificate", fmt.Errorf("valid %s to %s, not at %s", signer.NotBefore, signer.NotAfter, now.UTC().Format(time.RFC3339)), "")
	}
	if revoked(c.rootCRL, signer) {
		return nil, &Error{Kind: KindRevoked, Field: what + " signing certificate", Actual: "revoked"}
	}
	sig, err := hex.DecodeString(sigHex)
	pub, ok := signer.PublicKey.(*ecdsa.PublicKey)
	if err != nil || len(sig) != 64 || !ok {
		return nil, failure(KindFormat, what+" signature", errors.New("want 64 bytes r||s of ECDSA P-256"), "")
	}
	sum := sha256.Sum256(raw)
	if !ecdsa.Verify(pub, sum[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		return nil, failure(KindSignature, what+" signature", errors.New("does not verify with Intel's TCB signing key"), "the file was altered after Intel signed it")
	}
	return raw, nil
}

func (c *TDXCollateral) tcbInfoFor(root *x509.Certificate, fmspc string, now time.Time) (*pcs.TcbInfo, error) {
	body, ok := c.tcbInfo[fmspc]
	if !ok {
		return nil, collateralErr(c.loadedFrom, fmt.Errorf("no TCB info for this platform's FMSPC %s (it has %s)", fmspc, strings.Join(c.tcbInfoFMSPC, ", ")))
	}
	raw, err := c.checkSigned("TDX TCB info", root, c.tcbChain, body, "tcbInfo", now)
	if err != nil {
		return nil, err
	}
	var info pcs.TcbInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return nil, failure(KindFormat, "TDX TCB info", err, "")
	}
	switch {
	case info.ID != "TDX" || info.Version != 3:
		return nil, failure(KindFormat, "TDX TCB info", fmt.Errorf("id %q version %d, want TDX version 3", info.ID, info.Version), "")
	case !strings.EqualFold(info.Fmspc, fmspc):
		return nil, mismatch("TDX TCB info FMSPC", fmspc, info.Fmspc, "the file is named for another platform")
	case now.After(info.NextUpdate):
		return nil, &Error{Kind: KindConfig, Field: "TDX TCB info", Expected: "next update after " + now.UTC().Format(time.RFC3339), Actual: info.NextUpdate.UTC().Format(time.RFC3339),
			Hint: "the TCB info is stale: fetch fresh collateral (c8s-launcher collateral fetch)"}
	}
	return &info, nil
}

func (c *TDXCollateral) checkQE(root *x509.Certificate, qe qeReport, now time.Time) (string, error) {
	raw, err := c.checkSigned("TDX QE identity", root, c.qeChain, c.qeIdentity, "enclaveIdentity", now)
	if err != nil {
		return "", err
	}
	var id pcs.EnclaveIdentity
	if err := json.Unmarshal(raw, &id); err != nil {
		return "", failure(KindFormat, "TDX QE identity", err, "")
	}
	switch {
	case id.ID != "TD_QE" || id.Version != 2:
		return "", failure(KindFormat, "TDX QE identity", fmt.Errorf("id %q version %d, want TD_QE version 2", id.ID, id.Version), "")
	case now.After(id.NextUpdate):
		return "", &Error{Kind: KindConfig, Field: "TDX QE identity", Expected: "next update after " + now.UTC().Format(time.RFC3339), Actual: id.NextUpdate.UTC().Format(time.RFC3339),
			Hint: "the QE identity is stale: fetch fresh collateral (c8s-launcher collateral fetch)"}
	case !bytes.Equal(id.Mrsigner.Bytes, qe.MRSigner):
		return "", mismatch("QE MRSIGNER", hex.EncodeToString(id.Mrsigner.Bytes), hex.EncodeToString(qe.MRSigner), "the quoting enclave is not Intel's TD quoting enclave")
	case uint32(id.IsvProdID) != qe.ISVProdID:
		return "", mismatch("QE ISVPRODID", fmt.Sprint(id.IsvProdID), fmt.Sprint(qe.ISVProdID), "the quoting enclave is not Intel's TD quoting enclave")
	}
	var misc [4]byte
	misc[0], misc[1], misc[2], misc[3] = byte(qe.MiscSelect), byte(qe.MiscSelect>>8), byte(qe.MiscSelect>>16), byte(qe.MiscSelect>>24)
	if !maskedEqual(misc[:], id.MiscselectMask.Bytes, id.Miscselect.Bytes) {
		return "", mismatch("QE MISCSELECT", hex.EncodeToString(id.Miscselect.Bytes), hex.EncodeToString(misc[:]), "")
	}
	if !maskedEqual(qe.Attributes, id.AttributesMask.Bytes, id.Attributes.Bytes) {
		return "", mismatch("QE ATTRIBUTES", hex.EncodeToString(id.Attributes.Bytes), hex.EncodeToString(qe.Attributes), "the quoting enclave runs with attributes Intel does not accept (a debug enclave?)")
	}
	for _, l := range id.TcbLevels {
		if l.Tcb.Isvsvn <= qe.ISVSVN {
			return string(l.TcbStatus), nil
		}
	}
	return "", &Error{Kind: KindPolicy, Field: "TDX QE TCB status", Expected: TCBUpToDate, Actual: fmt.Sprintf("no level for ISVSVN %d", qe.ISVSVN),
		Hint: "the quoting enclave is older than every level of Intel's QE identity"}
}

func maskedEqual(v, mask, want []byte) bool {
	if len(v) != len(mask) || len(mask) != len(want) {
		return false
	}
	for i := range v {
		if v[i]&mask[i] != want[i] {
			return false
		}
	}
	return true
}

// matchTCBLevel returns the first (highest) TCB level the platform
// reaches (Intel's TDX TCB info evaluation: every SGX component of the PCK
// certificate, its PCESVN and every TEE_TCB_SVN byte at or above the
// level's; with a TDX module major version in TEE_TCB_SVN[1], bytes 0 and
// 1 are judged by the module identities instead).
func matchTCBLevel(levels []pcs.TcbLevel, cpusvn []byte, pcesvn uint16, tee []byte) (pcs.TcbLevel, bool) {
	for _, l := range levels {
		if len(l.Tcb.SgxTcbcomponents) != len(cpusvn) || len(l.Tcb.TdxTcbcomponents) != len(tee) || pcesvn < l.Tcb.Pcesvn {
			continue
		}
		ok := true
		for i, c := range l.Tcb.SgxTcbcomponents {
			ok = ok && cpusvn[i] >= c.Svn
		}
		start := 0
		if len(tee) > 1 && tee[1] > 0 {
			start = 2
		}
		for i := start; i < len(tee); i++ {
			ok = ok && tee[i] >= l.Tcb.TdxTcbcomponents[i].Svn
		}
		if ok {
			return l, true
		}
	}
	return pcs.TcbLevel{}, false
}

func matchModule(ids []pcs.TdxModuleIdentity, tee []byte) (pcs.TcbLevel, error) {
	id := fmt.Sprintf("TDX_%02X", tee[1])
	for _, m := range ids {
		if !strings.EqualFold(m.ID, id) {
			continue
		}
		for _, l := range m.TcbLevels {
			if uint32(tee[0]) >= l.Tcb.Isvsvn {
				return l, nil
			}
		}
		return pcs.TcbLevel{}, &Error{Kind: KindPolicy, Field: "TDX module TCB status", Expected: TCBUpToDate, Actual: fmt.Sprintf("no level for %s SVN %d", id, tee[0]),
			Hint: "the TDX module is older than every level of Intel's TCB info"}
	}
	return pcs.TcbLevel{}, &Error{Kind: KindPolicy, Field: "TDX module TCB status", Expected: TCBUpToDate, Actual: "unknown module " + id,
		Hint: "Intel's TCB info does not list this TDX module version"}
}
