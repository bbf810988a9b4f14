package reattest

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-sev-guest/kds"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

// The fakes: a node with sim pod VMs whose evidence is real (a simulated
// secure processor signs SNP reports), a CRI and a Kubernetes in memory.

var (
	goodDigest  = bytesOf(0x11, 48)
	otherDigest = bytesOf(0x22, 48)
	podInitData = []byte("version = \"0.1.0\"\n")
)

func bytesOf(b byte, n int) attest.Hex {
	out := make(attest.Hex, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// node is one fake node.
type node struct {
	t  *testing.T
	sp *sim.SP

	mu        sync.Mutex
	sandboxes []Sandbox
	pods      map[string]Pod
	// measurement is what the pods' VMs were launched with, and
	// reference what the node's image manifest says.
	measurement, reference attest.Hex
	// boot, when set, is the sim launch the pods' VMs booted: their
	// evidence carries its boot log and RTMR statement. manifestBoot is
	// the measured boot the node's image manifest predicts.
	boot            *sim.Launch
	manifestBoot    *manifest.BootDigests
	manifestCmdline string
	// replay, when set, answers every evidence request with evidence for
	// this old nonce.
	replay []byte
	// noEvidence fails every evidence request.
	noEvidence error
	nonces     [][]byte
	stopped    []string

	conditions map[string][]Condition
	podEvents  map[string][]string
	nodeEvents []string

	now time.Time
}

// simSP is one simulated chip for every test: its RSA-4096 keys take
// seconds to make.
var simSP = sync.OnceValues(func() (*sim.SP, error) { return sim.New(sim.DefaultTCB) })

func newNode(t *testing.T) *node {
	t.Helper()
	sp, err := simSP()
	if err != nil {
		t.Fatal(err)
	}
	return &node{t: t, sp: sp, pods: map[string]Pod{}, measurement: goodDigest, reference: goodDigest,
		conditions: map[string][]Condition{}, podEvents: map[string][]string{},
		now: time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)}
}

// run adds a running pod VM for pod name.
func (n *node) run(id, name string) Sandbox {
	n.mu.Lock()
	defer n.mu.Unlock()
	sb := Sandbox{Namespace: "k8s.io", ID: id}
	n.sandboxes = append(n.sandboxes, sb)
	n.pods[id] = Pod{Namespace: "default", Name: name, UID: "uid-" + name}
	return sb
}

func (n *node) tcb() TCB {
	v, err := kds.ComposeTCBParts(n.sp.TCB())
	if err != nil {
		n.t.Fatal(err)
	}
	return TCB(v)
}

func (n *node) chipID() attest.Hex {
	c := n.sp.ChipID()
	return c[:]
}

// Sandboxes implements Sandboxes.
func (n *node) Sandboxes(context.Context) ([]Sandbox, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []Sandbox
	for _, sb := range n.sandboxes {
		if !contains(n.stopped, sb.ID) {
			out = append(out, sb)
		}
	}
	return out, nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Evidence implements Shims: the simulated chip signs a report for the
// nonce as the guest agent binds it.
func (n *node) Evidence(_ context.Context, sb Sandbox, nonce []byte) (*adminapi.EvidenceResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nonces = append(n.nonces, append([]byte(nil), nonce...))
	if n.noEvidence != nil {
		return nil, n.noEvidence
	}
	if n.replay != nil {
		nonce = n.replay
	}
	hd := initdata.Digest(podInitData)
	req := sim.Request{HostData: hd, ReportData: reportdata.Host(nonce)}
	copy(req.Measurement[:], n.measurement)
	r, err := n.sp.Report(req)
	if err != nil {
		return nil, err
	}
	ev := &adminapi.EvidenceResponse{Sandbox: sb.ID, Kind: "snp", Provider: "sim", Report: r, CertTable: n.sp.CertTable(),
		Tee: "sim", Vcpus: 1, HostData: hd[:], Manifest: "/node/manifest.json"}
	if n.boot != nil {
		var rtmrs [4][48]byte
		if ev.EventLog, rtmrs, err = sim.BootLog(*n.boot); err != nil {
			return nil, err
		}
		if ev.SimRtmrs, err = n.sp.RTMRStatement(r, rtmrs); err != nil {
			return nil, err
		}
	}
	return ev, nil
}

// Pod and StopSandbox implement Runtime.
func (n *node) Pod(_ context.Context, sb Sandbox) (Pod, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.pods[sb.ID]
	if !ok {
		return Pod{}, errors.New("no such sandbox")
	}
	return p, nil
}

func (n *node) StopSandbox(_ context.Context, sb Sandbox) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopped = append(n.stopped, sb.ID)
	return nil
}

// SetPodCondition, PodEvent and NodeEvent implement Reporter.
func (n *node) SetPodCondition(_ context.Context, p Pod, c Condition) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.conditions[p.Name] = append(n.conditions[p.Name], c)
	return nil
}

func (n *node) PodEvent(_ context.Context, p Pod, typ, reason, _ string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.podEvents[p.Name] = append(n.podEvents[p.Name], typ+" "+reason)
	return nil
}

func (n *node) NodeEvent(_ context.Context, typ, reason, _ string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodeEvents = append(n.nodeEvents, typ+" "+reason)
	return nil
}

// condition returns the pod's last condition.
func (n *node) condition(name string) Condition {
	n.mu.Lock()
	defer n.mu.Unlock()
	cs := n.conditions[name]
	if len(cs) == 0 {
		n.t.Fatalf("pod %s has no c8s.io/Attested condition", name)
	}
	return cs[len(cs)-1]
}

// manifest is the node's image manifest: the reference for 1 vCPU.
func (n *node) manifest(string) (*manifest.Manifest, error) {
	n.mu.Lock()
	ref, boot, cmdline := n.reference, n.manifestBoot, n.manifestCmdline
	n.mu.Unlock()
	var m manifest.Manifest
	if err := m.SetSim(manifest.SimDigests{ByVCPUs: map[string]string{"1": ref.String()}, Boot: boot, Cmdline: cmdline}); err != nil {
		return nil, err
	}
	return &m, nil
}

// owner is the pod owner with a signing key and a bundle file the node
// reads.
type owner struct {
	t    *testing.T
	key  crypto.Signer
	pub  crypto.PublicKey
	file string
}

func newOwner(t *testing.T) *owner {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &owner{t: t, key: priv, pub: pub, file: filepath.Join(t.TempDir(), "bundle.jws")}
}

// publish signs b with key (the owner's when nil) and writes it.
func (o *owner) publish(b Bundle, key crypto.Signer) {
	o.t.Helper()
	if key == nil {
		key = o.key
	}
	doc, err := json.Marshal(b)
	if err != nil {
		o.t.Fatal(err)
	}
	jws, err := Sign(doc, key)
	if err != nil {
		o.t.Fatal(err)
	}
	if err := os.WriteFile(o.file, []byte(jws), 0o644); err != nil {
		o.t.Fatal(err)
	}
}

// monitor returns a Monitor of n reading o's bundle file.
func (n *node) monitor(o *owner) *Monitor {
	n.t.Helper()
	store, err := NewStore([]crypto.PublicKey{o.pub}, FileSource(o.file))
	if err != nil {
		n.t.Fatal(err)
	}
	chain := n.sp.CertChainPEM()
	return &Monitor{
		Sandboxes: n, Shims: n, Runtime: n, Reporter: n, Bundles: store,
		Checker: &Checker{
			Trusts: func(string) ([]attest.Trust, error) {
				return []attest.Trust{{Mode: attest.ModeSim, SimCertChain: chain}}, nil
			},
			Manifest: n.manifest,
		},
		Interval: 10 * time.Minute,
		Now:      func() time.Time { n.mu.Lock(); defer n.mu.Unlock(); return n.now },
	}
}

func (n *node) advance(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.now = n.now.Add(d)
}

func once(t *testing.T, m *Monitor) Pass {
	t.Helper()
	p, err := m.Once(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func mustCompose(t *testing.T, p kds.TCBParts) TCB {
	t.Helper()
	v, err := kds.ComposeTCBParts(p)
	if err != nil {
		t.Fatal(err)
	}
	return TCB(v)
}
