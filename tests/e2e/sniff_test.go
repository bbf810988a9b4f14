package e2e

import (
	"bytes"
	"encoding/binary"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sniffer reads every frame of the host's network namespace, as tcpdump
// on "any" would (an AF_PACKET socket bound to no interface: the bridge,
// the pods' veths and taps), and keeps the TCP payloads to or from one
// address and port: what the host, the adversary for snp and tdx pods,
// sees of that traffic.
type sniffer struct {
	fd       int
	ip       net.IP
	port     uint16
	stop     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	payloads []segment
}

// segment is one TCP payload seen.
type segment struct {
	src, dst net.IP
	sport    uint16
	dport    uint16
	data     []byte
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// startSniffer captures TCP payloads to or from ip:port until stopped.
func startSniffer(t *testing.T, ip net.IP, port uint16) *sniffer {
	t.Helper()
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Fatalf("AF_PACKET socket: %v", err)
	}
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	s := &sniffer{fd: fd, ip: ip.To4(), port: port, stop: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	t.Cleanup(s.close)
	return s
}

func (s *sniffer) run() {
	defer close(s.done)
	buf := make([]byte, 65536)
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		n, _, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil || n < 14 {
			continue
		}
		if seg, ok := s.parse(buf[:n]); ok {
			s.mu.Lock()
			s.payloads = append(s.payloads, seg)
			s.mu.Unlock()
		}
	}
}

// parse reads an Ethernet frame holding IPv4 TCP to or from s.ip:s.port.
func (s *sniffer) parse(f []byte) (segment, bool) {
	if binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
		return segment{}, false
	}
	ip := f[14:]
	if len(ip) < 20 || ip[0]>>4 != 4 || ip[9] != unix.IPPROTO_TCP {
		return segment{}, false
	}
	ihl := int(ip[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(ip[2:4]))
	if total > len(ip) || ihl < 20 || total < ihl+20 {
		return segment{}, false
	}
	src, dst := net.IP(append([]byte(nil), ip[12:16]...)), net.IP(append([]byte(nil), ip[16:20]...))
	tcp := ip[ihl:total]
	sport, dport := binary.BigEndian.Uint16(tcp[0:2]), binary.BigEndian.Uint16(tcp[2:4])
	if !(src.Equal(s.ip) && sport == s.port) && !(dst.Equal(s.ip) && dport == s.port) {
		return segment{}, false
	}
	off := int(tcp[12]>>4) * 4
	if off < 20 || off > len(tcp) || off == len(tcp) {
		return segment{}, false
	}
	return segment{src: src, dst: dst, sport: sport, dport: dport, data: append([]byte(nil), tcp[off:]...)}, true
}

func (s *sniffer) close() {
	select {
	case <-s.stop:
		return
	default:
	}
	close(s.stop)
	<-s.done
	unix.Close(s.fd)
}

// segments returns what was captured so far.
func (s *sniffer) segments() []segment {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]segment(nil), s.payloads...)
}

// contains reports whether the captured payloads hold b: one of them,
// or their concatenation in capture order (b split across segments).
func (s *sniffer) contains(b []byte) bool {
	var all []byte
	for _, seg := range s.segments() {
		if bytes.Contains(seg.data, b) {
			return true
		}
		all = append(all, seg.data...)
	}
	return bytes.Contains(all, b)
}
