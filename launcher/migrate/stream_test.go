package migrate

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/internal/golden"
	"github.com/c8s-dev/c8s/launcher/migrate/pooltest"
)

// recorder is a fake QMP that records commands and, at each object-add of
// TLS credentials, what QEMU would read in their directory.
type recorder struct {
	calls []qmpCall
	files map[string]os.FileMode // name -> mode, seen at object-add
	fail  string                 // command to fail
}

func (r *recorder) Execute(_ context.Context, cmd string, args any, _ any) error {
	a, _ := args.(map[string]any)
	r.calls = append(r.calls, qmpCall{Execute: cmd, Arguments: a})
	if cmd == r.fail {
		return errors.New("injected failure")
	}
	if cmd == "object-add" && a["qom-type"] == "tls-creds-x509" {
		r.files = map[string]os.FileMode{}
		dir := a["dir"].(string)
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			st, err := os.Stat(filepath.Join(dir, e.Name()))
			if err == nil {
				r.files[e.Name()] = st.Mode().Perm()
			}
		}
		if st, err := os.Stat(dir); err == nil {
			r.files["."] = st.Mode().Perm()
		}
	}
	return nil
}

// goldenCalls renders calls with stateDir replaced by $STATE.
func goldenCalls(t *testing.T, calls []qmpCall, stateDir string) []byte {
	t.Helper()
	b, err := json.MarshalIndent(calls, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(bytes.ReplaceAll(b, []byte(stateDir), []byte("$STATE")), '\n')
}

// The QMP commands that put each end of the stream under TLS, the files
// QEMU reads while object-add runs (and only then), and the reset after a
// rollback.
func TestStreamTLSCommands(t *testing.T) {
	ca, err := pooltest.NewCA("pool p1")
	if err != nil {
		t.Fatal(err)
	}
	identity := filepath.Join(t.TempDir(), "id")
	if _, err := ca.Issue(identity, "node-a"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, endpoint, hostname, authz string
		files                           []string
	}{
		{"source", endpointClient, "127.0.0.1", "", []string{"ca-cert.pem", "client-cert.pem", "client-key.pem"}},
		{"destination", endpointServer, "", "O=pool a,CN=node-a", []string{"ca-cert.pem", "server-cert.pem", "server-key.pem", "dh-params.pem"}},
		{"destination-unix-caller", endpointServer, "", "", []string{"ca-cert.pem", "server-cert.pem", "server-key.pem", "dh-params.pem"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := t.TempDir()
			q := &recorder{}
			if err := setupStreamTLS(context.Background(), q, state, identity, tc.endpoint, tc.hostname, tc.authz); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, "stream-"+tc.name+".json", goldenCalls(t, q.calls, state))
			want := map[string]os.FileMode{".": 0o700}
			for _, f := range tc.files {
				want[f] = 0o600
			}
			if len(q.files) != len(want) {
				t.Fatalf("QEMU's credentials directory held %v, want %v", q.files, want)
			}
			for f, m := range want {
				if q.files[f] != m {
					t.Fatalf("QEMU's credentials directory held %v, want %v", q.files, want)
				}
			}
			if _, err := os.Stat(filepath.Join(state, streamCredsDir)); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the credentials' copy is left after object-add: %v", err)
			}
		})
	}
	t.Run("reset", func(t *testing.T) {
		q := &recorder{}
		resetStreamTLS(context.Background(), q)
		golden.Check(t, "stream-reset.json", goldenCalls(t, q.calls, "/nonexistent"))
	})
	t.Run("a failed object-add leaves no copy", func(t *testing.T) {
		state := t.TempDir()
		q := &recorder{fail: "object-add"}
		if err := setupStreamTLS(context.Background(), q, state, identity, endpointClient, "h", ""); err == nil || !strings.Contains(err.Error(), "injected failure") {
			t.Fatalf("setupStreamTLS with object-add failing = %v", err)
		}
		if _, err := os.Stat(filepath.Join(state, streamCredsDir)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the credentials' copy is left after a failure: %v", err)
		}
	})
	t.Run("no identity", func(t *testing.T) {
		err := setupStreamTLS(context.Background(), &recorder{}, t.TempDir(), t.TempDir(), endpointClient, "h", "")
		if err == nil || !strings.Contains(err.Error(), "the node's identity") {
			t.Fatalf("setupStreamTLS without an identity = %v", err)
		}
	})
}

// The destination encrypts whenever it has an identity, and never sends
// plain TCP off loopback; the source accepts a plain stream only on
// loopback and only when allowed.
func TestStreamMode(t *testing.T) {
	for _, tc := range []struct {
		has, plain bool
		host       string
		tls        bool
		err        string
	}{
		{true, false, "127.0.0.1", true, ""},
		{true, true, "127.0.0.1", true, ""},
		{true, false, "10.0.0.2", true, ""},
		{false, true, "127.0.0.1", false, ""},
		{false, true, "::1", false, ""},
		{false, true, "localhost", false, ""},
		{false, false, "127.0.0.1", false, "migration.plain_loopback = true"},
		{false, true, "10.0.0.2", false, "refusing to receive a migration stream over plain TCP on 10.0.0.2"},
		{false, true, "0.0.0.0", false, "over plain TCP on 0.0.0.0"},
		{false, true, "node-b.example", false, "over plain TCP on node-b.example"},
	} {
		got, err := streamMode(tc.has, tc.plain, tc.host, "/run/c8s/node/migrate-tls")
		if got != tc.tls || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("streamMode(identity %v, plain_loopback %v, %s) = %v, %v; want %v, %q", tc.has, tc.plain, tc.host, got, err, tc.tls, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "/run/c8s/node/migrate-tls") {
			t.Errorf("streamMode's refusal does not name the identity directory: %v", err)
		}
	}
	for _, tc := range []struct {
		uri   string
		plain bool
		err   string
	}{
		{"tcp:127.0.0.1:4444", true, ""},
		{"tcp:[::1]:4444", true, ""},
		{"tcp:127.0.0.1:4444", false, "unless migration.plain_loopback = true"},
		{"tcp:10.1.2.3:4444", true, "off loopback: refused"},
		{"unix:/x", true, "migration URI"},
	} {
		err := checkPlainStream(tc.uri, "node-b", tc.plain)
		if (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("checkPlainStream(%s, %v) = %v; want %q", tc.uri, tc.plain, err, tc.err)
		}
	}
}

// The stream's authz identity is the distinguished name as QEMU 7.2's
// gnutls renders it: "O=pool a,OU=u\,1,CN=node-client" was read from
// QEMU's own denial ("TLS x509 authz check for ... is denied") for this
// subject; names it may render otherwise are refused.
func TestX509DN(t *testing.T) {
	subject := func(atvs ...pkix.AttributeTypeAndValue) *x509.Certificate {
		var seq pkix.RDNSequence
		for _, a := range atvs {
			seq = append(seq, pkix.RelativeDistinguishedNameSET{a})
		}
		raw, err := asn1.Marshal(seq)
		if err != nil {
			t.Fatal(err)
		}
		return &x509.Certificate{RawSubject: raw}
	}
	oid := func(s ...int) asn1.ObjectIdentifier { return asn1.ObjectIdentifier(s) }
	o, ou, cn := oid(2, 5, 4, 10), oid(2, 5, 4, 11), oid(2, 5, 4, 3)
	got, err := x509DN(subject(pkix.AttributeTypeAndValue{Type: o, Value: "pool a"}, pkix.AttributeTypeAndValue{Type: ou, Value: "u,1"}, pkix.AttributeTypeAndValue{Type: cn, Value: "node-client"}))
	if err != nil || got != `O=pool a,OU=u\,1,CN=node-client` {
		t.Fatalf("x509DN = %q, %v; want gnutls's O=pool a,OU=u\\,1,CN=node-client", got, err)
	}
	for name, c := range map[string]*x509.Certificate{
		"empty subject":    subject(),
		"domain component": subject(pkix.AttributeTypeAndValue{Type: oid(0, 9, 2342, 19200300, 100, 1, 25), Value: "example"}),
		"serial number":    subject(pkix.AttributeTypeAndValue{Type: oid(2, 5, 4, 5), Value: "42"}),
		"non-ASCII":        subject(pkix.AttributeTypeAndValue{Type: cn, Value: "nœud"}),
		"plus sign":        subject(pkix.AttributeTypeAndValue{Type: cn, Value: "a+b"}),
		"leading space":    subject(pkix.AttributeTypeAndValue{Type: cn, Value: " a"}),
	} {
		if dn, err := x509DN(c); err == nil {
			t.Errorf("x509DN of a subject with %s = %q, want a refusal", name, dn)
		}
	}
}

// The destination's dh-params.pem is RFC 7919's ffdhe2048: a 2048-bit
// prime whose top and bottom 64 bits are ones, generator 2.
func TestFFDHE2048(t *testing.T) {
	blk, rest := pem.Decode([]byte(ffdhe2048))
	if blk == nil || blk.Type != "DH PARAMETERS" || len(bytes.TrimSpace(rest)) != 0 {
		t.Fatalf("ffdhe2048 is not one PEM DH PARAMETERS block")
	}
	var params struct{ P, G *big.Int }
	if _, err := asn1.Unmarshal(blk.Bytes, &params); err != nil {
		t.Fatal(err)
	}
	ones := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 64), big.NewInt(1))
	if params.P.BitLen() != 2048 || params.G.Int64() != 2 || new(big.Int).Rsh(params.P, 2048-64).Cmp(ones) != 0 ||
		new(big.Int).And(params.P, ones).Cmp(ones) != 0 || !params.P.ProbablyPrime(20) {
		t.Fatalf("ffdhe2048: p has %d bits, g = %v", params.P.BitLen(), params.G)
	}
	// RFC 7919 A.1: p = 2^2048 - 2^1984 + {[2^1918 * e] + 560316} * 2^64 - 1;
	// its hex digits after the leading ones begin ADF85458A2BB4A9A.
	if h := params.P.Text(16); !strings.HasPrefix(h, strings.Repeat("f", 16)+"adf85458a2bb4a9a") {
		t.Fatalf("ffdhe2048: p = %s…", h[:32])
	}
}
