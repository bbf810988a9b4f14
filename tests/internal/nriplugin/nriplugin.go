// Package nriplugin is a tiny NRI plugin for the end-to-end tests, run in
// the test's process and connected to a private containerd's NRI socket
// (containerdtest.Options.NRI). For containers carrying its annotation it
// adjusts the OCI spec as device and resource-management plugins do: the
// annotation's value lists what, comma-separated: "cpuset" sets
// linux.resources.cpu.cpus to Options.CPUs, any other word injects the
// device Options.Devices names so (linux.devices and its device cgroup
// rule, as containerd's NRI adaptation writes them).
package nriplugin

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// Annotation selects the containers the plugin adjusts.
const Annotation = "c8s.test/nri"

// Options configures the plugin.
type Options struct {
	// Socket is containerd's NRI socket.
	Socket string
	// Devices are the devices to inject, by the annotation word asking.
	Devices map[string]Device
	// CPUs is the cpuset "cpuset" sets.
	CPUs string
}

// Device is a device to inject.
type Device struct {
	Path         string
	Type         string // c or b
	Major, Minor int64
	Mode         os.FileMode
}

// Plugin is a running plugin.
type Plugin struct {
	o    Options
	stub stub.Stub

	mu       sync.Mutex
	adjusted []string // names of the containers adjusted
}

// Start connects the plugin to containerd and stops it at cleanup.
func Start(t testing.TB, o Options) *Plugin {
	t.Helper()
	p := &Plugin{o: o}
	s, err := stub.New(p, stub.WithPluginName("c8s-e2e"), stub.WithPluginIdx("50"), stub.WithSocketPath(o.Socket))
	if err != nil {
		t.Fatalf("create the NRI plugin: %v", err)
	}
	p.stub = s
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Start(ctx); err != nil {
		t.Fatalf("start the NRI plugin on %s: %v", o.Socket, err)
	}
	t.Cleanup(s.Stop)
	return p
}

// Adjusted returns the names of the containers the plugin adjusted.
func (p *Plugin) Adjusted() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.adjusted)
}

// CreateContainer adjusts a container that carries Annotation.
func (p *Plugin) CreateContainer(_ context.Context, _ *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	what, ok := c.GetAnnotations()[Annotation]
	if !ok {
		return nil, nil, nil
	}
	adj := &api.ContainerAdjustment{}
	for _, w := range strings.Split(what, ",") {
		if w == "cpuset" {
			adj.SetLinuxCPUSetCPUs(p.o.CPUs)
			continue
		}
		d, ok := p.o.Devices[w]
		if !ok {
			return nil, nil, fmt.Errorf("nriplugin: container %s: unknown adjustment %q in annotation %s", c.GetName(), w, Annotation)
		}
		adj.AddDevice(&api.LinuxDevice{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor, FileMode: api.FileMode(d.Mode)})
	}
	p.mu.Lock()
	p.adjusted = append(p.adjusted, c.GetName())
	p.mu.Unlock()
	return adj, nil, nil
}
