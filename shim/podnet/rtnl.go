package podnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// The few rtnetlink requests podnet makes, spoken over a NETLINK_ROUTE
// socket with golang.org/x/sys/unix. Every pod's shim links podnet, and a
// general netlink library is most of a megabyte of the shim's binary and
// resident memory (issue 18); these are the messages of
// rtnetlink(7), tc's ingress qdisc and the u32 classifier with a mirred
// action (linux/pkt_cls.h, linux/tc_act/tc_mirred.h).

// tc attributes and values x/sys/unix does not name.
const (
	tcaU32Sel      = 5 // TCA_U32_SEL
	tcaU32Act      = 7 // TCA_U32_ACT
	tcaActKind     = 1 // TCA_ACT_KIND
	tcaActOptions  = 2 // TCA_ACT_OPTIONS
	tcaMirredParms = 2 // TCA_MIRRED_PARMS

	tcHIngress     = 0xfffffff1 // TC_H_INGRESS: the ingress qdisc's parent
	ingressHandle  = 0xffff0000 // ffff: the ingress qdisc's handle
	tcActStolen    = 4          // TC_ACT_STOLEN
	tcaEgressRedir = 1          // TCA_EGRESS_REDIR
	tcU32Terminal  = 1          // TC_U32_TERMINAL

	sizeofTcMsg = 20 // struct tcmsg
)

// rtnl is a NETLINK_ROUTE socket of the network namespace the calling
// thread was in when it was opened.
type rtnl struct {
	fd  int
	seq uint32
}

func openRTNL() (*rtnl, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open a netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind a netlink socket: %w", err)
	}
	return &rtnl{fd: fd}, nil
}

func (c *rtnl) Close() error { return unix.Close(c.fd) }

// attr appends the netlink attribute typ with data to b, padded to 4.
func attr(b []byte, typ uint16, data []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(unix.SizeofRtAttr+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// cstring is s NUL-terminated, as the kernel wants names and kinds.
func cstring(s string) []byte { return append([]byte(s), 0) }

// do sends one request (body after the netlink header) and returns the
// payloads of its answers: every message of a dump (NLM_F_DUMP), none
// for an acknowledged change. An error answer is its errno.
func (c *rtnl) do(typ, flags uint16, body []byte) ([][]byte, error) {
	c.seq++
	msg := binary.NativeEndian.AppendUint32(nil, uint32(unix.SizeofNlMsghdr+len(body)))
	msg = binary.NativeEndian.AppendUint16(msg, typ)
	msg = binary.NativeEndian.AppendUint16(msg, flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	msg = binary.NativeEndian.AppendUint32(msg, c.seq)
	msg = binary.NativeEndian.AppendUint32(msg, 0)
	msg = append(msg, body...)
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, err
	}
	var out [][]byte
	for {
		// A new buffer each time: the answers returned point into it.
		buf := make([]byte, 32<<10)
		n, _, err := unix.Recvfrom(c.fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		msgs, err := parseMessages(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.seq != c.seq {
				continue
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.data) < 4 {
					return nil, errors.New("short netlink error answer")
				}
				if e := int32(binary.NativeEndian.Uint32(m.data)); e != 0 {
					return nil, unix.Errno(-e)
				}
				return out, nil // the acknowledgement
			default:
				out = append(out, m.data)
			}
		}
	}
}

// message is one netlink message of an answer.
type message struct {
	typ  uint16
	seq  uint32
	data []byte
}

// parseMessages splits b, one datagram of answers, into its messages.
func parseMessages(b []byte) ([]message, error) {
	var out []message
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b))
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return nil, fmt.Errorf("netlink answer with a bad length %d", l)
		}
		out = append(out, message{
			typ:  binary.NativeEndian.Uint16(b[4:]),
			seq:  binary.NativeEndian.Uint32(b[8:]),
			data: b[unix.SizeofNlMsghdr:l],
		})
		b = b[min((l+3)&^3, len(b)):]
	}
	return out, nil
}

// dump runs an NLM_F_DUMP request.
func (c *rtnl) dump(typ uint16, body []byte) ([][]byte, error) {
	return c.do(typ, unix.NLM_F_DUMP, body)
}

// attrs parses the netlink attributes in b, by type (the last wins).
func attrs(b []byte) map[uint16][]byte {
	m := map[uint16][]byte{}
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofRtAttr || l > len(b) {
			break
		}
		m[binary.NativeEndian.Uint16(b[2:])&^unix.NLA_F_NESTED] = b[unix.SizeofRtAttr:l]
		b = b[min((l+3)&^3, len(b)):]
	}
	return m
}

func cstr(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// link is a network interface.
type link struct {
	Index int
	Name  string
	MAC   net.HardwareAddr
	MTU   int
	// Kind is the IFLA_INFO_KIND ("veth", "tun", …; "" for none).
	Kind string
}

func ifinfomsg(index int, flags, change uint32) []byte {
	b := []byte{unix.AF_UNSPEC, 0, 0, 0}
	b = binary.NativeEndian.AppendUint32(b, uint32(int32(index)))
	b = binary.NativeEndian.AppendUint32(b, flags)
	return binary.NativeEndian.AppendUint32(b, change)
}

// links lists the namespace's interfaces.
func (c *rtnl) links() ([]link, error) {
	msgs, err := c.dump(unix.RTM_GETLINK, ifinfomsg(0, 0, 0))
	if err != nil {
		return nil, err
	}
	var out []link
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		a := attrs(m[unix.SizeofIfInfomsg:])
		l := link{Index: int(int32(binary.NativeEndian.Uint32(m[4:]))), Name: cstr(a[unix.IFLA_IFNAME])}
		if mac := a[unix.IFLA_ADDRESS]; len(mac) > 0 {
			l.MAC = net.HardwareAddr(append([]byte(nil), mac...))
		}
		if mtu := a[unix.IFLA_MTU]; len(mtu) == 4 {
			l.MTU = int(binary.NativeEndian.Uint32(mtu))
		}
		if info, ok := a[unix.IFLA_LINKINFO]; ok {
			l.Kind = cstr(attrs(info)[unix.IFLA_INFO_KIND])
		}
		out = append(out, l)
	}
	return out, nil
}

// linkByName finds the interface name; a missing one is unix.ENODEV.
func (c *rtnl) linkByName(name string) (link, error) {
	ls, err := c.links()
	if err != nil {
		return link{}, err
	}
	for _, l := range ls {
		if l.Name == name {
			return l, nil
		}
	}
	return link{}, fmt.Errorf("interface %s: %w", name, unix.ENODEV)
}

// setMTUUp sets the MTU of interface index and brings it up.
func (c *rtnl) setMTUUp(index, mtu int) error {
	body := ifinfomsg(index, unix.IFF_UP, unix.IFF_UP)
	body = attr(body, unix.IFLA_MTU, binary.NativeEndian.AppendUint32(nil, uint32(mtu)))
	_, err := c.do(unix.RTM_NEWLINK, 0, body)
	return err
}

// delLink deletes interface index.
func (c *rtnl) delLink(index int) error {
	_, err := c.do(unix.RTM_DELLINK, 0, ifinfomsg(index, 0, 0))
	return err
}

// addr is an interface address with its scope.
type addr struct {
	*net.IPNet
	Scope uint8
}

// addrs lists the IPv4 and IPv6 addresses of interface index.
func (c *rtnl) addrs(index int) ([]addr, error) {
	msgs, err := c.dump(unix.RTM_GETADDR, make([]byte, unix.SizeofIfAddrmsg))
	if err != nil {
		return nil, err
	}
	var out []addr
	for _, m := range msgs {
		if len(m) < unix.SizeofIfAddrmsg || int(binary.NativeEndian.Uint32(m[4:])) != index {
			continue
		}
		a := attrs(m[unix.SizeofIfAddrmsg:])
		// IFA_LOCAL is the address itself; IFA_ADDRESS is the peer's on
		// a point-to-point interface, the address itself otherwise.
		ip := a[unix.IFA_LOCAL]
		if ip == nil {
			ip = a[unix.IFA_ADDRESS]
		}
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			continue
		}
		ip = append([]byte(nil), ip...)
		out = append(out, addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(int(m[1]), 8*len(ip))}, Scope: m[3]})
	}
	return out, nil
}

// route is a route of the main table or another.
type route struct {
	Family, Type, Scope uint8
	Table               uint32
	OIF                 int
	// Dst is nil for a default route.
	Dst     *net.IPNet
	Gw, Src net.IP
}

// routes lists the IPv4 and IPv6 routes of every table.
func (c *rtnl) routes() ([]route, error) {
	msgs, err := c.dump(unix.RTM_GETROUTE, make([]byte, unix.SizeofRtMsg))
	if err != nil {
		return nil, err
	}
	var out []route
	for _, m := range msgs {
		if len(m) < unix.SizeofRtMsg {
			continue
		}
		r := route{Family: m[0], Table: uint32(m[4]), Scope: m[6], Type: m[7]}
		a := attrs(m[unix.SizeofRtMsg:])
		if t := a[unix.RTA_TABLE]; len(t) == 4 {
			r.Table = binary.NativeEndian.Uint32(t)
		}
		if o := a[unix.RTA_OIF]; len(o) == 4 {
			r.OIF = int(binary.NativeEndian.Uint32(o))
		}
		ip := func(b []byte) net.IP {
			if len(b) != net.IPv4len && len(b) != net.IPv6len {
				return nil
			}
			return append(net.IP(nil), b...)
		}
		if d := ip(a[unix.RTA_DST]); d != nil {
			r.Dst = &net.IPNet{IP: d, Mask: net.CIDRMask(int(m[1]), 8*len(d))}
		}
		r.Gw, r.Src = ip(a[unix.RTA_GATEWAY]), ip(a[unix.RTA_PREFSRC])
		out = append(out, r)
	}
	return out, nil
}

// tcmsg is a struct tcmsg for interface index.
func tcmsg(index int, handle, parent, info uint32) []byte {
	b := make([]byte, 4, sizeofTcMsg)
	b = binary.NativeEndian.AppendUint32(b, uint32(int32(index)))
	b = binary.NativeEndian.AppendUint32(b, handle)
	b = binary.NativeEndian.AppendUint32(b, parent)
	return binary.NativeEndian.AppendUint32(b, info)
}

// addIngress adds the ingress qdisc (ffff:) to interface index.
func (c *rtnl) addIngress(index int) error {
	body := attr(tcmsg(index, ingressHandle, tcHIngress, 0), unix.TCA_KIND, cstring("ingress"))
	_, err := c.do(unix.RTM_NEWQDISC, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body)
	return err
}

// delIngress removes the ingress qdisc of interface index, and its
// filters with it.
func (c *rtnl) delIngress(index int) error {
	body := attr(tcmsg(index, ingressHandle, tcHIngress, 0), unix.TCA_KIND, cstring("ingress"))
	_, err := c.do(unix.RTM_DELQDISC, 0, body)
	return err
}

// addRedirect adds to the ingress qdisc of interface from a u32 filter
// (priority 1, every protocol) that matches every frame, with a mirred
// action that sends it out of interface to and steals it.
func (c *rtnl) addRedirect(from, to int) error {
	// struct tc_u32_sel with one key whose mask is 0: it matches
	// everything; TC_U32_TERMINAL ends the classification there.
	sel := make([]byte, 16+16)
	sel[0], sel[2] = tcU32Terminal, 1
	// struct tc_mirred: tc_gen (index, capab, action, refcnt, bindcnt),
	// eaction, ifindex.
	parms := make([]byte, 8)
	parms = binary.NativeEndian.AppendUint32(parms, tcActStolen)
	parms = append(parms, make([]byte, 8)...)
	parms = binary.NativeEndian.AppendUint32(parms, tcaEgressRedir)
	parms = binary.NativeEndian.AppendUint32(parms, uint32(to))
	act := attr(nil, tcaActKind, cstring("mirred"))
	act = attr(act, tcaActOptions, attr(nil, tcaMirredParms, parms))
	opts := attr(nil, tcaU32Sel, sel)
	opts = attr(opts, tcaU32Act, attr(nil, 1, act))
	// tcm_info: the priority above the protocol (network byte order).
	info := uint32(1)<<16 | uint32(htons(unix.ETH_P_ALL))
	body := tcmsg(from, 0, ingressHandle, info)
	body = attr(body, unix.TCA_KIND, cstring("u32"))
	body = attr(body, unix.TCA_OPTIONS, opts)
	_, err := c.do(unix.RTM_NEWTFILTER, unix.NLM_F_CREATE|unix.NLM_F_EXCL, body)
	return err
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// createTap creates the persistent single-queue tap name (no packet
// information header, virtio-net headers on) and returns its open queue,
// non-blocking and in the runtime's poller (os.NewFile of a non-blocking
// descriptor; a tun descriptor polls only once attached to its tap).
func createTap(name string) (*os.File, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF: %w", err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETPERSIST: %w", err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun"), nil
}
