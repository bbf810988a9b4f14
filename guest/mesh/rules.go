package mesh

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Mark is the socket mark (SO_MARK) of every connection the agent opens in
// the pod's network namespace: the proxy's own connections to peers and
// to the workload, and the certificate requests to the mesh CA. The
// outbound redirect passes marked connections untouched, which is what
// keeps the proxy from intercepting itself. Setting a mark needs
// CAP_NET_ADMIN in the pod's namespace, which a container has only if the
// measured policy grants it.
const Mark uint32 = 0x63386d65 // "c8me"

// TableName is the nftables table (family inet) that holds the pod's
// redirects.
const TableName = "c8s-mesh"

// Redirect is the pod's interception, built from the measured init data
// and the proxy's listeners: which TCP connections go to which listener.
type Redirect struct {
	// Inbound are the meshed pod ports: TCP to them arriving on any
	// interface but loopback goes to the inbound listener.
	Inbound []uint16
	// Outbound are the meshed destinations: TCP the pod opens to them
	// (to any address but its own) goes to the outbound listener.
	Outbound []OutboundMatch
	// Listeners are the proxy's ports, per family.
	Listeners Listeners
	// Mark exempts the agent's own connections (Mark).
	Mark uint32
	// Refuse drops the pod's traffic outside the mesh (init data
	// mesh.unmeshed = "refuse"): new connections from outside the pod
	// other than to the inbound listeners, and new connections the pod
	// opens other than to loopback (where the outbound redirect leads)
	// or by the agent (Mark). Replies, loopback and ICMPv6 (neighbour
	// discovery) pass. Without it the rest passes untouched.
	Refuse bool
}

// OutboundMatch is a meshed destination: a port, on the peers' addresses
// (none: every address).
type OutboundMatch struct {
	Port  uint16
	Peers []netip.Prefix
}

// Listeners are the ports the proxy listens on, which the redirects
// point at: inbound on every address, outbound on loopback, for IPv4 and
// IPv6.
type Listeners struct {
	Inbound4, Inbound6, Outbound4, Outbound6 uint16
}

// NFTables is the part of an nftables netlink connection (google/nftables
// Conn) that Install uses; tests use a fake.
type NFTables interface {
	AddTable(*nftables.Table) *nftables.Table
	DelTable(*nftables.Table)
	AddChain(*nftables.Chain) *nftables.Chain
	AddRule(*nftables.Rule) *nftables.Rule
	Flush() error
}

// Install replaces the pod's mesh table with r's rules in one netlink
// batch: the kernel applies all of it or none. The table is the agent's:
// the host has no netlink access to the guest, and a container changes it
// only with CAP_NET_ADMIN, which the measured policy must grant.
func (r *Redirect) Install(c NFTables) error {
	if err := r.check(); err != nil {
		return err
	}
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	// Adding an existing table is no error; deleting it then empties it.
	c.AddTable(table)
	c.DelTable(table)
	c.AddTable(table)
	chains, rules := r.Rules(table)
	for _, ch := range chains {
		c.AddChain(ch)
	}
	for _, rule := range rules {
		c.AddRule(rule)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("mesh: program the pod's redirects (nftables table inet %s): %w", TableName, err)
	}
	return nil
}

func (r *Redirect) check() error {
	l := r.Listeners
	if len(r.Inbound) > 0 && (l.Inbound4 == 0 || l.Inbound6 == 0) {
		return errors.New("mesh: inbound ports without inbound listeners")
	}
	if len(r.Outbound) > 0 && (l.Outbound4 == 0 || l.Outbound6 == 0) {
		return errors.New("mesh: outbound ports without outbound listeners")
	}
	if r.Mark == 0 {
		return errors.New("mesh: no mark for the proxy's own connections")
	}
	return nil
}

// Rules are the table's chains and their rules, in order:
//
//	inbound (nat, prerouting):
//	          iifname "lo" accept
//	          tcp dport P (ipv4) redirect to :Inbound4, (ipv6) to :Inbound6   (each inbound P)
//	outbound (nat, output):
//	          meta mark Mark accept
//	          oifname "lo" accept
//	          tcp dport P [daddr PEER] (ipv4) redirect to :Outbound4, (ipv6) to :Outbound6
//
// then, for the ports outbound entries mesh on their peers only, unless
// Refuse drops them anyway:
//
//	meshed-out (filter, output): oifname "lo" accept; meta mark Mark accept;
//	          ct state established,related accept; tcp dport P drop   (each such P)
//
// and, with Refuse, two filter chains after them:
//
//	refuse-in (filter, input):  iifname "lo" accept; ct state established,related accept;
//	          icmpv6 accept; ipv4 tcp dport Inbound4 accept; ipv6 tcp dport Inbound6 accept; drop
//	refuse-out (filter, output): oifname "lo" accept;
//	          tcp daddr loopback dport {Outbound4, Outbound6} accept (redirected);
//	          meta mark Mark accept; ct state established,related accept;
//	          icmpv6 accept; drop
//
// and, with outbound entries, one filter chain that keeps the pod from
// answering a connection the host opened with a SYN of its own:
//
//	guard-out (filter, output): tcp flags & (syn|ack) == syn ct direction reply drop
//
// The outbound redirect is a NAT rule, which the kernel consults for new
// connections only. A host on the pod's wire can send SYNs from PEER:P to
// each of the pod's local ports, in frames the pod's TCP stack drops
// without a reset (to the Ethernet broadcast address): conntrack keeps
// each as a connection PEER:P opened. The workload's later SYN to PEER:P
// is then that connection's reply direction, a simultaneous open: never
// redirected, and established for "ct state" above. A pod never opens a
// connection that way otherwise.
//
// Nothing names the pod's interfaces, which the host chooses: traffic on
// any of them is intercepted, loopback only is exempt (the workload's
// connections to itself, and the proxy's to the workload).
func (r *Redirect) Rules(table *nftables.Table) ([]*nftables.Chain, []*nftables.Rule) {
	chain := func(name string, typ nftables.ChainType, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		accept := nftables.ChainPolicyAccept
		return &nftables.Chain{Name: name, Table: table, Type: typ, Hooknum: hook, Priority: prio, Policy: &accept}
	}
	pre := chain("inbound", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	out := chain("outbound", nftables.ChainTypeNAT, nftables.ChainHookOutput, nftables.ChainPriorityNATDest)
	chains := []*nftables.Chain{pre, out}
	var rules []*nftables.Rule
	add := func(ch *nftables.Chain, exprs ...expr.Any) {
		rules = append(rules, &nftables.Rule{Table: ch.Table, Chain: ch, Exprs: exprs})
	}
	markAccept := func(ch *nftables.Chain) {
		add(ch, &expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(r.Mark)}, accept())
	}
	if len(r.Inbound) > 0 {
		add(pre, append(ifname(expr.MetaKeyIIFNAME, "lo"), accept())...)
		for _, p := range r.Inbound {
			add(pre, redirect(unix.NFPROTO_IPV4, p, netip.Prefix{}, r.Listeners.Inbound4)...)
			add(pre, redirect(unix.NFPROTO_IPV6, p, netip.Prefix{}, r.Listeners.Inbound6)...)
		}
	}
	if len(r.Outbound) > 0 {
		markAccept(out)
		add(out, append(ifname(expr.MetaKeyOIFNAME, "lo"), accept())...)
		for _, o := range r.Outbound {
			if len(o.Peers) == 0 {
				add(out, redirect(unix.NFPROTO_IPV4, o.Port, netip.Prefix{}, r.Listeners.Outbound4)...)
				add(out, redirect(unix.NFPROTO_IPV6, o.Port, netip.Prefix{}, r.Listeners.Outbound6)...)
				continue
			}
			for _, peer := range o.Peers {
				if peer.Addr().Is4() {
					add(out, redirect(unix.NFPROTO_IPV4, o.Port, peer, r.Listeners.Outbound4)...)
				} else {
					add(out, redirect(unix.NFPROTO_IPV6, o.Port, peer, r.Listeners.Outbound6)...)
				}
			}
		}
	}
	if len(r.Outbound) > 0 {
		guard := chain("guard-out", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
		chains = append(chains, guard)
		add(guard, append(synReply(), drop())...)
	}
	// A port meshed on its peers only is never sent in plaintext to
	// other addresses: the workload finds its peers by the pod's DNS,
	// which is the host's, and an answer outside peers would otherwise
	// take the port's traffic past the proxy (Refuse drops it anyway).
	if bounded := r.boundedPorts(); len(bounded) > 0 && !r.Refuse {
		mo := chain("meshed-out", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
		chains = append(chains, mo)
		add(mo, append(ifname(expr.MetaKeyOIFNAME, "lo"), accept())...)
		markAccept(mo)
		add(mo, append(established(), accept())...)
		for _, port := range bounded {
			add(mo, append(tcpDport(port), drop())...)
		}
	}
	if r.Refuse {
		in := chain("refuse-in", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
		eg := chain("refuse-out", nftables.ChainTypeFilter, nftables.ChainHookOutput, nftables.ChainPriorityFilter)
		chains = append(chains, in, eg)
		add(in, append(ifname(expr.MetaKeyIIFNAME, "lo"), accept())...)
		add(in, append(established(), accept())...)
		add(in, append(icmpv6(), accept())...)
		// Each listener in its own family: the port of one is random in
		// the other, where a workload may happen to listen.
		for _, l := range []struct {
			family byte
			port   uint16
		}{{unix.NFPROTO_IPV4, r.Listeners.Inbound4}, {unix.NFPROTO_IPV6, r.Listeners.Inbound6}} {
			if l.port != 0 {
				add(in, append(append(nfproto(l.family), tcpDport(l.port)...), accept())...)
			}
		}
		add(in, drop())
		add(eg, append(ifname(expr.MetaKeyOIFNAME, "lo"), accept())...)
		// A redirected connection keeps its first route's interface in
		// this hook: it is known by its new destination, the outbound
		// listener on loopback.
		if r.Listeners.Outbound4 != 0 {
			add(eg, append(toLoopback(unix.NFPROTO_IPV4, r.Listeners.Outbound4), accept())...)
			add(eg, append(toLoopback(unix.NFPROTO_IPV6, r.Listeners.Outbound6), accept())...)
		}
		markAccept(eg)
		add(eg, append(established(), accept())...)
		add(eg, append(icmpv6(), accept())...)
		add(eg, drop())
	}
	return chains, rules
}

// boundedPorts are the outbound ports meshed on their peers only, once
// each.
func (r *Redirect) boundedPorts() []uint16 {
	var out []uint16
	for _, o := range r.Outbound {
		if len(o.Peers) > 0 && !slices.Contains(out, o.Port) {
			out = append(out, o.Port)
		}
	}
	return out
}

func drop() expr.Any { return &expr.Verdict{Kind: expr.VerdictDrop} }

// established matches "ct state established,related".
func established() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// synReply matches "tcp flags & (syn|ack) == syn ct direction reply": a
// SYN without ACK sent in the reply direction of a tracked connection.
func synReply() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 13, Len: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{tcpSYN | tcpACK}, Xor: []byte{0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{tcpSYN}},
		&expr.Ct{Key: expr.CtKeyDIRECTION, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{ctDirReply}},
	}
}

// TCP header flags (byte 13) and conntrack's reply direction
// (IP_CT_DIR_REPLY).
const (
	tcpSYN     = 0x02
	tcpACK     = 0x10
	ctDirReply = 1
)

// icmpv6 matches "meta l4proto ipv6-icmp": IPv6 needs neighbour
// discovery.
func icmpv6() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
	}
}

// toLoopback matches TCP to the loopback address of family, port port.
func toLoopback(family byte, port uint16) []expr.Any {
	offset, addr := uint32(16), netip.AddrFrom4([4]byte{127, 0, 0, 1}) // IPv4 header: daddr
	if family == unix.NFPROTO_IPV6 {
		offset, addr = 24, netip.IPv6Loopback()
	}
	return append([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{family}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(addr.BitLen() / 8)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr.AsSlice()},
	}, tcpDport(port)...)
}

// nfproto matches "meta nfproto FAMILY".
func nfproto(family byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{family}}}
}

// tcpDport matches "tcp dport PORT".
func tcpDport(port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func accept() expr.Any { return &expr.Verdict{Kind: expr.VerdictAccept} }

// ifname matches an interface name exactly (the kernel loads IFNAMSIZ
// bytes, NUL-padded).
func ifname(key expr.MetaKey, name string) []expr.Any {
	data := make([]byte, unix.IFNAMSIZ)
	copy(data, name)
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data}}
}

// redirect is "meta nfproto FAMILY meta l4proto tcp [daddr PEER] th dport
// PORT redirect to :TO".
func redirect(family byte, port uint16, peer netip.Prefix, to uint16) []expr.Any {
	e := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{family}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
	}
	if peer.IsValid() {
		offset, size := uint32(16), uint32(4) // IPv4 header: daddr
		if family == unix.NFPROTO_IPV6 {
			offset, size = 24, 16
		}
		mask := netip.PrefixFrom(peer.Addr(), peer.Bits()).Masked()
		e = append(e,
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: prefixMask(peer.Bits(), int(size)), Xor: make([]byte, size)},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: mask.Addr().AsSlice()},
		)
	}
	return append(e,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(to)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	)
}

// prefixMask is the network mask of bits ones in size bytes.
func prefixMask(bits, size int) []byte {
	m := make([]byte, size)
	for i := range m {
		switch {
		case bits >= 8:
			m[i] = 0xff
			bits -= 8
		case bits > 0:
			m[i] = byte(0xff << (8 - bits))
			bits = 0
		}
	}
	return m
}
