package migrate

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// QEMU's migration stream under TLS.
//
// Both QEMUs load the node's migration identity (TLSCertFile, TLSKeyFile,
// TLSCAFile: one certificate per pool member, signed by the pool's CA) as a
// tls-creds-x509 object with verify-peer=on, through QMP object-add at
// migration time: the destination as the server, the source as the client
// with tls-hostname set to the host of the URI it connects to. QEMU wants
// the files in a directory under fixed names (ca-cert.pem,
// server-cert.pem, server-key.pem, dh-params.pem / client-cert.pem,
// client-key.pem); they
// are written into the VM's state directory (0700, files 0600) and removed
// as soon as object-add has returned, which is when QEMU has read them.
//
// When the destination's API caller is a pool member (mutual TLS), the
// destination also binds the stream to it: an authz-simple object
// (tls-authz) admits only a client certificate with the caller's
// distinguished name, so no other member can push a VM state into the
// QEMU prepared for this one.
//
// Plain TCP is used only when both ends allow it (migration.plain_loopback)
// and the stream stays on loopback.

// QOM ids of the objects the migration adds to QEMU.
const (
	streamCredsID = "c8s-migration-tls"
	streamAuthzID = "c8s-migration-authz"
)

// streamCredsDir is the directory, in a VM's state directory, that holds
// QEMU's copy of the credentials while object-add loads them.
const streamCredsDir = "migration-tls"

// ffdhe2048 is RFC 7919's ffdhe2048 group (Appendix A.1) as PKCS #3
// "DH PARAMETERS", given to the destination QEMU as dh-params.pem: without
// the file QEMU 7.2 generates fresh DH parameters at object-add, which
// takes a quarter of a second or more per migration. TLS 1.3 (what gnutls
// negotiates here) uses ECDHE and RFC 7919 groups anyway.
const ffdhe2048 = `-----BEGIN DH PARAMETERS-----
MIIBCAKCAQEA//////////+t+FRYortKmq/cViAnPTzx2LnFg84tNpWp4TZBFGQz
+8yTnc4kmz75fS/jY2MMddj2gbICrsRhetPfHtXV/WVhJDP1H18GbtCFY2VVPe0a
87VXE15/V8k1mE8McODmi3fipona8+/och3xWKE2rec1MKzKT0g6eXq8CrGCsyT7
YdEIqUuyyOP7uWrat2DX9GgdT0Kj3jlN9K5W7edjcrsZCwenyO4KbXCeAvzhzffi
7MA0BM0oNC9hkXL+nOmFg/+OTxIy7vKBg8P+OxtMb61zO7X8vC7CIAXFjvGDfRaD
ssbzSibBsu/6iGtCOGEoXJf//////////wIBAg==
-----END DH PARAMETERS-----
`

// QEMU's tls-creds-x509 endpoints.
const (
	endpointServer = "server" // the destination
	endpointClient = "client" // the source
)

// qmpCall is one QMP command (what the golden files record).
type qmpCall struct {
	Execute   string         `json:"execute"`
	Arguments map[string]any `json:"arguments,omitempty"`
}

// executor runs QMP commands (*vm.QMP).
type executor interface {
	Execute(ctx context.Context, command string, args any, result any) error
}

// streamTLSCalls returns the commands that load the credentials in dir as
// endpoint and put the migration stream under them. hostname (source) is
// the name the destination's certificate must carry; authz (destination),
// when set, is the only client distinguished name admitted.
func streamTLSCalls(endpoint, dir, hostname, authz string) []qmpCall {
	calls := []qmpCall{{Execute: "object-add", Arguments: map[string]any{
		"qom-type": "tls-creds-x509", "id": streamCredsID, "dir": dir,
		"endpoint": endpoint, "verify-peer": true,
	}}}
	params := map[string]any{"tls-creds": streamCredsID}
	if authz != "" {
		calls = append(calls, qmpCall{Execute: "object-add", Arguments: map[string]any{
			"qom-type": "authz-simple", "id": streamAuthzID, "identity": authz,
		}})
		params["tls-authz"] = streamAuthzID
	}
	if hostname != "" {
		params["tls-hostname"] = hostname
	}
	return append(calls, qmpCall{Execute: "migrate-set-parameters", Arguments: params})
}

// streamResetCalls undo streamTLSCalls (an earlier attempt's, on a source
// that was rolled back); object-del of an absent object fails harmlessly.
func streamResetCalls() []qmpCall {
	return []qmpCall{
		{Execute: "migrate-set-parameters", Arguments: map[string]any{"tls-creds": "", "tls-hostname": "", "tls-authz": ""}},
		{Execute: "object-del", Arguments: map[string]any{"id": streamAuthzID}},
		{Execute: "object-del", Arguments: map[string]any{"id": streamCredsID}},
	}
}

// setupStreamTLS copies the identity in identityDir for endpoint into
// stateDir, has QEMU load it (streamTLSCalls) and removes the copy.
func setupStreamTLS(ctx context.Context, q executor, stateDir, identityDir, endpoint, hostname, authz string) error {
	return runStreamTLS(ctx, q, stateDir, identityDir, streamTLSCalls(endpoint, streamCredsPath(stateDir), hostname, authz), endpoint)
}

// loadSourceCreds is the first part of the source's setupStreamTLS: QEMU
// loads the node's credentials, which no stream uses yet. Run calls it
// while the destination starts; useSourceCreds then puts the stream under
// them (resetStreamTLS removes them).
func loadSourceCreds(ctx context.Context, q executor, stateDir, identityDir string) error {
	calls := streamTLSCalls(endpointClient, streamCredsPath(stateDir), "", "")
	return runStreamTLS(ctx, q, stateDir, identityDir, calls[:len(calls)-1], endpointClient)
}

// useSourceCreds is the rest of the source's setupStreamTLS, once
// loadSourceCreds has loaded the credentials.
func useSourceCreds(ctx context.Context, q executor, hostname string) error {
	calls := streamTLSCalls(endpointClient, "", hostname, "")
	c := calls[len(calls)-1]
	if err := q.Execute(ctx, c.Execute, c.Arguments, nil); err != nil {
		return fmt.Errorf("migration stream TLS: %s: %w", c.Execute, err)
	}
	return nil
}

func streamCredsPath(stateDir string) string { return filepath.Join(stateDir, streamCredsDir) }

// runStreamTLS writes the credentials' copy for calls, runs them and
// removes the copy.
func runStreamTLS(ctx context.Context, q executor, stateDir, identityDir string, calls []qmpCall, endpoint string) error {
	dir := streamCredsPath(stateDir)
	if err := writeStreamCreds(dir, identityDir, endpoint); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, c := range calls {
		if err := q.Execute(ctx, c.Execute, c.Arguments, nil); err != nil {
			return fmt.Errorf("migration stream TLS: %s %s: %w", c.Execute, c.Arguments["qom-type"], err)
		}
	}
	return nil
}

// resetStreamTLS removes what setupStreamTLS added, if anything.
func resetStreamTLS(ctx context.Context, q executor) {
	for _, c := range streamResetCalls() {
		_ = q.Execute(ctx, c.Execute, c.Arguments, nil)
	}
}

// writeStreamCreds writes QEMU's file names for endpoint into dir (0700,
// files 0600) from the node identity in identityDir.
func writeStreamCreds(dir, identityDir, endpoint string) error {
	files := map[string]string{
		"ca-cert.pem":          TLSCAFile,
		endpoint + "-cert.pem": TLSCertFile,
		endpoint + "-key.pem":  TLSKeyFile,
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if endpoint == endpointServer {
		if err := os.WriteFile(filepath.Join(dir, "dh-params.pem"), []byte(ffdhe2048), 0o600); err != nil {
			os.RemoveAll(dir)
			return err
		}
	}
	for dst, src := range files {
		b, err := os.ReadFile(filepath.Join(identityDir, src))
		if err != nil {
			os.RemoveAll(dir)
			return fmt.Errorf("migration stream TLS: the node's identity: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, dst), b, 0o600); err != nil {
			os.RemoveAll(dir)
			return err
		}
	}
	return nil
}

// HasTLSIdentity reports whether dir holds a node's migration TLS identity
// (its certificate file; LoadTLS checks the rest).
func HasTLSIdentity(dir string) (bool, error) {
	_, err := os.Stat(filepath.Join(dir, TLSCertFile))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, err
}

// isLoopback reports whether host (an IP literal or "localhost") stays on
// this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// streamMode decides, on the destination, whether the incoming stream uses
// TLS: always with an identity; without one only on loopback and only when
// plain_loopback allows it. identityDir names the identity in errors.
func streamMode(hasIdentity, plainLoopback bool, host, identityDir string) (useTLS bool, err error) {
	switch {
	case hasIdentity:
		return true, nil
	case !isLoopback(host):
		return false, fmt.Errorf("refusing to receive a migration stream over plain TCP on %s: it would cross the network unencrypted; install the node's migration TLS identity (%s, %s, %s signed by the trust pool's CA) in %s",
			host, TLSCertFile, TLSKeyFile, TLSCAFile, identityDir)
	case !plainLoopback:
		return false, fmt.Errorf("node has no migration TLS identity in %s (%s, %s, %s signed by the trust pool's CA): the migration stream is encrypted with it, also on loopback; set migration.plain_loopback = true to allow plain TCP on loopback (tests only)",
			identityDir, TLSCertFile, TLSKeyFile, TLSCAFile)
	}
	return false, nil
}

// checkPlainStream decides, on the source, whether a destination that
// offers a plain stream at uri may have it.
func checkPlainStream(uri, node string, plainLoopback bool) error {
	host, err := uriHost(uri)
	if err != nil {
		return fmt.Errorf("node %s: %w", node, err)
	}
	if !isLoopback(host) {
		return fmt.Errorf("node %s offers a plain-TCP migration stream at %s, off loopback: refused, the stream must use TLS (install the node's migration TLS identity on %s)", node, uri, node)
	}
	if !plainLoopback {
		return fmt.Errorf("node %s offers a plain-TCP migration stream at %s: refused; the stream uses TLS unless migration.plain_loopback = true on both nodes (tests only)", node, uri)
	}
	return nil
}

// uriHost is the host of a "tcp:HOST:PORT" URI.
func uriHost(uri string) (string, error) {
	host, _, err := net.SplitHostPort(strings.TrimPrefix(uri, "tcp:"))
	if err != nil || !strings.HasPrefix(uri, "tcp:") {
		return "", fmt.Errorf("migration URI %q: want tcp:HOST:PORT", uri)
	}
	return host, nil
}

// x509DN returns the distinguished name QEMU's TLS layer (gnutls) gives
// cert's subject and matches against an authz-simple identity: the RDNs in
// certificate order, comma separated, with RFC 4514 escapes. It refuses
// subjects whose rendering by gnutls and Go could differ (attribute types
// other than C, ST, L, O, OU, CN; characters beyond a conservative set):
// such a name would fail closed inside QEMU with a less clear error.
func x509DN(cert *x509.Certificate) (string, error) {
	var seq pkix.RDNSequence
	if rest, err := asn1.Unmarshal(cert.RawSubject, &seq); err != nil || len(rest) != 0 {
		return "", fmt.Errorf("the certificate's subject cannot be parsed: %v", err)
	}
	if len(seq) == 0 {
		return "", errors.New("the certificate has an empty subject: the migration stream binds to the peer's distinguished name; issue pool certificates with a subject (CN=<node>)")
	}
	known := map[string]bool{"2.5.4.6": true, "2.5.4.8": true, "2.5.4.7": true, "2.5.4.10": true, "2.5.4.11": true, "2.5.4.3": true}
	for _, rdn := range seq {
		for _, atv := range rdn {
			s, ok := atv.Value.(string)
			if !known[atv.Type.String()] || !ok || !dnSafe(s) {
				return "", fmt.Errorf("the certificate's subject %q has an attribute (%s) whose rendering QEMU's authz may not match: issue pool certificates whose subjects use only C, ST, L, O, OU and CN with letters, digits, spaces and -._:@/,", cert.Subject, atv.Type)
			}
		}
	}
	// RDNSequence.String prints the last RDN first (RFC 4514); gnutls
	// prints them in certificate order.
	rev := slices.Clone(seq)
	slices.Reverse(rev)
	return rev.String(), nil
}

// dnSafe accepts attribute values both renderings agree on.
func dnSafe(s string) bool {
	if s == "" || s[0] == ' ' || s[len(s)-1] == ' ' {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case strings.ContainsRune(" -._:@/,", r):
		default:
			return false
		}
	}
	return true
}
