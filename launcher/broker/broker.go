// Package broker is a key broker (KBS) that speaks the Confidential Containers KBS
// protocol (guest/api/kbs) as Trustee's KBS does, for tests and
// single-node setups: it hands out a challenge per session, verifies the
// pod's evidence with launcher/attest against a policy (the launch
// measurements of the image manifest, the HOST_DATA of the pod's init
// data, the minimum TCB, debug forbidden), and releases a resource only to
// a session whose evidence passed, encrypted to the ephemeral key that
// evidence bound. Each challenge can be answered once: a replayed
// attestation, or one for another session's nonce, is refused.
//
// The host launches the pod, so it chooses the init data the evidence
// shows. The broker therefore accepts only init data the owner pinned
// (Broker.InitData, or the HOST_DATA / MRCONFIGID of its Policy), and
// releases secrets only to init data under which the host cannot run code
// of its choosing in the pod: an enforced [policy] section
// (initdata.InitData.HostCanRunCode).
//
// Multi-node clusters use Trustee's KBS instead (see the README).
package broker

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
	jose "github.com/go-jose/go-jose/v4"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	kbsapi "github.com/c8s-dev/c8s/guest/api/kbs"
	"github.com/c8s-dev/c8s/launcher/attest"
)

// Resources is where the broker finds what it releases.
type Resources interface {
	// Get returns the resource REPO/TYPE/TAG, or an error wrapping
	// fs.ErrNotExist.
	Get(path string) ([]byte, error)
}

// Dir serves resources from files DIR/REPO/TYPE/TAG.
type Dir string

// Get implements Resources.
func (d Dir) Get(path string) ([]byte, error) {
	if !fs.ValidPath(path) || strings.Count(path, "/") != 2 {
		return nil, fmt.Errorf("resource %q: %w", path, fs.ErrNotExist)
	}
	return os.ReadFile(filepath.Join(string(d), filepath.FromSlash(path)))
}

// Map serves resources from memory.
type Map map[string][]byte

// Get implements Resources.
func (m Map) Get(path string) ([]byte, error) {
	b, ok := m[path]
	if !ok {
		return nil, fmt.Errorf("resource %q: %w", path, fs.ErrNotExist)
	}
	return b, nil
}

// Broker is an http.Handler serving the KBS protocol. It logs one line per
// decision (never resource contents) to log.G of the request's context:
// the http.Server's BaseContext carries the logger.
type Broker struct {
	// Verifier checks evidence signatures against the node's trust roots.
	Verifier *attest.Verifier
	// Policy is what evidence must show; its Nonce is ignored (each
	// session's binding is used). Its HostData (SNP) and MRConfigID
	// (TDX), when set, each pin one init data digest, as InitData does.
	Policy attest.Policy
	// InitData are the init data documents of the owner's pods (TOML, as
	// the pods are launched with them). The evidence's HOST_DATA (SNP) or
	// MRCONFIGID (TDX) must be the digest of the document sent with it,
	// and that digest must be one of these documents' or the Policy's.
	// With nothing pinned, every attestation is refused, unless
	// AnyInitData.
	InitData [][]byte
	// AnyInitData accepts whatever init data the pod sends, as long as
	// its evidence shows the document's digest. The host launches the
	// pod, so it would write that document: a [policy] of its own that
	// lets it run what it likes. For development only.
	AnyInitData bool
	// AllowUnconfinedHost also releases resources to pods whose init data
	// lets the host run code of its choosing in them (no [policy]
	// section, whatever agent_policy.allow_exec says, or a [policy] in
	// audit mode; initdata.InitData.HostCanRunCode), which could read the
	// secrets back. For development only.
	AllowUnconfinedHost bool
	// Resources are released to attested sessions.
	Resources Resources
	// SessionTTL bounds a session's life (default 5 minutes).
	SessionTTL time.Duration

	mu       sync.Mutex
	sessions map[string]*session
}

type session struct {
	nonce    string
	tee      string
	hashAlg  string
	expires  time.Time
	answered bool             // the challenge was answered (once only)
	key      *jose.JSONWebKey // set once attested
}

// maxSessions bounds the session table.
const maxSessions = 1024

// ServeHTTP implements http.Handler.
func (b *Broker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == kbsapi.AuthPath && r.Method == http.MethodPost:
		b.auth(w, r)
	case r.URL.Path == kbsapi.AttestPath && r.Method == http.MethodPost:
		b.attest(w, r)
	case strings.HasPrefix(r.URL.Path, kbsapi.ResourcePath) && r.Method == http.MethodGet:
		b.resource(w, r, strings.TrimPrefix(r.URL.Path, kbsapi.ResourcePath))
	default:
		problem(w, http.StatusNotFound, "InvalidRequest", fmt.Sprintf("%s %s is not a KBS endpoint", r.Method, r.URL.Path))
	}
}

func problem(w http.ResponseWriter, status int, typ, detail string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(kbsapi.ErrorInformation{Type: kbsapi.ErrorTypePrefix + typ, Detail: detail})
}

func reply(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func random(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	return dec.Decode(v)
}

func (b *Broker) ttl() time.Duration {
	if b.SessionTTL > 0 {
		return b.SessionTTL
	}
	return 5 * time.Minute
}

func (b *Broker) auth(w http.ResponseWriter, r *http.Request) {
	var req kbsapi.Request
	if err := readJSON(r, &req); err != nil {
		problem(w, http.StatusBadRequest, "InvalidRequest", "the Request is not JSON: "+err.Error())
		return
	}
	if !strings.HasPrefix(req.Version, "0.4.") {
		problem(w, http.StatusUnauthorized, "ProtocolVersion", fmt.Sprintf("protocol version %q is not supported: this broker speaks %s", req.Version, kbsapi.ProtocolVersion))
		return
	}
	if req.Tee != kbsapi.TeeSNP && req.Tee != kbsapi.TeeTDX {
		problem(w, http.StatusUnauthorized, "UnsupportedTee", fmt.Sprintf("TEE %q is not supported: this broker verifies snp and tdx evidence", req.Tee))
		return
	}
	alg := kbsapi.DefaultHashAlgorithm
	if algs, ok := req.ExtraParams[kbsapi.SupportedHashAlgorithms].([]any); ok && !slices.Contains(algs, any(alg)) {
		problem(w, http.StatusUnauthorized, "InvalidRequest", "the client does not support the "+alg+" runtime-data hash")
		return
	}
	id, err := random(24)
	if err != nil {
		problem(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	nonce, err := random(32)
	if err != nil {
		problem(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	s := &session{nonce: nonce, tee: req.Tee, hashAlg: alg, expires: time.Now().Add(b.ttl())}
	b.mu.Lock()
	if b.sessions == nil {
		b.sessions = map[string]*session{}
	}
	b.expireLocked()
	if len(b.sessions) >= maxSessions {
		b.mu.Unlock()
		problem(w, http.StatusServiceUnavailable, "InternalError", "too many open sessions")
		return
	}
	b.sessions[id] = s
	b.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: kbsapi.CookieName, Value: id, Path: kbsapi.Prefix, Expires: s.expires, HttpOnly: true, Secure: true})
	// As Trustee's KBS with its built-in attestation service: extra-params
	// is an empty string and the runtime data is hashed with sha384.
	reply(w, kbsapi.Challenge{Nonce: nonce, ExtraParams: json.RawMessage(`""`)})
}

func (b *Broker) expireLocked() {
	now := time.Now()
	for id, s := range b.sessions {
		if now.After(s.expires) {
			delete(b.sessions, id)
		}
	}
}

// lookup returns the request's session, or nil.
func (b *Broker) lookup(r *http.Request) (string, *session) {
	c, err := r.Cookie(kbsapi.CookieName)
	if err != nil {
		return "", nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.sessions[c.Value]
	if s == nil || time.Now().After(s.expires) {
		delete(b.sessions, c.Value)
		return "", nil
	}
	return c.Value, s
}

func (b *Broker) attest(w http.ResponseWriter, r *http.Request) {
	id, s := b.lookup(r)
	if s == nil {
		problem(w, http.StatusUnauthorized, "InvalidCookie", "no open session: POST "+kbsapi.AuthPath+" first")
		return
	}
	l := log.G(r.Context()).WithField("session", id[:8])
	b.mu.Lock()
	replay := s.answered
	s.answered = true
	b.mu.Unlock()
	if replay {
		l.Warn("kbs: refused a second attestation for one challenge")
		problem(w, http.StatusUnauthorized, "AttestationFailed", "this session's challenge was already answered: start a new session")
		return
	}
	key, err := b.verify(r, s)
	if err != nil {
		l.WithError(err).Warn("kbs: attestation refused")
		problem(w, http.StatusUnauthorized, "AttestationFailed", err.Error())
		return
	}
	b.mu.Lock()
	s.key = key
	b.mu.Unlock()
	l.Info("kbs: attested")
	tok, err := random(32)
	if err != nil {
		problem(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	reply(w, kbsapi.AttestResponse{Token: tok})
}

// verify checks an Attestation against the session and the policy, and
// returns the ephemeral key it binds. It reads what Trustee's KBS reads:
// the composite tee-evidence of protocol 0.4.0, whose primary evidence
// binds {additional-evidence, nonce, tee-pubkey}, in the encoding of
// Trustee's verifier for the session's TEE.
func (b *Broker) verify(r *http.Request, s *session) (*jose.JSONWebKey, error) {
	var att kbsapi.Attestation
	if err := readJSON(r, &att); err != nil {
		return nil, fmt.Errorf("the Attestation is not the protocol's JSON: %w", err)
	}
	rt := att.RuntimeData
	if rt.Nonce != s.nonce {
		return nil, errors.New("runtime-data nonce is not this session's challenge (a replayed attestation?)")
	}
	var key jose.JSONWebKey
	if err := key.UnmarshalJSON(rt.TeePubKey); err != nil {
		return nil, fmt.Errorf("runtime-data tee-pubkey: %w", err)
	}
	if !key.Valid() || !key.IsPublic() {
		return nil, errors.New("runtime-data tee-pubkey is not a valid public key")
	}
	if att.TeeEvidence.AdditionalEvidence != "" {
		return nil, errors.New("tee-evidence carries additional (device) evidence, which this broker does not verify")
	}
	if len(att.TeeEvidence.PrimaryEvidence) == 0 {
		return nil, errors.New("tee-evidence has no primary_evidence")
	}
	bound, err := kbsapi.PrimaryRuntimeData(rt, att.TeeEvidence.AdditionalEvidence)
	if err != nil {
		return nil, err
	}
	rd, err := kbsapi.ReportData(bound, s.hashAlg)
	if err != nil {
		return nil, err
	}
	p := b.Policy
	p.Nonce = rd[:]
	doc, err := b.checkInitData(att.InitData)
	if err != nil {
		return nil, err
	}
	if b.Verifier == nil {
		return nil, errors.New("the broker has no verifier")
	}
	switch s.tee {
	case kbsapi.TeeSNP:
		var sum []byte
		if doc != nil {
			d := initdata.Digest(doc)
			sum = d[:]
		}
		want, err := b.expectInitData("HOST_DATA", "host_data", sum, b.pins(s.tee))
		if err != nil {
			return nil, err
		}
		p.HostData = want
		report, certs, err := decodeSNP(att.TeeEvidence.PrimaryEvidence)
		if err != nil {
			return nil, err
		}
		claims, err := b.Verifier.VerifySNP(report, certs, &p)
		if err != nil {
			return nil, err
		}
		if want == nil {
			if err := b.pinned("HOST_DATA", claims.HostData, b.pins(s.tee)); err != nil {
				return nil, err
			}
		}
	case kbsapi.TeeTDX:
		var sum []byte
		if doc != nil {
			d := initdata.DigestTDX(doc)
			sum = d[:]
		}
		want, err := b.expectInitData("MRCONFIGID", "mrconfigid", sum, b.pins(s.tee))
		if err != nil {
			return nil, err
		}
		p.MRConfigID = want
		quote, err := decodeTDX(att.TeeEvidence.PrimaryEvidence)
		if err != nil {
			return nil, err
		}
		claims, err := b.Verifier.VerifyTDX(quote, &p)
		if err != nil {
			return nil, err
		}
		if want == nil {
			if err := b.pinned("MRCONFIGID", claims.MRConfigID, b.pins(s.tee)); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("TEE %q is not supported", s.tee)
	}
	return &key, nil
}

// pins returns the init data digests the owner pinned for a TEE: those of
// the InitData documents and the Policy's HostData or MRConfigID.
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
// under AllowUnconfinedHost) it returns the one pin, or nil for several:
// the evidence's digest is then checked against pins once verified.
func (b *Broker) expectInitData(field, policyKey string, sum []byte, pins []attest.Hex) (attest.Hex, error) {
	switch {
	case sum != nil && slices.ContainsFunc(pins, func(p attest.Hex) bool { return string(p) == string(sum) }):
		return sum, nil
	case sum != nil && len(pins) > 0:
		return nil, fmt.Errorf("the init-data sent (%s %x) is not a document the broker pins: add the pod's init data to the broker (c8s-launcher kbs --init-data FILE, or its %s in --policy)", field, sum, policyKey)
	case sum != nil && b.AnyInitData:
		return sum, nil
	case sum != nil:
		return nil, fmt.Errorf("the broker pins no init data, so it would trust whatever document the host launched the pod with: give it the pods' init data (c8s-launcher kbs --init-data FILE, or %s in --policy)", policyKey)
	case len(pins) == 0:
		return nil, fmt.Errorf("the broker pins no %s and the attestation carries no init-data to bind it", field)
	case len(pins) == 1:
		return pins[0], nil
	}
	return nil, nil
}

// pinned checks a verified init data digest against pins.
func (b *Broker) pinned(field string, got attest.Hex, pins []attest.Hex) error {
	if slices.ContainsFunc(pins, func(p attest.Hex) bool { return string(p) == string(got) }) {
		return nil
	}
	return fmt.Errorf("%s %s is not the digest of init data the broker pins", field, got)
}

// checkInitData reads the init data sent with the evidence (nil if none)
// and refuses one under which the host could run code of its choosing in
// the pod and read the secrets back (InitData.HostCanRunCode), unless
// AllowUnconfinedHost.
func (b *Broker) checkInitData(d *kbsapi.InitData) ([]byte, error) {
	if d == nil {
		if b.AllowUnconfinedHost {
			return nil, nil
		}
		return nil, errors.New("the attestation carries no init-data: the broker releases secrets only to a pod whose measured init data has an enforced [policy] section, and must read it to know")
	}
	if d.Format != "toml" {
		return nil, fmt.Errorf("init-data format %q: this broker, like Trustee's built-in attestation service, reads toml", d.Format)
	}
	body := []byte(d.Body)
	doc, err := initdata.Parse(body)
	if err != nil {
		return nil, err
	}
	if b.AllowUnconfinedHost {
		return body, nil
	}
	if unconfined, reason := doc.HostCanRunCode(); unconfined {
		fix := "add a [policy] section (c8s-measure policy can generate one)"
		if doc.PolicyGoverns() {
			fix = "set policy.audit = false once the policy is complete (c8s-measure policy can generate one)"
		}
		return nil, fmt.Errorf("secrets go only to a pod whose measured init data has an enforced [policy]: %s; %s", reason, fix)
	}
	return body, nil
}

func (b *Broker) resource(w http.ResponseWriter, r *http.Request, path string) {
	id, s := b.lookup(r)
	if s == nil {
		problem(w, http.StatusUnauthorized, "InvalidCookie", "no attested session: attest first")
		return
	}
	b.mu.Lock()
	key := s.key
	b.mu.Unlock()
	if key == nil {
		problem(w, http.StatusUnauthorized, "UnAuthenticatedCookie", "the session has not attested")
		return
	}
	l := log.G(r.Context()).WithField("session", id[:8])
	data, err := b.Resources.Get(path)
	if errors.Is(err, fs.ErrNotExist) {
		l.Warnf("kbs: no resource %s", path)
		problem(w, http.StatusNotFound, "ResourceNotFound", "no resource "+path)
		return
	}
	if err != nil {
		problem(w, http.StatusInternalServerError, "InternalError", "resource "+path+" cannot be read")
		return
	}
	jwe, err := seal(key, data)
	if err != nil {
		problem(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	l.Infof("kbs: released %s", path)
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, jwe)
}

// seal encrypts data to key as a flattened JSON JWE.
func seal(key *jose.JSONWebKey, data []byte) (string, error) {
	alg := jose.KeyAlgorithm(key.Algorithm)
	if alg == "" {
		alg = jose.ECDH_ES_A256KW
		if _, ok := key.Key.(*rsa.PublicKey); ok {
			alg = jose.RSA_OAEP
		}
	}
	enc, err := jose.NewEncrypter(jose.A256GCM, jose.Recipient{Algorithm: alg, Key: key.Key}, nil)
	if err != nil {
		return "", fmt.Errorf("encrypt to the session key (%s): %w", alg, err)
	}
	obj, err := enc.Encrypt(data)
	if err != nil {
		return "", err
	}
	return obj.FullSerialize(), nil
}
