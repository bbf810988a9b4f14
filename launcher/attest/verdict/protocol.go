package verdict

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"
)

// Subcommand is the argument a verifier (c8s-verify) is run with to
// answer a Request.
const Subcommand = "verify-evidence"

// Request is what `c8s-verify verify-evidence` reads on its stdin: a
// pod VM's evidence and what it must show. The verifier builds the policy
// from the image manifest, as the shim did in itself before.
type Request struct {
	// Evidence is what the guest's agent answered.
	Evidence Evidence `json:"evidence"`
	// TEE is the node's TEE (sim, snp, tdx): what the manifest's expected
	// launch digests are looked up for.
	TEE string `json:"tee"`
	// Manifest is the path of the image manifest: the launch digest per
	// vCPU shape (snp, sim) or the MRTD (tdx), and the measured boot.
	Manifest string `json:"manifest"`
	// VCPUs is the VM's vCPU count, the shape whose launch digest applies.
	VCPUs int `json:"vcpus"`
	// HostData (snp, sim) or MRConfigID (tdx) is the digest of the pod's
	// measured init data (guest/api/initdata); both empty: the pod has none.
	HostData   Hex `json:"host_data,omitempty"`
	MRConfigID Hex `json:"mrconfigid,omitempty"`
	// ReportData is the REPORT_DATA the evidence must carry: the host's
	// fresh nonce bound in the host-attestation domain (guest/api/reportdata).
	ReportData Hex `json:"report_data"`
	// MinTCB, AllowDebug: the node's attestation settings.
	MinTCB     uint64 `json:"min_tcb,omitempty"`
	AllowDebug bool   `json:"allow_debug,omitempty"`
	// ChipID, when set, pins the SNP chip (a pod that moved to another node).
	ChipID Hex `json:"chip_id,omitempty"`
	// Trusts are the roots the evidence may chain to, tried in order: a
	// failure other than "signed by another root" ends the search.
	Trusts []Trust `json:"trusts"`
	// CollateralDir is attestation.collateral_dir: offline collateral for
	// the hardware trusts (Intel's for tdx, AMD's CRLs for snp).
	CollateralDir string `json:"collateral_dir,omitempty"`
}

// Evidence is a guest's answer to GetEvidence (guest/api/agent).
type Evidence struct {
	// Kind is "snp" (SNP report, the sim TEE's included) or "tdx" (quote).
	Kind string `json:"kind"`
	// Provider is where the guest got it ("sim", "sev-guest", …).
	Provider  string `json:"provider,omitempty"`
	Report    []byte `json:"report"`
	CertTable []byte `json:"cert_table,omitempty"`
	SimRTMRs  []byte `json:"sim_rtmrs,omitempty"`
	EventLog  []byte `json:"event_log,omitempty"`
}

// Trust is one root of trust: a TEE vendor's (Mode snp, tdx), or a node's
// simulated secure processor (Mode sim, with its ASK and ARK in PEM).
type Trust struct {
	Mode         Mode   `json:"mode"`
	SimCertChain []byte `json:"sim_cert_chain,omitempty"`
}

// Verdict is what `c8s-verify verify-evidence` writes on its stdout:
// the verified claims, or why the evidence was refused. Exactly one of the
// three is set.
type Verdict struct {
	SNP     *SNPClaims `json:"snp,omitempty"`
	TDX     *TDXClaims `json:"tdx,omitempty"`
	Failure *Failure   `json:"failure,omitempty"`
}

// Err is the refusal (nil when the evidence verified).
func (v *Verdict) Err() error { return v.Failure.Err() }

func (v *Verdict) check() error {
	n := 0
	for _, set := range []bool{v.SNP != nil, v.TDX != nil, v.Failure != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("a verdict holds exactly one of snp, tdx and failure; this one holds %d", n)
	}
	if v.Failure != nil && v.Failure.Message == "" {
		return errors.New("a failure without a message")
	}
	return nil
}

// Limits of the exchange: evidence is a few KiB (a TDX event log the
// most), a verdict less.
const (
	maxRequest = 16 << 20
	maxVerdict = 1 << 20
)

// Timeout bounds one verification: without fetching (the shim never
// fetches) it takes milliseconds, the process start under load a second.
const Timeout = 2 * time.Minute

// Run has the helper, `VERIFIER verify-evidence`, decide req: Start, then
// Decide.
func Run(ctx context.Context, launcher string, req *Request) (*Verdict, error) {
	h, err := Start(ctx, launcher)
	if err != nil {
		return nil, err
	}
	return h.Decide(req)
}

// Helper is a started `c8s-verify verify-evidence` waiting for its
// request: a caller starts it before it asks the guest for evidence, so
// that the process start overlaps the guest's answer. Exactly one of
// Decide and Close ends it.
type Helper struct {
	name           string
	ctx            context.Context
	cancel         context.CancelFunc
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr bytes.Buffer
}

// Start starts `VERIFIER verify-evidence`. ctx ending (or Timeout passing)
// kills it.
func Start(ctx context.Context, launcher string) (*Helper, error) {
	h := &Helper{name: launcher + " " + Subcommand}
	h.ctx, h.cancel = context.WithTimeout(ctx, Timeout)
	h.cmd = exec.CommandContext(h.ctx, launcher, Subcommand)
	h.cmd.Stdout = &limited{w: &h.stdout, n: maxVerdict}
	h.cmd.Stderr = &limited{w: &h.stderr, n: 64 << 10}
	stdin, err := h.cmd.StdinPipe()
	if err != nil {
		h.cancel()
		return nil, err
	}
	h.stdin = stdin
	if err := h.cmd.Start(); err != nil {
		h.cancel()
		return nil, fmt.Errorf("the evidence verifier %s: %w", h.name, err)
	}
	return h, nil
}

// Close kills a helper that got no request and reaps it.
func (h *Helper) Close() {
	h.cancel()
	_ = h.stdin.Close()
	_ = h.cmd.Wait()
}

// Decide sends req and waits for the verdict. The error is the exchange's
// (the helper died, answered nonsense, ctx ended); a refusal of the
// evidence is the verdict's (Verdict.Err).
func (h *Helper) Decide(req *Request) (*Verdict, error) {
	defer h.cancel()
	in, err := json.Marshal(req)
	if err != nil {
		h.Close()
		return nil, err
	}
	// A helper that died early shows in Wait's error, not in this write's.
	_, _ = h.stdin.Write(in)
	_ = h.stdin.Close()
	if err := h.cmd.Wait(); err != nil {
		if h.ctx.Err() != nil {
			return nil, fmt.Errorf("the evidence verifier %s: %w", h.name, h.ctx.Err())
		}
		msg := strings.TrimSpace(h.stderr.String())
		if i := strings.LastIndex(msg, Subcommand+": "); i >= 0 {
			msg = msg[i+len(Subcommand)+2:]
		}
		if msg == "" {
			msg = err.Error()
		} else {
			msg += " (" + err.Error() + ")"
		}
		return nil, fmt.Errorf("the evidence verifier %s failed: %s", h.name, msg)
	}
	var v Verdict
	if err := json.Unmarshal(h.stdout.Bytes(), &v); err != nil {
		return nil, fmt.Errorf("the evidence verifier %s answered %q, not a verdict: %w", h.name, truncate(h.stdout.String()), err)
	}
	if err := v.check(); err != nil {
		return nil, fmt.Errorf("the evidence verifier %s answered %q: %w", h.name, truncate(h.stdout.String()), err)
	}
	return &v, nil
}

// Serve is the helper's side: one Request from r, decided by decide,
// its Verdict written to w. A request it cannot read is an error (the
// helper exits non-zero), never a verdict; unknown fields are refused,
// since a check this verifier does not know would go unchecked.
func Serve(r io.Reader, w io.Writer, decide func(*Request) *Verdict) error {
	dec := json.NewDecoder(io.LimitReader(r, maxRequest))
	dec.DisallowUnknownFields()
	var req Request
	if err := dec.Decode(&req); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("reading the request on stdin: no request")
		}
		if strings.Contains(err.Error(), "unknown field") {
			return fmt.Errorf("reading the request on stdin: %w (the shim and c8s-launcher are from different builds?)", err)
		}
		return fmt.Errorf("reading the request on stdin: %w", err)
	}
	if dec.More() {
		return errors.New("reading the request on stdin: more than one JSON value")
	}
	v := decide(&req)
	if err := v.check(); err != nil {
		return err
	}
	return json.NewEncoder(w).Encode(v)
}

// limited writes at most n bytes to w, then drops the rest.
type limited struct {
	w io.Writer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if k := min(len(p), l.n); k > 0 {
		if _, err := l.w.Write(p[:k]); err != nil {
			return 0, err
		}
		l.n -= k
	}
	return len(p), nil
}

func truncate(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// NonceSize is the size of NewNonce's challenges.
const NonceSize = 32

// NewNonce returns a fresh random challenge; the guest binds it into
// REPORT_DATA (guest/api/reportdata).
func NewNonce() (Hex, error) {
	n := make(Hex, NonceSize)
	if _, err := rand.Read(n); err != nil {
		return nil, fmt.Errorf("attest: nonce: %w", err)
	}
	return n, nil
}
