// Package node is the node agent, the loop behind `c8s-launcher node-agent`: it
// discovers the node's TEE capacity, brings the Node object's labels,
// taint and extended-resource capacity in line (launcher/node/labels), and
// serves the per-unit resources through kubelet device plugins
// (launcher/node/deviceplugin), and, on a node that is itself a confidential
// VM, publishes its verified launch digest and TCB as annotations
// (launcher/node/cvm), again and again, so that what Kubernetes sees
// follows the node. Beside it, the re-attestation monitor
// (launcher/node/reattest) re-attests the node's running pods and, when
// the node's own chip or TCB falls below the owners' policy, the agent
// withholds its capacity (Agent.Trust).
//
// The Kubernetes API is behind the Client interface (the agent needs only
// to read its Node and send JSON merge patches), so the loop is tested
// against an in-memory node here and the API client lives with the
// command.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/node/cvm"
	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/labels"
	"github.com/c8s-dev/c8s/launcher/node/reattest"
)

// DefaultInterval is how often Run reconciles.
const DefaultInterval = 30 * time.Second

// Client reads and patches this node's Node object.
type Client interface {
	// Node returns the node's labels, annotations, taints and status
	// capacity.
	Node(ctx context.Context) (labels.Node, map[string]string, error)
	// Patch applies a JSON merge patch to the Node object.
	Patch(ctx context.Context, patch []byte) error
	// PatchStatus applies a JSON merge patch to the Node's status
	// subresource.
	PatchStatus(ctx context.Context, patch []byte) error
}

// Agent is one node's reporter.
type Agent struct {
	// Client reaches the Node object.
	Client Client
	// Discover finds the node's capacity (discovery.Discover with the
	// node's options).
	Discover func() (discovery.Result, error)
	// Settings are the configured trust pool and taint.
	Settings labels.Settings
	// Plugins serves the per-unit resources; nil to publish labels only.
	Plugins *deviceplugin.Manager
	// PodResourcesSocket is the kubelet's PodResources API, to keep the
	// devices allocated to containers healthy; empty when there is none.
	PodResourcesSocket string
	// StateRoot is where the node's pod VMs keep their state
	// (runtime.state_dir) and ProcRoot the host's /proc (default
	// "/proc"): the live pod VMs found there hold their ASID, key or slot
	// even when Kubernetes no longer counts their pod. Empty StateRoot: not
	// scanned.
	StateRoot, ProcRoot string
	// Interval between reconciliations (default DefaultInterval).
	Interval time.Duration
	// NodeCVM returns the self-attester of a node that discovery found to
	// be a confidential VM (cvm.New with the node's root and policy);
	// nil leaves the c8s.io/node-cvm.* annotations alone.
	NodeCVM func(discovery.NodeCVMInfo) (*cvm.Attester, error)
	// NodeCVMInterval is how long a successful self-attestation stands
	// (default DefaultNodeCVMInterval).
	NodeCVMInterval time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// Trust is the node's standing under the pod owners' policy, as the
	// re-attestation of its pods finds it (a *reattest.Monitor); when it
	// is withheld the node advertises no capacity (labels.Withhold) and
	// says why in the c8s.io/trust-withheld annotation. nil: not judged.
	Trust interface{ Node() reattest.NodeState }

	cvm selfAttest
	// lastDevices are the device lists last served, kept when usage
	// cannot be accounted for a while.
	lastDevices map[string][]deviceplugin.Device
	lastUsage   map[string]deviceplugin.Usage
}

// PodCounter is implemented by Clients that can tell what the scheduler
// counts against the node.
type PodCounter interface {
	// PodUnits returns, per resource, the units the scheduler counts for
	// the pods bound to this node that have not terminated: their
	// RuntimeClass overhead plus their containers' requests.
	PodUnits(ctx context.Context) (map[string]int64, error)
}

// Report is what one reconciliation did.
type Report struct {
	Desired labels.Desired
	// Patched and StatusPatched are the merge patches sent (nil: none).
	Patched, StatusPatched []byte
	// Usage is the accounting of each device-plugin resource: units in
	// use, counted by the scheduler, and devices reserved (unhealthy)
	// for the difference.
	Usage map[string]deviceplugin.Usage
	// VMs are the pod VMs found under StateRoot.
	VMs []deviceplugin.VM
	// NodeCVM is the node's self-attestation (nil: not a CVM, or not
	// configured) and NodeCVMPatched the annotation patch sent (nil: none).
	NodeCVM        *cvm.Result
	NodeCVMPatched []byte
	// Withheld is the node's standing when it falls below the policy
	// (nil: it does not, or is not judged); WithheldPatched is the
	// annotation patch sent (nil: none).
	Withheld        *reattest.NodeState
	WithheldPatched []byte
}

// Once reconciles one time.
func (a *Agent) Once(ctx context.Context) (Report, error) {
	var rep Report
	r, err := a.Discover()
	if err != nil {
		return rep, fmt.Errorf("node-agent: discovery: %w", err)
	}
	rep.Desired = labels.Desire(r, a.Settings)
	withheld := ""
	if a.Trust != nil {
		if ns := a.Trust.Node(); ns.Withheld {
			rep.Withheld = &ns
			rep.Desired = labels.Withhold(rep.Desired, ns.Reason)
			withheld = ns.Reason + ": " + ns.Message
		}
	}
	node, capacity, err := a.Client.Node(ctx)
	if err != nil {
		return rep, fmt.Errorf("node-agent: reading the Node: %w", err)
	}
	taintKey := ""
	if a.Settings.Taint != nil {
		taintKey = a.Settings.Taint.Key
	}
	patch, err := labels.Reconcile(node, rep.Desired, taintKey).MergePatch()
	if err != nil {
		return rep, err
	}
	if patch != nil {
		if err := a.Client.Patch(ctx, patch); err != nil {
			return rep, fmt.Errorf("node-agent: patching the Node: %w", err)
		}
		rep.Patched = patch
	}
	if a.Trust != nil {
		if ann := labels.WithheldAnnotation(node.Annotations, withheld); ann != nil {
			b, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": ann}})
			if err != nil {
				return rep, err
			}
			if err := a.Client.Patch(ctx, b); err != nil {
				return rep, fmt.Errorf("node-agent: patching the trust-withheld annotation: %w", err)
			}
			rep.WithheldPatched = b
		}
	}
	if a.NodeCVM != nil {
		want, res := a.nodeCVMAnnotations(ctx, r.NodeCVM)
		rep.NodeCVM = res
		if rep.NodeCVMPatched, err = cvm.MergePatch(node.Annotations, want); err != nil {
			return rep, err
		}
		if rep.NodeCVMPatched != nil {
			if err := a.Client.Patch(ctx, rep.NodeCVMPatched); err != nil {
				return rep, fmt.Errorf("node-agent: patching the node-as-CVM annotations: %w", err)
			}
		}
	}
	if rep.StatusPatched, err = statusPatch(capacity, rep.Desired.Resources); err != nil {
		return rep, err
	}
	if rep.StatusPatched != nil {
		if err := a.Client.PatchStatus(ctx, rep.StatusPatched); err != nil {
			return rep, fmt.Errorf("node-agent: patching the Node status: %w", err)
		}
	}
	if a.Plugins != nil {
		want, usage, vms := a.devices(ctx, r, rep.Desired.Resources)
		rep.Usage, rep.VMs = usage, vms
		if err := a.Plugins.Update(want); err != nil {
			return rep, fmt.Errorf("node-agent: device plugins: %w", err)
		}
	}
	return rep, nil
}

// Run reconciles every Interval until ctx ends, logging failures, and
// stops the device plugins at the end.
func (a *Agent) Run(ctx context.Context) error {
	interval := a.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	if a.Plugins != nil {
		defer a.Plugins.Stop()
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := a.Once(ctx); err != nil {
			log.G(ctx).WithError(err).Warn("node-agent: reconciliation failed; retrying")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// vmKinds are the pod VM kinds holding a unit of each resource.
var vmKinds = map[string]string{
	labels.ResourceSNPASID: deviceplugin.VMSNP,
	labels.ResourceTDXKey:  deviceplugin.VMTDX,
	labels.ResourceSimSlot: deviceplugin.VMSim,
}

// devices returns the device list per device-plugin resource, with the
// units in use that the scheduler does not count marked unhealthy (see
// launcher/node/deviceplugin, "What is accounted"). When the pods' units or the
// containers' devices cannot be read, the previous list of the resource
// is kept.
func (a *Agent) devices(ctx context.Context, r discovery.Result, res []labels.Resource) (map[string][]deviceplugin.Device, map[string]deviceplugin.Usage, []deviceplugin.VM) {
	hostUsed := map[string]discovery.Capacity{
		labels.ResourceSNPASID: r.SNP.ASIDs,
		labels.ResourceTDXKey:  r.TDX.Keys,
	}
	var vms []deviceplugin.VM
	if a.StateRoot != "" {
		procRoot := a.ProcRoot
		if procRoot == "" {
			procRoot = "/proc"
		}
		var err error
		if vms, err = deviceplugin.ScanVMs(a.StateRoot, procRoot); err != nil {
			log.G(ctx).WithError(err).Warn("node-agent: live pod VMs are not accounted")
		}
	}
	live := deviceplugin.CountLive(vms)
	counted, countErr := map[string]int64(nil), errors.New("the Kubernetes client cannot list pods")
	if pc, ok := a.Client.(PodCounter); ok {
		counted, countErr = pc.PodUnits(ctx)
	}
	want := map[string][]deviceplugin.Device{}
	usage := map[string]deviceplugin.Usage{}
	for _, x := range res {
		if !x.DevicePlugin {
			continue
		}
		devs := deviceplugin.DevicesFor(x.Name, x.Count, labels.DeviceIDs(r, x.Name))
		u := deviceplugin.Usage{HostUsed: -1, LiveVMs: live[vmKinds[x.Name]]}
		if c := hostUsed[x.Name]; c.UsedKnown {
			u.HostUsed = c.Used
		}
		held, err := map[string]deviceplugin.Holder{}, countErr
		if err == nil && a.PodResourcesSocket != "" {
			held, err = deviceplugin.HeldDevices(ctx, a.PodResourcesSocket, x.Name)
		}
		if err == nil {
			u.Counted = counted[x.Name]
			devs, u = deviceplugin.ReserveUncounted(devs, held, u)
		} else {
			log.G(ctx).WithError(err).Warnf("node-agent: %s: usage not accounted this time; keeping the previous device list", x.Name)
			if prev, ok := a.lastDevices[x.Name]; ok && len(prev) == len(devs) {
				devs = prev
			}
			u.Devices = int64(len(devs))
			for _, d := range devs {
				if !d.Healthy {
					u.Reserved++
				}
			}
		}
		if prev := a.lastUsage[x.Name]; prev.Reserved != u.Reserved {
			log.G(ctx).Infof("node-agent: %s: %d of %d held back as in use beyond what the scheduler counts (in use %d: live pod VMs %d, host-wide %d; counted %d)",
				x.Name, u.Reserved, u.Devices, u.InUse(), u.LiveVMs, u.HostUsed, u.Counted)
		}
		want[x.Name], usage[x.Name] = devs, u
	}
	a.lastDevices, a.lastUsage = want, usage
	return want, usage, vms
}

// statusPatch returns the merge patch that sets the status capacity of
// the resources not served by device plugins (sgx.intel.com/epc) and
// removes it when gone, or nil when the capacity is already right.
func statusPatch(current map[string]string, res []labels.Resource) ([]byte, error) {
	capacity := map[string]any{}
	wanted := map[string]bool{}
	for _, x := range res {
		if x.DevicePlugin {
			continue
		}
		wanted[x.Name] = true
		v := strconv.FormatInt(x.Count, 10)
		if current[x.Name] != v {
			capacity[x.Name] = v
		}
	}
	for _, name := range statusOwned {
		if _, has := current[name]; has && !wanted[name] {
			capacity[name] = nil
		}
	}
	if len(capacity) == 0 {
		return nil, nil
	}
	// Allocatable follows capacity: nothing is reserved from these.
	b, err := json.Marshal(map[string]any{"status": map[string]any{"capacity": capacity, "allocatable": capacity}})
	if err != nil {
		return nil, errors.New("node-agent: encoding the status patch: " + err.Error())
	}
	return b, nil
}

// statusOwned are the status capacities the agent manages.
var statusOwned = []string{labels.ResourceSGXEPC}
