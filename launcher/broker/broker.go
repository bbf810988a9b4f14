// Package broker is a key broker (KBS) that speaks the Confidential Containers KBS
// protocol (guest/api/kbs) as Trustee's KBS does, for tests and
// single-node setups, as the workload owner's relying party: it hands out
// a challenge per session, verifies the pod's evidence with launcher/attest
// against the owner's launch reference values (References: the image
// manifest the owner ships, never the node's), the HOST_DATA of the pod's
// init data, the minimum TCB, debug forbidden, and releases a resource
// only to a session whose evidence passed, encrypted to the ephemeral key
// that evidence bound. Each challenge can be answered once: a replayed
// attestation, or one for another session's nonce, is refused.
//
// The host launches the pod, so it chooses the init data the evidence
// shows. The broker therefore accepts only init data the owner pinned
// (Broker.InitData, the ResourcePolicy's workloads, or the HOST_DATA /
// MRCONFIGID of its Policy), and releases secrets only to init data under
// which the host cannot run code of its choosing in the pod: an enforced
// [policy] section whose rules bind every container to the owner's image
// (initdata.InitData.HostCanRunCode), unless the owner accepts the
// node's root file systems (AllowHostRootfsPods, a workload's
// allow_host_rootfs).
//
// A resource goes to an attested session only if two checks pass: the
// pod's own measured init data names it in [[kbs.secrets]] (NamedSecret),
// and, when the owner gave one, a rule of the owner's ResourcePolicy names
// a workload the session attested as (ResourcePolicy.Allow). A refusal is
// 403 PolicyDeny naming the resource, the rule and the field that failed.
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
	// With References, its Measurements, MRTD and RTMRs are replaced by
	// each reference set's in turn.
	Policy attest.Policy
	// References are the owner's launch reference values: evidence must
	// match one set for its TEE (the verifier's mode for SNP-format
	// evidence: snp or sim). Empty: Policy's own launch values.
	References []Reference
	// ResourcePolicy, when set, says which attested workloads may read
	// which resource (default deny); its workloads' init data digests are
	// pinned as InitData's are.
	ResourcePolicy *ResourcePolicy
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
	// AllowHostRootfsPods also releases resources to pods whose enforced
	// [policy] has rules that do not bind their container's file system
	// to the owner's image (no pinned layers: the node supplies the root,
	// and its binaries run under the owner's argv;
	// initdata.InitData.HostRootfsRules), for every pinned document. The
	// owner's informed choice: it trusts the node with those images'
	// files. A workload's allow_host_rootfs (ResourcePolicy) is the
	// narrower form, for its own documents only. Every other way the
	// host could run code (no [policy], audit mode, the rule shapes
	// HostCanRunCode names) is still refused.
	AllowHostRootfsPods bool
	// Resources are released to attested sessions.
	Resources Resources
	// GPUVerifier verifies the GPU evidence pods send as additional
	// evidence (gpu.go); nil: LocalGPUVerifier.
	GPUVerifier GPUVerifier
	// SessionTTL bounds a session's life (default 5 minutes).
	SessionTTL time.Duration

	mu       sync.Mutex
	sessions *challenges[*session]
}

type session struct {
	nonce    string
	tee      string
	hashAlg  string
	expires  time.Time
	answered bool             // the challenge was answered (once only)
	key      *jose.JSONWebKey // set once attested
	attested *Attested        // what the evidence showed, set with key
}

// maxSessions bounds the session table, and maxSessionsPerSource the
// sessions one client address holds before its attestation (challenges).
const (
	maxSessions          = 1024
	maxSessionsPerSource = 128
)

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
		b.sessions = newChallenges[*session](maxSessions, maxSessionsPerSource)
	}
	ok := b.sessions.add(time.Now(), id, source(r), s.expires, s)
	b.mu.Unlock()
	if !ok {
		problem(w, http.StatusServiceUnavailable, "InternalError", fmt.Sprintf("the broker holds %d attested sessions: try again once some expire", maxSessions))
		return
	}
	http.SetCookie(w, &http.Cookie{Name: kbsapi.CookieName, Value: id, Path: kbsapi.Prefix, Expires: s.expires, HttpOnly: true, Secure: true})
	// As Trustee's KBS with its built-in attestation service: extra-params
	// is an empty string and the runtime data is hashed with sha384.
	reply(w, kbsapi.Challenge{Nonce: nonce, ExtraParams: json.RawMessage(`""`)})
}

// lookup returns the request's session, or nil.
func (b *Broker) lookup(r *http.Request) (string, *session) {
	c, err := r.Cookie(kbsapi.CookieName)
	if err != nil {
		return "", nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sessions == nil {
		return "", nil
	}
	s, ok := b.sessions.get(time.Now(), c.Value)
	if !ok {
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
	key, a, err := b.verify(r, s)
	if err != nil {
		l.WithError(err).Warn("kbs: attestation refused")
		problem(w, http.StatusUnauthorized, "AttestationFailed", err.Error())
		return
	}
	b.mu.Lock()
	s.key, s.attested = key, a
	b.sessions.prove(id)
	b.mu.Unlock()
	l.WithField("tee", a.TEE).WithField("reference", a.Reference).WithField("init_data", a.InitDataDigest.String()).Info("kbs: attested")
	tok, err := random(32)
	if err != nil {
		problem(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	reply(w, kbsapi.AttestResponse{Token: tok})
}

func (b *Broker) resource(w http.ResponseWriter, r *http.Request, path string) {
	id, s := b.lookup(r)
	if s == nil {
		problem(w, http.StatusUnauthorized, "InvalidCookie", "no attested session: attest first")
		return
	}
	b.mu.Lock()
	key, a := s.key, s.attested
	b.mu.Unlock()
	if key == nil {
		problem(w, http.StatusUnauthorized, "UnAuthenticatedCookie", "the session has not attested")
		return
	}
	l := log.G(r.Context()).WithField("session", id[:8])
	if !validResourcePath(path) {
		problem(w, http.StatusNotFound, "ResourceNotFound", fmt.Sprintf("no resource %q: want REPO/TYPE/TAG", path))
		return
	}
	// The checks come before the resource is looked up: a refused
	// session learns nothing of which resources exist.
	if err := b.authorize(path, a); err != nil {
		l.WithError(err).Warnf("kbs: refused %s", path)
		problem(w, http.StatusForbidden, "PolicyDeny", err.Error())
		return
	}
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

// authorize applies both checks to a resource request: the pod's own
// measured document names it (NamedSecret), and the owner's resource
// policy, if any, gives it to the workload the session attested as.
func (b *Broker) authorize(path string, a *Attested) error {
	if err := NamedSecret(path, a); err != nil {
		return err
	}
	if b.ResourcePolicy != nil {
		return b.ResourcePolicy.Allow(path, a)
	}
	return nil
}

// validResourcePath reports whether path is REPO/TYPE/TAG with plain
// segments.
func validResourcePath(path string) bool {
	segs := strings.Split(path, "/")
	if len(segs) != 3 || !fs.ValidPath(path) {
		return false
	}
	for _, s := range segs {
		if s == "" || s == "." || s == ".." || strings.Contains(s, "*") {
			return false
		}
	}
	return true
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
