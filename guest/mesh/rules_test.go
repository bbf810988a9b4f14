package mesh

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// fakeNFT records a batch as the kernel would apply it.
type fakeNFT struct {
	calls   []string
	rules   []*nftables.Rule
	chains  []*nftables.Chain
	flushes int
	err     error
}

func (f *fakeNFT) AddTable(t *nftables.Table) *nftables.Table {
	f.calls = append(f.calls, "add table "+t.Name)
	return t
}

func (f *fakeNFT) DelTable(t *nftables.Table) { f.calls = append(f.calls, "delete table "+t.Name) }

func (f *fakeNFT) AddChain(c *nftables.Chain) *nftables.Chain {
	f.calls = append(f.calls, "add chain "+c.Name)
	f.chains = append(f.chains, c)
	return c
}

func (f *fakeNFT) AddRule(r *nftables.Rule) *nftables.Rule {
	f.calls = append(f.calls, "add rule "+r.Chain.Name)
	f.rules = append(f.rules, r)
	return r
}

func (f *fakeNFT) Flush() error {
	f.calls = append(f.calls, "flush")
	f.flushes++
	return f.err
}

// render writes a rule as nft(8) would list it, for the expressions the
// mesh uses; anything else fails the test.
func render(t *testing.T, r *nftables.Rule) string {
	t.Helper()
	var out []string
	var loaded string // what register 1 holds
	var payloadLen uint32
	bits := -1 // the mask applied to an address
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Meta:
			loaded = map[expr.MetaKey]string{expr.MetaKeyNFPROTO: "nfproto", expr.MetaKeyL4PROTO: "l4proto",
				expr.MetaKeyIIFNAME: "iifname", expr.MetaKeyOIFNAME: "oifname", expr.MetaKeyMARK: "mark"}[e.Key]
			if loaded == "" {
				t.Fatalf("meta key %v", e.Key)
			}
		case *expr.Payload:
			switch {
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 2 && e.Len == 2:
				loaded = "th dport"
			case e.Base == expr.PayloadBaseTransportHeader && e.Offset == 13 && e.Len == 1:
				loaded = "tcp flags"
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 16 && e.Len == 4:
				loaded, payloadLen, bits = "ip daddr", 4, 32
			case e.Base == expr.PayloadBaseNetworkHeader && e.Offset == 24 && e.Len == 16:
				loaded, payloadLen, bits = "ip6 daddr", 16, 128
			default:
				t.Fatalf("payload %+v", e)
			}
		case *expr.Ct:
			switch e.Key {
			case expr.CtKeySTATE:
				loaded = "ct state"
			case expr.CtKeyDIRECTION:
				loaded = "ct direction"
			default:
				t.Fatalf("ct %+v", e)
			}
		case *expr.Bitwise:
			if loaded == "tcp flags" {
				if e.Len != 1 || !bytes.Equal(e.Mask, []byte{0x12}) || !bytes.Equal(e.Xor, []byte{0}) {
					t.Fatalf("tcp flags mask %+v", e)
				}
				loaded = "tcp flags & (syn|ack)"
				continue
			}
			if loaded == "ct state" {
				if binary.NativeEndian.Uint32(e.Mask) != expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED {
					t.Fatalf("ct state mask %x", e.Mask)
				}
				loaded = "ct state established,related"
				continue
			}
			if e.Len != payloadLen || !bytes.Equal(e.Xor, make([]byte, e.Len)) {
				t.Fatalf("bitwise %+v", e)
			}
			bits = 0
			for _, b := range e.Mask {
				for ; b&0x80 != 0; b <<= 1 {
					bits++
				}
			}
		case *expr.Cmp:
			if loaded == "ct state established,related" {
				if e.Op != expr.CmpOpNeq || !bytes.Equal(e.Data, make([]byte, 4)) {
					t.Fatalf("ct state cmp %+v", e)
				}
				out = append(out, loaded)
				continue
			}
			if e.Op != expr.CmpOpEq {
				t.Fatalf("cmp %+v", e)
			}
			var v string
			switch {
			case loaded == "nfproto":
				v = map[byte]string{unix.NFPROTO_IPV4: "ipv4", unix.NFPROTO_IPV6: "ipv6"}[e.Data[0]]
			case loaded == "l4proto":
				v = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_ICMPV6: "ipv6-icmp"}[e.Data[0]]
			case strings.HasSuffix(loaded, "ifname"):
				if len(e.Data) != unix.IFNAMSIZ {
					t.Fatalf("%s compared on %d bytes, want IFNAMSIZ", loaded, len(e.Data))
				}
				v = `"` + string(bytes.TrimRight(e.Data, "\x00")) + `"`
			case loaded == "mark":
				v = fmt.Sprintf("0x%08x", binary.NativeEndian.Uint32(e.Data))
			case loaded == "th dport":
				v = fmt.Sprint(binary.BigEndian.Uint16(e.Data))
			case loaded == "tcp flags & (syn|ack)":
				v = map[byte]string{0x02: "== syn"}[e.Data[0]]
			case loaded == "ct direction":
				v = map[byte]string{0: "original", 1: "reply"}[e.Data[0]]
			case strings.HasPrefix(loaded, "ip") && bits >= 0:
				a, _ := netip.AddrFromSlice(e.Data)
				v = netip.PrefixFrom(a, bits).String()
			}
			if v == "" {
				t.Fatalf("cmp %s %x", loaded, e.Data)
			}
			out = append(out, loaded+" "+v)
		case *expr.Immediate:
			loaded = fmt.Sprint(binary.BigEndian.Uint16(e.Data))
		case *expr.Redir:
			if e.RegisterProtoMin != 1 || e.Flags != unix.NF_NAT_RANGE_PROTO_SPECIFIED {
				t.Fatalf("redir %+v", e)
			}
			out = append(out, "redirect to :"+loaded)
		case *expr.Verdict:
			v := map[expr.VerdictKind]string{expr.VerdictAccept: "accept", expr.VerdictDrop: "drop"}[e.Kind]
			if v == "" {
				t.Fatalf("verdict %+v", e)
			}
			out = append(out, v)
		default:
			t.Fatalf("expression %T", e)
		}
	}
	s := strings.Join(out, " ")
	return r.Chain.Name + ": " + s
}

var testListeners = Listeners{Inbound4: 40001, Inbound6: 40002, Outbound4: 40003, Outbound6: 40004}

func TestRedirectRules(t *testing.T) {
	r := &Redirect{
		Inbound: []uint16{8080, 5432},
		Outbound: []OutboundMatch{
			{Port: 8080, Peers: []netip.Prefix{netip.MustParsePrefix("10.231.9.0/24"), netip.MustParsePrefix("fd00::/64")}},
			{Port: 6379},
		},
		Listeners: testListeners,
		Mark:      Mark,
	}
	f := &fakeNFT{}
	if err := r.Install(f); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rule := range f.rules {
		got = append(got, render(t, rule))
	}
	want := []string{
		`inbound: iifname "lo" accept`,
		`inbound: nfproto ipv4 l4proto tcp th dport 8080 redirect to :40001`,
		`inbound: nfproto ipv6 l4proto tcp th dport 8080 redirect to :40002`,
		`inbound: nfproto ipv4 l4proto tcp th dport 5432 redirect to :40001`,
		`inbound: nfproto ipv6 l4proto tcp th dport 5432 redirect to :40002`,
		`outbound: mark 0x63386d65 accept`,
		`outbound: oifname "lo" accept`,
		`outbound: nfproto ipv4 l4proto tcp ip daddr 10.231.9.0/24 th dport 8080 redirect to :40003`,
		`outbound: nfproto ipv6 l4proto tcp ip6 daddr fd00::/64 th dport 8080 redirect to :40004`,
		`outbound: nfproto ipv4 l4proto tcp th dport 6379 redirect to :40003`,
		`outbound: nfproto ipv6 l4proto tcp th dport 6379 redirect to :40004`,
		`guard-out: l4proto tcp tcp flags & (syn|ack) == syn ct direction reply drop`,
		`meshed-out: oifname "lo" accept`,
		`meshed-out: mark 0x63386d65 accept`,
		`meshed-out: ct state established,related accept`,
		`meshed-out: l4proto tcp th dport 8080 drop`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// One batch, replacing any earlier table whole.
	calls := strings.Join(f.calls, "; ")
	if !strings.HasPrefix(calls, "add table c8s-mesh; delete table c8s-mesh; add table c8s-mesh; add chain inbound; add chain outbound; ") ||
		!strings.HasSuffix(calls, "; flush") || f.flushes != 1 {
		t.Fatalf("calls: %s", calls)
	}
	for _, c := range f.chains[:2] {
		if c.Table.Family != nftables.TableFamilyINet || c.Type != nftables.ChainTypeNAT || *c.Priority != *nftables.ChainPriorityNATDest ||
			*c.Policy != nftables.ChainPolicyAccept {
			t.Fatalf("chain %s: %+v", c.Name, c)
		}
	}
	if len(f.chains) != 4 || *f.chains[0].Hooknum != *nftables.ChainHookPrerouting || *f.chains[1].Hooknum != *nftables.ChainHookOutput {
		t.Fatal("chains: want inbound at prerouting, outbound at output, then guard-out and meshed-out")
	}
	// The guard and the port bounded by peers filter what the redirects
	// did not take, after them (filter, output).
	for i, name := range []string{"guard-out", "meshed-out"} {
		if c := f.chains[2+i]; c.Name != name || c.Type != nftables.ChainTypeFilter || *c.Hooknum != *nftables.ChainHookOutput ||
			*c.Priority != *nftables.ChainPriorityFilter {
			t.Fatalf("chain %s: %+v", c.Name, c)
		}
	}
	// Without peers, every address is redirected: no meshed-out chain.
	r.Outbound = []OutboundMatch{{Port: 6379}}
	f = &fakeNFT{}
	if err := r.Install(f); err != nil {
		t.Fatal(err)
	}
	if len(f.chains) != 3 || f.chains[2].Name != "guard-out" {
		t.Fatalf("outbound ports on every address: %d chains, want the guard only", len(f.chains))
	}
	// Inbound only: no outbound redirect to guard.
	r.Outbound = nil
	f = &fakeNFT{}
	if err := r.Install(f); err != nil {
		t.Fatal(err)
	}
	if len(f.chains) != 2 {
		t.Fatalf("inbound only: %d chains, want no filter", len(f.chains))
	}
}

// With mesh.unmeshed = "refuse", two filter chains drop what the mesh
// does not carry: new connections from outside but to the inbound
// listeners, and new connections the pod opens but to loopback (where
// the outbound redirect leads) or by the agent.
func TestRedirectRefuseRules(t *testing.T) {
	r := &Redirect{Inbound: []uint16{8080}, Outbound: []OutboundMatch{{Port: 5432}}, Listeners: testListeners, Mark: Mark, Refuse: true}
	f := &fakeNFT{}
	if err := r.Install(f); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, rule := range f.rules {
		if s := render(t, rule); strings.HasPrefix(s, "refuse-") {
			got = append(got, s)
		}
	}
	want := []string{
		`refuse-in: iifname "lo" accept`,
		`refuse-in: ct state established,related accept`,
		`refuse-in: l4proto ipv6-icmp accept`,
		`refuse-in: nfproto ipv4 l4proto tcp th dport 40001 accept`,
		`refuse-in: nfproto ipv6 l4proto tcp th dport 40002 accept`,
		`refuse-in: drop`,
		`refuse-out: oifname "lo" accept`,
		`refuse-out: nfproto ipv4 ip daddr 127.0.0.1/32 l4proto tcp th dport 40003 accept`,
		`refuse-out: nfproto ipv6 ip6 daddr ::1/128 l4proto tcp th dport 40004 accept`,
		`refuse-out: mark 0x63386d65 accept`,
		`refuse-out: ct state established,related accept`,
		`refuse-out: l4proto ipv6-icmp accept`,
		`refuse-out: drop`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if len(f.chains) != 5 || f.chains[2].Name != "guard-out" {
		t.Fatalf("%d chains, want the guard third", len(f.chains))
	}
	for _, c := range f.chains[2:] {
		if c.Type != nftables.ChainTypeFilter || *c.Priority != *nftables.ChainPriorityFilter {
			t.Fatalf("chain %s: %+v", c.Name, c)
		}
	}
	if *f.chains[3].Hooknum != *nftables.ChainHookInput || *f.chains[4].Hooknum != *nftables.ChainHookOutput {
		t.Fatal("filter chains: want refuse-in at input, refuse-out at output")
	}
}

// The proxy's own connections must never be redirected to itself: the
// mark's exemption precedes every outbound redirect, and loopback is
// exempt in both directions (the proxy's connection to the workload).
// Nothing else names an interface, so one the host adds to the pod is
// intercepted like the others.
func TestRedirectLoopAvoidance(t *testing.T) {
	r := &Redirect{Inbound: []uint16{80}, Outbound: []OutboundMatch{{Port: 80}}, Listeners: testListeners, Mark: Mark}
	f := &fakeNFT{}
	if err := r.Install(f); err != nil {
		t.Fatal(err)
	}
	firstRedirect := map[string]int{}
	exempt := map[string]int{}
	for i, rule := range f.rules {
		s := render(t, rule)
		switch {
		case strings.Contains(s, "redirect"):
			if _, ok := firstRedirect[rule.Chain.Name]; !ok {
				firstRedirect[rule.Chain.Name] = i
			}
		case strings.Contains(s, "mark 0x63386d65 accept"), strings.Contains(s, `ifname "lo" accept`):
			exempt[s] = i
		case strings.HasPrefix(s, "guard-out:"):
		default:
			t.Fatalf("unexpected rule %s", s)
		}
		if strings.Contains(s, "ifname") && !strings.Contains(s, `"lo"`) {
			t.Fatalf("rule %s names an interface the host chose", s)
		}
	}
	for s, want := range map[string]string{
		`outbound: mark 0x63386d65 accept`: "outbound",
		`outbound: oifname "lo" accept`:    "outbound",
		`inbound: iifname "lo" accept`:     "inbound",
	} {
		i, ok := exempt[s]
		if !ok || i > firstRedirect[want] {
			t.Fatalf("%q: missing or after the first redirect (rules %v, redirects from %v)", s, exempt, firstRedirect)
		}
	}
}

func TestRedirectInstallRefused(t *testing.T) {
	for name, r := range map[string]*Redirect{
		"inbound without listener":  {Inbound: []uint16{80}, Listeners: Listeners{Inbound4: 1}, Mark: Mark},
		"outbound without listener": {Outbound: []OutboundMatch{{Port: 80}}, Listeners: Listeners{Outbound6: 1}, Mark: Mark},
		"no mark":                   {Outbound: []OutboundMatch{{Port: 80}}, Listeners: testListeners},
	} {
		f := &fakeNFT{}
		if err := r.Install(f); err == nil || f.flushes != 0 {
			t.Fatalf("%s: Install = %v, %d flushes", name, err, f.flushes)
		}
	}
	f := &fakeNFT{err: errors.New("EPERM")}
	r := &Redirect{Inbound: []uint16{80}, Listeners: testListeners, Mark: Mark}
	if err := r.Install(f); err == nil || !strings.Contains(err.Error(), "EPERM") || !strings.Contains(err.Error(), TableName) {
		t.Fatalf("a failed batch: %v", err)
	}
}

func TestPrefixMask(t *testing.T) {
	for _, tc := range []struct {
		bits, size int
		want       []byte
	}{
		{24, 4, []byte{255, 255, 255, 0}},
		{0, 4, []byte{0, 0, 0, 0}},
		{32, 4, []byte{255, 255, 255, 255}},
		{13, 4, []byte{255, 0xf8, 0, 0}},
		{64, 16, append(bytes.Repeat([]byte{255}, 8), make([]byte, 8)...)},
	} {
		if got := prefixMask(tc.bits, tc.size); !bytes.Equal(got, tc.want) {
			t.Errorf("prefixMask(%d, %d) = %x, want %x", tc.bits, tc.size, got, tc.want)
		}
	}
}
