// Package labels turns a discovery result into what Kubernetes should
// know about the node (labels, a taint, extended resources) and computes
// the patch that brings a Node object there. Everything here is a pure
// function; the node agent does the I/O.
//
// # Labels
//
//	c8s.io/tee.snp=true     SEV-SNP pod VMs can run here (discovery.Result.SNPUsable)
//	c8s.io/tee.tdx=true     TDX pod VMs can run here
//	c8s.io/tee.sim=true     the node offers sim slots
//	c8s.io/trust-pool=NAME  configured (node.trust_pool), else the node's TEE
//	c8s.io/trust-shape=pod-as-cvm|node-as-cvm
//	c8s.io/node-tee=snp|tdx the TEE the node itself runs in (node-as-cvm only)
//	feature.node.kubernetes.io/cpu-security.sev.snp.enabled=true
//	feature.node.kubernetes.io/cpu-security.tdx.enabled=true
//	feature.node.kubernetes.io/cpu-security.sgx.enabled=true
//
// The Node Feature Discovery names mean what they mean in NFD: the feature
// is enabled in the host kernel, whether or not c8s can use it. They let
// existing selectors work without NFD installed.
//
// # Ownership
//
// c8s owns every label under "c8s.io/", and the NFD-named labels it set
// itself, which it lists in the node annotation c8s.io/owned-labels. An
// NFD-named label that exists without being listed there belongs to NFD or
// an administrator: c8s leaves it alone, even when it disagrees. Labels c8s
// owns that no longer hold are removed; no other label is ever touched.
//
// # Taint
//
// Nodes that offer snp, tdx or sim pod VMs get the configured taint
// (default c8s.io/confidential=true:NoSchedule), so only pods that
// tolerate it (the c8s RuntimeClasses add the toleration) use the scarce
// capacity. A node that is itself a CVM but offers no pod VMs is not
// tainted: its ordinary pods are already confidential. c8s owns taints
// whose key is under "c8s.io/" or is the configured taint's key.
//
// # Extended resources
//
// c8s.io/snp-asid, c8s.io/tdx-key and c8s.io/sim-slot are advertised by
// the device plugin (launcher/node/deviceplugin), one device per ASID, key or
// slot. sgx.intel.com/epc is counted in bytes, as Intel's SGX plugin does,
// which is too many units for devices: the node agent writes it into the
// Node's status capacity instead. nvidia.com/confidential-gpu, and the
// NVIDIA GPU labels, are in gpu.go.
package labels

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

// Label keys and values.
const (
	Prefix          = "c8s.io/"
	LabelSNP        = "c8s.io/tee.snp"
	LabelTDX        = "c8s.io/tee.tdx"
	LabelSim        = "c8s.io/tee.sim"
	LabelTrustPool  = "c8s.io/trust-pool"
	LabelTrustShape = "c8s.io/trust-shape"
	LabelNodeTEE    = "c8s.io/node-tee"

	NFDSNP = "feature.node.kubernetes.io/cpu-security.sev.snp.enabled"
	NFDTDX = "feature.node.kubernetes.io/cpu-security.tdx.enabled"
	NFDSGX = "feature.node.kubernetes.io/cpu-security.sgx.enabled"

	// OwnedLabelsAnnotation lists, comma-separated, the labels outside
	// "c8s.io/" that c8s set on the node.
	OwnedLabelsAnnotation = "c8s.io/owned-labels"

	ShapePodAsCVM  = "pod-as-cvm"
	ShapeNodeAsCVM = "node-as-cvm"
)

// Extended resource names.
const (
	ResourceSNPASID = "c8s.io/snp-asid"
	ResourceTDXKey  = "c8s.io/tdx-key"
	ResourceSimSlot = "c8s.io/sim-slot"
	ResourceSGXEPC  = "sgx.intel.com/epc"
)

// Taint effects Kubernetes knows.
var taintEffects = []string{"NoSchedule", "PreferNoSchedule", "NoExecute"}

// Taint is a Kubernetes node taint.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

func (t Taint) String() string {
	if t.Value == "" {
		return t.Key + ":" + t.Effect
	}
	return t.Key + "=" + t.Value + ":" + t.Effect
}

var (
	qualifiedName = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	labelValue    = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)
)

// validKey checks a label or taint key: an optional DNS subdomain prefix
// (at most 253 characters) and a name of at most 63 characters.
func validKey(k string) bool {
	prefix, name, found := strings.Cut(k, "/")
	if !found {
		name, prefix = prefix, ""
	}
	return qualifiedName.MatchString(k) && len(name) <= 63 && len(prefix) <= 253
}

func validValue(v string) bool { return len(v) <= 63 && labelValue.MatchString(v) }

// ParseTaint parses "key=value:Effect" or "key:Effect" (kubectl taint's
// syntax). The empty string means no taint: (nil, nil).
func ParseTaint(s string) (*Taint, error) {
	if s == "" {
		return nil, nil
	}
	kv, effect, ok := strings.Cut(s, ":")
	if !ok {
		return nil, fmt.Errorf("taint %q has no effect: write key=value:NoSchedule (or PreferNoSchedule, NoExecute)", s)
	}
	key, value, _ := strings.Cut(kv, "=")
	t := Taint{Key: key, Value: value, Effect: effect}
	if !validKey(key) {
		return nil, fmt.Errorf("taint %q: %q is not a valid key (prefix/name, name up to 63 characters of [A-Za-z0-9_.-])", s, key)
	}
	if !validValue(value) {
		return nil, fmt.Errorf("taint %q: %q is not a valid value (up to 63 characters of [A-Za-z0-9_.-])", s, value)
	}
	found := false
	for _, e := range taintEffects {
		found = found || e == effect
	}
	if !found {
		return nil, fmt.Errorf("taint %q: effect %q is not one of %s", s, effect, strings.Join(taintEffects, ", "))
	}
	return &t, nil
}

// SettingsFromConfig validates and returns the config's [node] choices.
func SettingsFromConfig(n config.Node) (Settings, error) {
	return NewSettings(n.TrustPool, n.Taint)
}

// Settings are the node agent's configured choices (config [node] table).
type Settings struct {
	// TrustPool is the c8s.io/trust-pool value; empty derives it from the
	// node's TEE.
	TrustPool string
	// Taint is put on nodes with pod-VM capacity; nil for none.
	Taint *Taint
}

// NewSettings validates the configured trust pool and taint (the
// config's node.trust_pool and node.taint).
func NewSettings(trustPool, taint string) (Settings, error) {
	if !validValue(trustPool) {
		return Settings{}, fmt.Errorf("node.trust_pool %q is not a valid label value: up to 63 characters of [A-Za-z0-9_.-], starting and ending alphanumeric", trustPool)
	}
	t, err := ParseTaint(taint)
	if err != nil {
		return Settings{}, fmt.Errorf("node.taint: %w", err)
	}
	return Settings{TrustPool: trustPool, Taint: t}, nil
}

// Resource is one extended resource the node should advertise.
type Resource struct {
	Name  string `json:"name"`
	Count int64  `json:"count"`
	// DevicePlugin is true for resources served by launcher/node/deviceplugin
	// (one device per unit); false for those written to the Node's status
	// capacity (sgx.intel.com/epc, in bytes).
	DevicePlugin bool `json:"devicePlugin"`
}

// Desired is the state the node should have in Kubernetes.
type Desired struct {
	Labels    map[string]string `json:"labels"`
	Taint     *Taint            `json:"taint"`
	Resources []Resource        `json:"resources"`
}

// Desire computes labels, taint and resources from a discovery result.
func Desire(r discovery.Result, s Settings) Desired {
	l := map[string]string{}
	var res []Resource
	if r.SNPUsable() {
		l[LabelSNP] = "true"
		res = append(res, Resource{Name: ResourceSNPASID, Count: r.SNP.ASIDs.Total, DevicePlugin: true})
	}
	if r.TDXUsable() {
		l[LabelTDX] = "true"
		res = append(res, Resource{Name: ResourceTDXKey, Count: r.TDX.Keys.Total, DevicePlugin: true})
	}
	if r.Sim.Slots > 0 {
		l[LabelSim] = "true"
		res = append(res, Resource{Name: ResourceSimSlot, Count: r.Sim.Slots, DevicePlugin: true})
	}
	if r.SGXUsable() {
		res = append(res, Resource{Name: ResourceSGXEPC, Count: r.SGX.EPCBytes.Total})
	}
	podVMs := len(l) > 0
	// GPUs go to pod VMs: they neither make the node one that offers pod
	// VMs (the taint) nor count without them.
	if gpus := desireGPUs(l, r.GPU); podVMs {
		res = append(res, gpus...)
	}
	if r.SNP.Enabled {
		l[NFDSNP] = "true"
	}
	if r.TDX.Enabled {
		l[NFDTDX] = "true"
	}
	if r.SGX.Enabled {
		l[NFDSGX] = "true"
	}
	pool := ""
	switch {
	case r.NodeCVM.TEE != "":
		l[LabelTrustShape] = ShapeNodeAsCVM
		l[LabelNodeTEE] = r.NodeCVM.TEE
		pool = r.NodeCVM.TEE
	case podVMs:
		l[LabelTrustShape] = ShapePodAsCVM
		switch {
		case r.SNPUsable():
			pool = discovery.SNP
		case r.TDXUsable():
			pool = discovery.TDX
		default:
			pool = discovery.Sim
		}
	}
	if pool != "" {
		if s.TrustPool != "" {
			pool = s.TrustPool
		}
		l[LabelTrustPool] = pool
	}
	d := Desired{Labels: l, Resources: res}
	if podVMs {
		d.Taint = s.Taint
	}
	return d
}

// Node is the part of a Node object reconciliation reads.
type Node struct {
	Labels      map[string]string
	Annotations map[string]string
	Taints      []Taint
}

// Patch is what changes on the Node.
type Patch struct {
	// SetLabels are labels to add or change.
	SetLabels map[string]string
	// RemoveLabels are owned labels that no longer hold, sorted.
	RemoveLabels []string
	// OwnedLabels is the new OwnedLabelsAnnotation value; only meaningful
	// when OwnedChanged.
	OwnedLabels  string
	OwnedChanged bool
	// Taints is the node's complete new taint list (foreign taints kept in
	// order); only meaningful when TaintsChanged.
	Taints        []Taint
	TaintsChanged bool
}

// Empty is true when the node is already as desired.
func (p Patch) Empty() bool {
	return len(p.SetLabels) == 0 && len(p.RemoveLabels) == 0 && !p.OwnedChanged && !p.TaintsChanged
}

// Reconcile returns the patch that takes node from its current state to
// the desired one, touching only what c8s owns (see the package doc).
// taintKey is the configured taint's key, owned even outside "c8s.io/"
// (empty when no taint is configured).
func Reconcile(node Node, want Desired, taintKey string) Patch {
	var p Patch
	ownedBefore := splitOwned(node.Annotations[OwnedLabelsAnnotation])
	owns := func(k string) bool { return strings.HasPrefix(k, Prefix) || ownedBefore[k] }
	ownedAfter := map[string]bool{}
	for k, v := range want.Labels {
		cur, exists := node.Labels[k]
		if exists && !owns(k) {
			continue // NFD's or an administrator's: leave it
		}
		if !strings.HasPrefix(k, Prefix) {
			ownedAfter[k] = true
		}
		if !exists || cur != v {
			if p.SetLabels == nil {
				p.SetLabels = map[string]string{}
			}
			p.SetLabels[k] = v
		}
	}
	for k := range node.Labels {
		if _, wanted := want.Labels[k]; !wanted && owns(k) {
			p.RemoveLabels = append(p.RemoveLabels, k)
		}
	}
	sort.Strings(p.RemoveLabels)
	p.OwnedLabels = joinOwned(ownedAfter)
	_, had := node.Annotations[OwnedLabelsAnnotation]
	p.OwnedChanged = p.OwnedLabels != node.Annotations[OwnedLabelsAnnotation] && (had || p.OwnedLabels != "")

	ownsTaint := func(t Taint) bool { return strings.HasPrefix(t.Key, Prefix) || (taintKey != "" && t.Key == taintKey) }
	var taints []Taint
	for _, t := range node.Taints {
		if !ownsTaint(t) {
			taints = append(taints, t)
		}
	}
	if want.Taint != nil {
		taints = append(taints, *want.Taint)
	}
	if !sameTaints(node.Taints, taints) {
		p.Taints, p.TaintsChanged = taints, true
	}
	return p
}

// sameTaints compares as sets: Kubernetes does not order taints.
func sameTaints(a, b []Taint) bool {
	if len(a) != len(b) {
		return false
	}
	seen := map[Taint]int{}
	for _, t := range a {
		seen[t]++
	}
	for _, t := range b {
		if seen[t] == 0 {
			return false
		}
		seen[t]--
	}
	return true
}

func splitOwned(s string) map[string]bool {
	m := map[string]bool{}
	for _, k := range strings.Split(s, ",") {
		if k = strings.TrimSpace(k); k != "" {
			m[k] = true
		}
	}
	return m
}

func joinOwned(m map[string]bool) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}
