package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/c8s-dev/c8s/launcher/node"
	"github.com/c8s-dev/c8s/launcher/node/cvm"
	"github.com/c8s-dev/c8s/launcher/node/deviceplugin"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
	"github.com/c8s-dev/c8s/launcher/node/reattest"
)

func init() {
	register("node-agent", "report the node's TEE capacity to Kubernetes (labels, taint, extended resources), serve its device plugins and re-attest its running pods, continuously", runNodeAgent)
}

// Kubelet paths the node agent uses by default.
const (
	defaultDevicePluginDir    = "/var/lib/kubelet/device-plugins"
	defaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"
)

func runNodeAgent(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("node-agent")
	cfgPath := fs.String("config", "", "c8s configuration file (TOML; its [node] table); default: built-in defaults")
	root := fs.String("root", "/", "filesystem root to read sysfs, procfs and /dev under")
	probe := fs.Bool("probe-kvm", false, "run (or reuse the cached) KVM probe with hypervisor.kernel before reporting")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file; default: the pod's service account")
	nodeName := fs.String("node-name", os.Getenv("NODE_NAME"), "name of this node's Node object (default $NODE_NAME)")
	pluginDir := fs.String("device-plugin-dir", defaultDevicePluginDir, "kubelet device-plugins directory; empty to publish labels only")
	podResources := fs.String("pod-resources-socket", defaultPodResourcesSocket, "kubelet PodResources socket: devices allocated to containers are never held back as in use; empty when there is none")
	interval := fs.Duration("interval", node.DefaultInterval, "time between reconciliations")
	cvmInterval := fs.Duration("node-cvm-interval", node.DefaultNodeCVMInterval, "how long a node-as-CVM's verified self-attestation stands before it attests itself again")
	once := fs.Bool("once", false, "reconcile once, print what was done (JSON) and exit; device plugins are not served")
	rf := addReattestFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, settings, err := loadAgentConfig(*cfgPath)
	if err != nil {
		return err
	}
	opts, err := nodeDiscoveryOptions(ctx, cfg, *root, *probe)
	if err != nil {
		return err
	}
	cvmPolicy, err := cvm.PolicyFromConfig(cfg.Attestation)
	if err != nil {
		return err
	}
	client, err := node.NewKubeClient(*kubeconfig, *nodeName)
	if err != nil {
		return err
	}
	a := &node.Agent{
		Client:             client,
		Discover:           func() (discovery.Result, error) { return discovery.Discover(opts) },
		Settings:           settings,
		PodResourcesSocket: *podResources,
		StateRoot:          filepath.Join(*root, cfg.Runtime.StateDir),
		ProcRoot:           filepath.Join(*root, "proc"),
		Interval:           *interval,
		NodeCVM: func(c discovery.NodeCVMInfo) (*cvm.Attester, error) {
			return cvm.New(*root, c, cvmPolicy)
		},
		NodeCVMInterval: *cvmInterval,
	}
	monitor, closeMonitor, err := rf.monitor(cfg, *root, client)
	if err != nil {
		return err
	}
	defer closeMonitor()
	if monitor != nil {
		a.Trust = monitor
	}
	if *once {
		var pass *reattest.Pass
		if monitor != nil {
			p, err := monitor.Once(ctx)
			if err != nil {
				return err
			}
			pass = &p
		}
		rep, err := a.Once(ctx)
		if err != nil {
			return err
		}
		out, err := json.MarshalIndent(onceReport{Desired: rep.Desired, Patch: rawOrNull(rep.Patched), StatusPatch: rawOrNull(rep.StatusPatched),
			NodeCVMPatch: rawOrNull(rep.NodeCVMPatched), Reattest: reattestReport(pass)}, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "%s\n", out)
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *pluginDir != "" {
		a.Plugins = deviceplugin.NewManager(ctx, *pluginDir)
	}
	if monitor != nil {
		done := make(chan struct{})
		go func() { defer close(done); monitor.Run(ctx) }()
		defer func() { <-done }()
	}
	return a.Run(ctx)
}

// onceReport is what `node-agent --once` prints.
type onceReport struct {
	Desired     any             `json:"desired"`
	Patch       json.RawMessage `json:"patch"`
	StatusPatch json.RawMessage `json:"statusPatch"`
	// NodeCVMPatch is the c8s.io/node-cvm.* annotation patch.
	NodeCVMPatch json.RawMessage `json:"nodeCVMPatch"`
	// Reattest is the re-attestation pass (null: off).
	Reattest *onceReattest `json:"reattest"`
}

// onceReattest is a re-attestation pass as `node-agent --once` prints it.
type onceReattest struct {
	Bundle   uint64             `json:"bundle"`
	Rejected []string           `json:"rejected,omitempty"`
	Pods     []oncePod          `json:"pods"`
	Node     reattest.NodeState `json:"node"`
}

type oncePod struct {
	Sandbox string          `json:"sandbox"`
	Pod     string          `json:"pod,omitempty"`
	Status  reattest.Status `json:"status"`
	Reason  string          `json:"reason"`
	Message string          `json:"message"`
	Stopped bool            `json:"stopped,omitempty"`
}

func reattestReport(p *reattest.Pass) *onceReattest {
	if p == nil {
		return nil
	}
	out := &onceReattest{Bundle: p.Bundle, Node: p.Node, Pods: []oncePod{}}
	for _, err := range p.Rejected {
		out.Rejected = append(out.Rejected, err.Error())
	}
	for _, r := range p.Results {
		pod := ""
		if r.Pod.Name != "" {
			pod = r.Pod.String()
		}
		out.Pods = append(out.Pods, oncePod{Sandbox: r.Sandbox.ID, Pod: pod, Status: r.Verdict.Status, Reason: r.Verdict.Reason, Message: r.Verdict.Message, Stopped: r.Stopped})
	}
	return out
}

func rawOrNull(b []byte) json.RawMessage {
	if b == nil {
		return json.RawMessage("null")
	}
	return b
}
