// Package kbs is the agent's client of a key broker that speaks the
// Confidential Containers KBS protocol (guest/api/kbs), as Trustee's KBS
// does: it opens a session (POST /kbs/v0/auth), answers the challenge with
// TEE evidence whose REPORT_DATA binds the nonce and a fresh ephemeral
// key (POST /kbs/v0/attest), then fetches resources (GET
// /kbs/v0/resource/REPO/TYPE/TAG), each a JWE that only that key opens.
//
// The broker is reached over HTTPS with one pinned root, the certificate
// from the pod's measured init data: a broker presenting anything else is
// refused before a byte of evidence leaves the guest. Errors never carry
// resource contents.
package kbs

import (
	"bytes"
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
	"net"
	"net/http"
	"net/http/cookiejar"
	"strings"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
)

// KeyAlgorithm is the JWE key management algorithm of the ephemeral key.
const KeyAlgorithm = jose.ECDH_ES_A256KW

// Evidence returns TEE evidence with reportData in REPORT_DATA: the
// protocol's TEE name and the primary evidence JSON document, in the
// encoding Trustee's verifier for that TEE reads (kbsapi.SNPEvidence,
// kbsapi.TDXEvidence).
type Evidence func(ctx context.Context, reportData [64]byte) (tee string, evidence []byte, err error)

// Client fetches resources from one broker.
type Client struct {
	// URL is the broker's base URL (https://HOST[:PORT]).
	URL string
	// Roots are the only roots the broker's certificate may chain to.
	Roots *x509.CertPool
	// Dial opens a byte stream to the broker's address; nil dials TCP.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Evidence produces the TEE evidence.
	Evidence Evidence
	// Tee is the protocol TEE name announced in the Request.
	Tee string
	// InitData is the plaintext init data (TOML) sent with the evidence,
	// whose digest the evidence carries as HOST_DATA.
	InitData []byte
}

// Error is a request the broker refused.
type Error struct {
	Op     string // "auth", "attest" or "resource REPO/TYPE/TAG"
	Status int
	Info   kbsapi.ErrorInformation
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("kbs: %s: the broker answered %d %s", e.Op, e.Status, http.StatusText(e.Status))
	if e.Info.Detail != "" {
		msg += ": " + e.Info.Detail
	}
	switch e.Status {
	case http.StatusUnauthorized:
		msg += " (the broker did not accept this pod's evidence: is its policy set for this image's measurement and init data?)"
	case http.StatusNotFound:
		msg += " (no such resource on the broker: check the resource path in the init data)"
	case http.StatusForbidden:
		msg += " (the broker's resource policy does not release it to this pod)"
	}
	return msg
}

// permanent reports whether retrying err cannot help: the broker refused
// (4xx), or its certificate is not the pinned one.
func permanent(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Status >= 400 && e.Status < 500
	}
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var host x509.HostnameError
	return errors.As(err, &unknown) || errors.As(err, &verify) || errors.As(err, &host)
}

// session is one attested session: its HTTP client (with the cookie) and
// the ephemeral key the broker wraps resources to.
type session struct {
	c    *Client
	http *http.Client
	key  *ecdsa.PrivateKey
}

// Fetch runs the handshake once and returns the contents of resources
// (REPO/TYPE/TAG), in order.
func (c *Client) Fetch(ctx context.Context, resources []string) ([][]byte, error) {
	s, err := c.open(ctx)
	if err != nil {
		return nil, err
	}
	defer s.http.CloseIdleConnections()
	out := make([][]byte, 0, len(resources))
	for _, r := range resources {
		b, err := s.resource(ctx, r)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

func (c *Client) httpClient() (*http.Client, error) {
	jar, err := cookiejar.New(nil)
	if err != nil {
		return nil, err
	}
	dial := c.Dial
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	tr := &http.Transport{
		DialContext:         dial,
		TLSClientConfig:     &tls.Config{RootCAs: c.Roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 20 * time.Second,
		ForceAttemptHTTP2:   false,
		MaxIdleConnsPerHost: 1,
		Proxy:               nil,
	}
	return &http.Client{Transport: tr, Jar: jar, Timeout: 60 * time.Second}, nil
}

// open runs auth and attest.
func (c *Client) open(ctx context.Context) (*session, error) {
	if c.Roots == nil {
		return nil, errors.New("kbs: no pinned broker certificate")
	}
	hc, err := c.httpClient()
	if err != nil {
		return nil, err
	}
	s := &session{c: c, http: hc}
	req := kbsapi.Request{
		Version:     kbsapi.ProtocolVersion,
		Tee:         c.Tee,
		ExtraParams: map[string]any{kbsapi.SupportedHashAlgorithms: kbsapi.HashAlgorithms},
	}
	var ch kbsapi.Challenge
	if err := s.post(ctx, "auth", kbsapi.AuthPath, req, &ch); err != nil {
		hc.CloseIdleConnections()
		return nil, err
	}
	alg, err := ch.SelectedHash()
	if err != nil {
		hc.CloseIdleConnections()
		return nil, fmt.Errorf("kbs: auth: %w", err)
	}
	if s.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	jwk, err := json.Marshal(jose.JSONWebKey{Key: &s.key.PublicKey, Algorithm: string(KeyAlgorithm)})
	if err != nil {
		return nil, err
	}
	// No additional (device) evidence: the primary evidence binds the
	// nonce, the key and an empty additional_evidence string.
	rt := kbsapi.RuntimeData{Nonce: ch.Nonce, TeePubKey: jwk}
	bound, err := kbsapi.PrimaryRuntimeData(rt, "")
	if err != nil {
		hc.CloseIdleConnections()
		return nil, err
	}
	rd, err := kbsapi.ReportData(bound, alg)
	if err != nil {
		hc.CloseIdleConnections()
		return nil, err
	}
	tee, ev, err := c.Evidence(ctx, rd)
	if err != nil {
		hc.CloseIdleConnections()
		return nil, fmt.Errorf("kbs: get TEE evidence: %w", err)
	}
	if tee != c.Tee {
		hc.CloseIdleConnections()
		return nil, fmt.Errorf("kbs: the guest produced %s evidence for a %s session", tee, c.Tee)
	}
	att := kbsapi.Attestation{RuntimeData: rt, TeeEvidence: kbsapi.CompositeEvidence{PrimaryEvidence: ev}}
	if len(c.InitData) > 0 {
		att.InitData = &kbsapi.InitData{Format: "toml", Body: string(c.InitData)}
	}
	var tok kbsapi.AttestResponse
	if err := s.post(ctx, "attest", kbsapi.AttestPath, att, &tok); err != nil {
		hc.CloseIdleConnections()
		return nil, err
	}
	return s, nil
}

// maxBody bounds what the client reads from the broker.
const maxBody = 4 << 20

func (s *session) post(ctx context.Context, op, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(s.c.URL, "/")+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("kbs: %s: %w", op, err)
	}
	req.Header.Set("Content-Type", "application/json")
	return s.do(req, op, out)
}

func (s *session) do(req *http.Request, op string, out any) error {
	resp, err := s.http.Do(req)
	if err != nil {
		return fmt.Errorf("kbs: %s: %w", op, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return fmt.Errorf("kbs: %s: read the answer: %w", op, err)
	}
	if resp.StatusCode != http.StatusOK {
		e := &Error{Op: op, Status: resp.StatusCode}
		_ = json.Unmarshal(data, &e.Info)
		return e
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("kbs: %s: the answer is not the expected JSON: %w", op, err)
	}
	return nil
}

// resource fetches one resource and opens its JWE.
func (s *session) resource(ctx context.Context, path string) ([]byte, error) {
	op := "resource " + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(s.c.URL, "/")+kbsapi.ResourcePath+path, nil)
	if err != nil {
		return nil, fmt.Errorf("kbs: %s: %w", op, err)
	}
	var raw json.RawMessage
	if err := s.do(req, op, &raw); err != nil {
		return nil, err
	}
	plain, err := openResponse(raw, s.key)
	if err != nil {
		return nil, fmt.Errorf("kbs: %s: %w", op, err)
	}
	return plain, nil
}

// openResponse decrypts a resource response (a flattened JSON JWE) with
// the session's key.
func openResponse(body []byte, key *ecdsa.PrivateKey) ([]byte, error) {
	var raw map[string]any
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("the answer is not a JSON object: %w", err)
	}
	// Older Trustee responses carry "aad" as the protected header itself,
	// which JWE already authenticates; as a JWE "aad" member it would be
	// authenticated a second time. Current ones leave it out.
	if aad, ok := raw["aad"]; ok && aad == raw["protected"] {
		delete(raw, "aad")
	}
	doc, err := json.Marshal(raw)
	if err != nil {
		return nil, err
	}
	jwe, err := jose.ParseEncryptedJSON(string(doc),
		[]jose.KeyAlgorithm{KeyAlgorithm},
		[]jose.ContentEncryption{jose.A256GCM, jose.A128GCM, jose.A192GCM})
	if err != nil {
		return nil, fmt.Errorf("the answer is not a JWE for this session's key: %w", err)
	}
	plain, err := jwe.Decrypt(key)
	if err != nil {
		return nil, fmt.Errorf("decrypt: %w", err)
	}
	return plain, nil
}

// Retry bounds Fetch's retries.
type Retry struct {
	// Attempts is the number of tries (at least 1).
	Attempts int
	// Backoff is the wait before the second try; it doubles each time.
	Backoff time.Duration
	// Log is told of each failed try that will be retried.
	Log func(attempt int, err error, wait time.Duration)
}

// FetchRetry is Fetch, tried again after failures that may pass (the
// broker unreachable, a connection reset), never after a refusal or a
// certificate that is not the pinned one.
func (c *Client) FetchRetry(ctx context.Context, resources []string, r Retry) ([][]byte, error) {
	wait := r.Backoff
	for attempt := 1; ; attempt++ {
		out, err := c.Fetch(ctx, resources)
		if err == nil {
			return out, nil
		}
		if permanent(err) || attempt >= r.Attempts || ctx.Err() != nil {
			if attempt > 1 {
				err = fmt.Errorf("%w (after %d attempts)", err, attempt)
			}
			return nil, err
		}
		if r.Log != nil {
			r.Log(attempt, err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (gave up: %w)", err, ctx.Err())
		case <-t.C:
		}
		wait *= 2
	}
}
