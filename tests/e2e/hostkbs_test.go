package e2e

// The key broker side of TestMaliciousHost (malicious_test.go): a broker
// for pods whose [policy] states exec per container, and the handshake a
// host runs itself to get the pod's secrets with the pod's evidence.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"time"

	"github.com/containerd/errdefs/pkg/errgrpc"
	jose "github.com/go-jose/go-jose/v4"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
)

// hostHandshake is the attack of a host that runs a key broker's
// handshake itself: it opens a session, binds its own ephemeral key to
// the broker's challenge as the KBS protocol does (guest/api/kbs), asks
// the pod's agent for evidence over exactly that binding, and sends the
// genuine evidence with the pod's init data. It returns the binding the
// host asked for, the evidence it got, the attest answer and the answer
// to a resource request on the same session.
type hostHandshake struct {
	binding  [64]byte
	evidence *agent.GetEvidenceResponse
	attest   brokerAnswer
	resource brokerAnswer
}

// brokerAnswer is an HTTP answer of the broker.
type brokerAnswer struct {
	status int
	info   kbsapi.ErrorInformation
	body   string
}

func runHostHandshake(ctx context.Context, b *broker, ag agent.AgentService, initData []byte) (*hostHandshake, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(b.certPEM) {
		return nil, errors.New("the broker's certificate does not parse")
	}
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	hc := &http.Client{Jar: jar, Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	defer hc.CloseIdleConnections()
	base := "https://" + b.addr
	do := func(method, path string, body any) (brokerAnswer, error) {
		var rd io.Reader
		if body != nil {
			raw, err := json.Marshal(body)
			if err != nil {
				return brokerAnswer{}, err
			}
			rd = strings.NewReader(string(raw))
		}
		req, err := http.NewRequestWithContext(ctx, method, base+path, rd)
		if err != nil {
			return brokerAnswer{}, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return brokerAnswer{}, err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if err != nil {
			return brokerAnswer{}, err
		}
		a := brokerAnswer{status: resp.StatusCode, body: string(data)}
		if resp.StatusCode != http.StatusOK {
			_ = json.Unmarshal(data, &a.info)
		}
		return a, nil
	}
	// POST auth, as the guest's client would.
	a, err := do(http.MethodPost, kbsapi.AuthPath, kbsapi.Request{
		Version: kbsapi.ProtocolVersion, Tee: kbsapi.TeeSNP,
		ExtraParams: map[string]any{kbsapi.SupportedHashAlgorithms: kbsapi.HashAlgorithms},
	})
	if err != nil || a.status != http.StatusOK {
		return nil, fmt.Errorf("auth: %v %d %s", err, a.status, a.body)
	}
	var ch kbsapi.Challenge
	if err := json.Unmarshal([]byte(a.body), &ch); err != nil {
		return nil, err
	}
	alg, err := ch.SelectedHash()
	if err != nil {
		return nil, err
	}
	// The host's own key, bound to the challenge as the protocol binds it.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	jwk, err := json.Marshal(jose.JSONWebKey{Key: &key.PublicKey, Algorithm: string(jose.ECDH_ES_A256KW)})
	if err != nil {
		return nil, err
	}
	rt := kbsapi.RuntimeData{Nonce: ch.Nonce, TeePubKey: jwk}
	bound, err := kbsapi.PrimaryRuntimeData(rt, "")
	if err != nil {
		return nil, err
	}
	h := &hostHandshake{}
	if h.binding, err = kbsapi.ReportData(bound, alg); err != nil {
		return nil, err
	}
	// Genuine evidence of the pod's TEE, asked for over the host's binding.
	if h.evidence, err = ag.GetEvidence(ctx, &agent.GetEvidenceRequest{Nonce: h.binding[:]}); err != nil {
		return nil, fmt.Errorf("GetEvidence: %w", errgrpc.ToNative(err))
	}
	ev, err := kbsapi.NewSNPEvidence(h.evidence.Report, h.evidence.CertTable)
	if err != nil {
		return nil, err
	}
	primary, err := json.Marshal(ev)
	if err != nil {
		return nil, err
	}
	if h.attest, err = do(http.MethodPost, kbsapi.AttestPath, kbsapi.Attestation{
		InitData:    &kbsapi.InitData{Format: "toml", Body: string(initData)},
		RuntimeData: rt,
		TeeEvidence: kbsapi.CompositeEvidence{PrimaryEvidence: primary},
	}); err != nil {
		return nil, err
	}
	if h.resource, err = do(http.MethodGet, kbsapi.ResourcePath+"default/key/db-password", nil); err != nil {
		return nil, err
	}
	return h, nil
}
