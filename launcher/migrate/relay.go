package migrate

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// The TLS relay. Every pod's shim links this package (a pod may be
// moved), but it does not load the node's migration key nor link
// crypto/tls's handshake (about 1.1 MB of its binary and 0.44 MB of its
// resident memory, issue 18): a tls://HOST:PORT destination is reached through the node's
// own server (`c8s-launcher serve` on statedir.MigrateSocket), which holds
// the node's identity. The client asks it with
//
//	POST /v1/relay?to=HOST:PORT  Upgrade: c8s-tls-relay
//
// on the unix socket; the server dials HOST:PORT with mutual TLS (TLS 1.3,
// the destination verified against the pool CA, the node's certificate
// presented), and only once the handshake succeeded answers 101 and
// relays the connection's bytes. The relay is served on the unix socket
// only (0600: root on this node), never to pool members on the TLS
// listener, so no peer can borrow this node's identity; and it only ever
// dials mutual TLS, so plain TCP between nodes stays refused.

// relayUpgrade is the protocol name of the TLS relay.
const relayUpgrade = "c8s-tls-relay"

// relayClient returns a client for the Server on tls://addr reached
// through the relay of the node's server on socket.
func relayClient(socket, addr string) (*Client, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("migrate: destination %q: want HOST:PORT: %w", addr, err)
	}
	return newClient("tls://"+addr, func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		conn, err := d.DialContext(ctx, "unix", socket)
		if err != nil {
			return nil, fmt.Errorf("the node's TLS relay: %w (tls:// destinations are reached through `c8s-launcher serve` on this node, which holds its migration identity: is it running?)", err)
		}
		return upgrade(ctx, conn, "/v1/relay?to="+url.QueryEscape(addr), relayUpgrade)
	}), nil
}

// dialTLS dials addr with mutual TLS with the node's identity in dir.
func dialTLS(ctx context.Context, dir, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("want HOST:PORT: %w", err)
	}
	_, cfg, err := LoadTLS(dir)
	if err != nil {
		return nil, err
	}
	cfg.ServerName = host
	d := tls.Dialer{Config: cfg}
	return d.DialContext(ctx, "tcp", addr)
}

func (s *Server) handleRelay(w http.ResponseWriter, r *http.Request) {
	if la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr); r.TLS != nil || la == nil || la.Network() != "unix" {
		writeError(w, http.StatusForbidden, errors.New("the TLS relay serves this node's own callers on its unix socket only"))
		return
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), relayUpgrade) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("the TLS relay needs Upgrade: %s", relayUpgrade))
		return
	}
	to := r.URL.Query().Get("to")
	dst, err := dialTLS(r.Context(), statedir.MigrateTLS(s.Config.Runtime.StateDir), to)
	if err != nil {
		writeError(w, http.StatusBadGateway, fmt.Errorf("relay to %s: %w", to, err))
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		dst.Close()
		writeError(w, http.StatusInternalServerError, errors.New("the connection cannot be taken over"))
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		dst.Close()
		return
	}
	if _, err := rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + relayUpgrade + "\r\n\r\n"); err != nil || rw.Flush() != nil {
		conn.Close()
		dst.Close()
		return
	}
	log.G(r.Context()).WithField("to", to).Debug("migrate: relaying to a pool member with mutual TLS")
	go splice(conn, rw.Reader, dst, nil)
}
