package mesh

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// ip6tSOOriginalDst is IP6T_SO_ORIGINAL_DST (linux/netfilter_ipv6/
// ip6_tables.h), which x/sys/unix does not define.
const ip6tSOOriginalDst = 80

// OriginalDst is the destination a redirected connection was opened to,
// before the redirect (SO_ORIGINAL_DST, or IP6T_SO_ORIGINAL_DST for IPv6),
// from the kernel's connection tracking. A connection that was not
// redirected gives its own local address.
func OriginalDst(c net.Conn) (netip.AddrPort, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("mesh: original destination of a %T: not a TCP connection", c)
	}
	local := tc.LocalAddr().(*net.TCPAddr).AddrPort()
	raw, err := tc.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var dst netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		if local.Addr().Unmap().Is4() {
			// struct sockaddr_in: family, port (big endian), address.
			var m *unix.IPv6Mreq
			if m, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST); serr == nil {
				b := m.Multiaddr
				dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
			}
			return
		}
		var info *unix.IPv6MTUInfo
		if info, serr = unix.GetsockoptIPv6MTUInfo(int(fd), unix.SOL_IPV6, ip6tSOOriginalDst); serr == nil {
			// sin6_port holds the port's bytes in network order.
			var port [2]byte
			binary.NativeEndian.PutUint16(port[:], info.Addr.Port)
			dst = netip.AddrPortFrom(netip.AddrFrom16(info.Addr.Addr), binary.BigEndian.Uint16(port[:]))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("mesh: original destination of the connection from %s: %w", c.RemoteAddr(), err)
	}
	return dst, nil
}

// MarkControl sets Mark on a socket before it connects (a
// net.Dialer's Control): the agent's own connection, which the pod's
// mesh rules let pass untouched.
func MarkControl(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(Mark))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("mesh: mark the agent's socket (SO_MARK, needs CAP_NET_ADMIN): %w", serr)
	}
	return nil
}

// Dialer is the dialer of the agent's connections in the pod's network
// namespace: they carry Mark, which the outbound redirect passes.
func Dialer() *net.Dialer { return &net.Dialer{Control: MarkControl} }

// DialMarked dials addr with Dialer.
func DialMarked(ctx context.Context, network, addr string) (net.Conn, error) {
	return Dialer().DialContext(ctx, network, addr)
}

// errNotRedirected refuses a connection that reached a proxy listener
// directly rather than through a redirect.
var errNotRedirected = errors.New("the connection reached the proxy's listener directly, not through the pod's redirect")
