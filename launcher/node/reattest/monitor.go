package reattest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/attest"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

// Defaults of Monitor.
const (
	// DefaultInterval is how often each running pod is re-attested.
	DefaultInterval = 10 * time.Minute
	// DefaultScan is how often the node is scanned for new pods and new
	// bundles: a new pod, or every pod after a new bundle, is re-attested
	// at the next scan.
	DefaultScan = 15 * time.Second
	// evidenceTimeout bounds one pod's evidence request.
	evidenceTimeout = time.Minute
)

// ConditionType is the pod condition re-attestation maintains.
const ConditionType = "c8s.io/Attested"

// Sandbox is a running c8s pod VM of the node.
type Sandbox struct {
	// Namespace is its containerd namespace and ID its sandbox id.
	Namespace, ID string
}

// Pod names a Kubernetes pod.
type Pod struct {
	Namespace, Name, UID string
}

func (p Pod) String() string { return p.Namespace + "/" + p.Name }

// Sandboxes lists the node's running c8s pod VMs.
type Sandboxes interface {
	Sandboxes(ctx context.Context) ([]Sandbox, error)
}

// Shims ask a pod's shim for fresh evidence (its Admin API's Evidence).
type Shims interface {
	Evidence(ctx context.Context, sb Sandbox, nonce []byte) (*adminapi.EvidenceResponse, error)
}

// Runtime is the container runtime's view of the sandboxes (CRI): which
// pod a sandbox runs, and stopping it.
type Runtime interface {
	Pod(ctx context.Context, sb Sandbox) (Pod, error)
	StopSandbox(ctx context.Context, sb Sandbox) error
}

// Condition is the c8s.io/Attested condition of a pod.
type Condition struct {
	Status          Status
	Reason, Message string
	// Probed is when the evidence was checked.
	Probed time.Time
}

// Reporter tells Kubernetes.
type Reporter interface {
	// SetPodCondition sets the pod's c8s.io/Attested condition (its
	// transition time changes only when its status does).
	SetPodCondition(ctx context.Context, p Pod, c Condition) error
	// PodEvent and NodeEvent record an event ("Normal" or "Warning") on
	// the pod and on this node.
	PodEvent(ctx context.Context, p Pod, typ, reason, message string) error
	NodeEvent(ctx context.Context, typ, reason, message string) error
}

// NodeState is whether the node itself satisfies the policy in force.
type NodeState struct {
	// Withheld is true when the node's chip or TCB fails the policy: it
	// must not advertise capacity.
	Withheld bool
	// Reason and Message say why (empty when not withheld).
	Reason, Message string
}

// Monitor re-attests the node's running pods: every Interval, and at once
// for a new pod, for a pod whose last verdict was Unknown and for every
// pod after a new bundle. A pod whose evidence
// passes gets c8s.io/Attested=True; one that fails gets False with the
// reason and a Warning event and, when the policy says so (the bundle's
// on_failure, else OnFailure), its sandbox is stopped. A failure of the
// node's own chip or TCB withholds the node (Node).
type Monitor struct {
	Sandboxes Sandboxes
	Shims     Shims
	Runtime   Runtime
	// Reporter is nil to log only.
	Reporter Reporter
	Checker  *Checker
	// Bundles holds the owner's bundle in force; nil for none.
	Bundles *Store
	// OnFailure is the node's default: OnFailureReport (empty) or
	// OnFailureStop.
	OnFailure string
	// Interval (default DefaultInterval) and Scan (default DefaultScan).
	Interval, Scan time.Duration
	// Now is the clock and NewNonce the challenge source (nil: time.Now,
	// attest.NewNonce).
	Now      func() time.Time
	NewNonce func() ([]byte, error)

	mu   sync.Mutex
	pods map[Sandbox]*podState
	// identity is the node's chip and TCB as its pods' last verified
	// evidence showed them; nil until one verified.
	identity *Identity
	node     NodeState
	// bundleSerial is the serial the pods were last judged under.
	bundleSerial uint64
}

type podState struct {
	pod     Pod
	checked time.Time
	last    Verdict
	stopped bool
	// pinned is the launch digest the VM's evidence verified with, and
	// pinnedBoot its measured boot (nil: none checked).
	pinned     attest.Hex
	pinnedBoot *Boot
}

// Result is one pod's re-attestation in a pass.
type Result struct {
	Sandbox Sandbox
	Pod     Pod
	Verdict Verdict
	// Stopped is true when the pass stopped the sandbox.
	Stopped bool
}

// Pass is what one scan did.
type Pass struct {
	// Bundle is the serial in force (0: none); BundleChanged says a new
	// one was taken in this pass, Rejected why published ones were not.
	Bundle        uint64
	BundleChanged bool
	Rejected      []error
	Results       []Result
	Node          NodeState
}

func (m *Monitor) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Node returns the node's state after the last pass.
func (m *Monitor) Node() NodeState {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.node
}

// Run scans every Scan until ctx ends.
func (m *Monitor) Run(ctx context.Context) {
	scan := m.Scan
	if scan <= 0 {
		scan = DefaultScan
	}
	t := time.NewTicker(scan)
	defer t.Stop()
	for {
		if _, err := m.Once(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("re-attestation: scan failed; retrying")
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Once refreshes the bundle and re-attests the pods that are due.
func (m *Monitor) Once(ctx context.Context) (Pass, error) {
	var pass Pass
	changed, rejected := m.Bundles.Refresh(ctx)
	pass.BundleChanged, pass.Rejected = changed, rejected
	for _, err := range rejected {
		log.G(ctx).WithError(err).Warn("re-attestation: trust bundle refused")
		m.nodeEvent(ctx, "Warning", "TrustBundleRejected", err.Error())
	}
	cur := m.Bundles.Current()
	var b *Bundle
	if cur != nil {
		b, pass.Bundle = cur.Bundle, cur.Serial
		if changed {
			log.G(ctx).Infof("re-attestation: owner's trust bundle serial %d in force; re-attesting every pod", cur.Serial)
			m.nodeEvent(ctx, "Normal", "TrustBundleApplied", fmt.Sprintf("the owner's trust bundle serial %d is in force", cur.Serial))
		}
	}
	sbs, err := m.Sandboxes.Sandboxes(ctx)
	if err != nil {
		return pass, fmt.Errorf("re-attestation: listing the node's pod VMs: %w", err)
	}
	m.mu.Lock()
	if m.pods == nil {
		m.pods = map[Sandbox]*podState{}
	}
	live := map[Sandbox]bool{}
	for _, sb := range sbs {
		live[sb] = true
	}
	for sb := range m.pods {
		if !live[sb] {
			delete(m.pods, sb)
		}
	}
	rejudge := m.bundleSerial != pass.Bundle
	m.bundleSerial = pass.Bundle
	m.mu.Unlock()

	interval := m.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	for _, sb := range sbs {
		m.mu.Lock()
		st := m.pods[sb]
		// A pod not judged yet (no evidence: a VM still booting, a shim
		// restarting), or not reported yet (the runtime does not know the
		// sandbox before its RunPodSandbox returns, while the VM already
		// answers), is tried again at every scan.
		due := st == nil || rejudge || st.last.Status == StatusUnknown || st.pod.Name == "" || !m.now().Before(st.checked.Add(interval))
		stopped := st != nil && st.stopped
		m.mu.Unlock()
		if !due || stopped {
			continue
		}
		pass.Results = append(pass.Results, m.check(ctx, sb, b))
	}
	pass.Node = m.judgeNode(ctx, b)
	return pass, nil
}

// check re-attests one pod and acts on the verdict.
func (m *Monitor) check(ctx context.Context, sb Sandbox, b *Bundle) Result {
	res := Result{Sandbox: sb}
	m.mu.Lock()
	st := m.pods[sb]
	if st == nil {
		st = &podState{}
		m.pods[sb] = st
	}
	m.mu.Unlock()
	if st.pod.Name == "" {
		p, err := m.Runtime.Pod(ctx, sb)
		if err != nil {
			// Normal while the runtime's RunPodSandbox has not returned.
			log.G(ctx).WithError(err).Debugf("re-attestation: sandbox %s: which pod it runs is unknown yet; not reported to Kubernetes", sb.ID)
		}
		st.pod = p
	}
	res.Pod = st.pod
	res.Verdict = m.attest(ctx, sb, b, st.pinned, st.pinnedBoot)
	now := m.now()
	prev := st.last
	m.mu.Lock()
	st.checked, st.last = now, res.Verdict
	if id := res.Verdict.Identity; id != nil {
		// Identity is set once the evidence verified, its launch digest
		// included.
		if st.pinned == nil {
			st.pinned, st.pinnedBoot = id.Measurement, id.Boot
		}
		if id.TEE != "tdx" {
			m.identity = id
		}
	}
	m.mu.Unlock()

	v := res.Verdict
	lg := log.G(ctx).WithFields(log.Fields{"sandbox": sb.ID, "pod": st.pod.String(), "reason": v.Reason})
	switch {
	case v.Status == StatusTrue && prev.Status == StatusTrue:
		lg.Debug("re-attestation: pod verified")
	case v.Status == StatusTrue:
		lg.Infof("re-attestation: pod verified: %s", v.Message)
	case v.Status == StatusUnknown && prev.Status == StatusUnknown:
		lg.Debugf("re-attestation: pod not verified: %s", v.Message)
	case v.Status == StatusUnknown:
		lg.Warnf("re-attestation: pod not verified (tried again at every scan): %s", v.Message)
	default:
		lg.Warnf("re-attestation: pod FAILS the policy: %s", v.Message)
	}
	if st.pod.Name != "" && m.Reporter != nil {
		if err := m.Reporter.SetPodCondition(ctx, st.pod, Condition{Status: v.Status, Reason: v.Reason, Message: v.Message, Probed: now}); err != nil {
			lg.WithError(err).Warn("re-attestation: setting the pod's c8s.io/Attested condition failed")
		}
		if prev.Status != v.Status || prev.Reason != v.Reason {
			typ := "Normal"
			if v.Status != StatusTrue {
				typ = "Warning"
			}
			m.podEvent(ctx, st.pod, typ, "Attestation"+v.Reason, v.Message)
		}
	}
	if v.Status == StatusFalse && m.onFailure(b) == OnFailureStop {
		if err := m.Runtime.StopSandbox(ctx, sb); err != nil {
			lg.WithError(err).Error("re-attestation: stopping the pod that fails the policy failed; retrying at the next scan")
			m.podEvent(ctx, st.pod, "Warning", "AttestationStopFailed", fmt.Sprintf("stopping the pod's sandbox failed: %v", err))
		} else {
			res.Stopped = true
			m.mu.Lock()
			st.stopped = true
			m.mu.Unlock()
			lg.Warn("re-attestation: pod's sandbox stopped, as the policy says (on_failure = stop)")
			m.podEvent(ctx, st.pod, "Warning", "AttestationStopped",
				fmt.Sprintf("sandbox %s stopped by the node's re-attestation (on_failure = stop): %s", sb.ID, v.Reason))
		}
	}
	return res
}

// attest gets fresh evidence and checks it.
func (m *Monitor) attest(ctx context.Context, sb Sandbox, b *Bundle, pinned attest.Hex, pinnedBoot *Boot) Verdict {
	newNonce := m.NewNonce
	if newNonce == nil {
		newNonce = func() ([]byte, error) { return attest.NewNonce() }
	}
	nonce, err := newNonce()
	if err != nil {
		return Verdict{Status: StatusUnknown, Reason: ReasonVerifierError, Message: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, evidenceTimeout)
	defer cancel()
	ev, err := m.Shims.Evidence(ctx, sb, nonce)
	if err != nil {
		return Verdict{Status: StatusUnknown, Reason: ReasonEvidenceUnavailable, Message: fmt.Sprintf("no evidence from the pod VM: %v", err)}
	}
	return m.Checker.Check(Input{Evidence: ev, Nonce: nonce, Bundle: b, Pinned: pinned, PinnedBoot: pinnedBoot, Now: m.now()})
}

func (m *Monitor) onFailure(b *Bundle) string {
	if b != nil && b.OnFailure != "" {
		return b.OnFailure
	}
	return m.OnFailure
}

// judgeNode decides whether the node itself satisfies the policy, from
// its chip and TCB as its pods' last verified evidence showed them, under
// the bundle in force; an event marks each change.
func (m *Monitor) judgeNode(ctx context.Context, b *Bundle) NodeState {
	m.mu.Lock()
	var ns NodeState
	if fails := nodeFailures(m.identity, b, m.Checker.MinTCB); len(fails) > 0 {
		ns = NodeState{Withheld: true, Reason: fails[0].reason, Message: fails[0].message}
		for _, f := range fails[1:] {
			ns.Message += "; " + f.message
		}
	}
	prev := m.node
	m.node = ns
	m.mu.Unlock()
	if ns != prev {
		if ns.Withheld {
			log.G(ctx).WithField("reason", ns.Reason).Warnf("re-attestation: this node falls below the policy; its capacity is withheld: %s", ns.Message)
			m.nodeEvent(ctx, "Warning", "TrustWithheld", ns.Message)
		} else {
			log.G(ctx).Info("re-attestation: this node satisfies the policy again; its capacity is advertised")
			m.nodeEvent(ctx, "Normal", "TrustRestored", "the node's chip and TCB satisfy the policy in force")
		}
	}
	return ns
}

func (m *Monitor) podEvent(ctx context.Context, p Pod, typ, reason, msg string) {
	if m.Reporter == nil || p.Name == "" {
		return
	}
	if err := m.Reporter.PodEvent(ctx, p, typ, reason, msg); err != nil {
		log.G(ctx).WithError(err).Warnf("re-attestation: event %s on pod %s", reason, p)
	}
}

func (m *Monitor) nodeEvent(ctx context.Context, typ, reason, msg string) {
	if m.Reporter == nil {
		return
	}
	if err := m.Reporter.NodeEvent(ctx, typ, reason, msg); err != nil {
		log.G(ctx).WithError(err).Warnf("re-attestation: event %s on the node", reason)
	}
}
