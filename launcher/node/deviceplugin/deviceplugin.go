// Package deviceplugin advertises c8s's countable TEE capacity to the
// kubelet as extended resources, through the kubelet device plugin API
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1): c8s.io/snp-asid,
// c8s.io/tdx-key and c8s.io/sim-slot, one device per ASID, key or slot.
//
// One Plugin serves one resource on its own unix socket in the kubelet's
// device-plugins directory and registers it with the kubelet's
// Registration service (kubelet.sock in the same directory). Run keeps it
// registered: when the kubelet restarts it deletes the plugin sockets and
// re-creates kubelet.sock; the plugin notices (fsnotify on the directory,
// and a periodic check as a safety net), serves a fresh socket and
// registers again.
//
// ListAndWatch streams the device list with each device's health and
// sends a new list whenever SetDevices changes it. Allocate hands the
// container the device IDs in an environment variable (C8S_SIM_SLOT,
// C8S_SNP_ASID, C8S_TDX_KEY) and an annotation named like the resource
// (c8s.io/sim-slot=sim-slot-3), so the runtime can tell which slot a pod
// holds.
//
// # What is accounted
//
// A pod VM holds its ASID, TDX key or sim slot from its start until its
// QEMU exits, which can be later than Kubernetes thinks: the c8s
// RuntimeClasses take the unit as pod overhead, which the scheduler counts
// while the pod object exists and has not terminated, and the kubelet's
// device manager allocates devices only to containers that request the
// resource (Allocate, HeldDevices), until their pod ends. A VM whose pod
// is gone (a leaked VM after a shim crash, a VM still stopping) and a VM
// outside Kubernetes still hold their unit.
//
// So the node agent accounts for every unit in use, not only the ones
// Kubernetes knows: ScanVMs finds the live pod VMs from their state
// directories under runtime.state_dir (statedir.PidFile, checked against the
// process's command line), discovery reads the host-wide usage from the
// misc cgroup (misc.current "sev_es" and "tdx"), and ReserveUncounted
// marks as many devices unhealthy as units are in use (the larger of the
// two) beyond what the scheduler counts for the node's live pods, so
// ListAndWatch offers only units that are really free. Devices allocated
// to containers are never marked. A device is advertised per unit of
// capacity, not per hardware object: "snp-asid-7" is a token, not ASID 7.
package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/containerd/log"
	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// KubeletSocketName is the kubelet's registration socket in the
// device-plugins directory.
const KubeletSocketName = "kubelet.sock"

// RecheckInterval is how often Run checks the sockets even without a
// filesystem event.
const RecheckInterval = 10 * time.Second

// Device is one unit of the resource.
type Device struct {
	ID      string
	Healthy bool
}

// Devices returns n healthy devices named "<name>-0" … "<name>-(n-1)",
// where name is the resource name without its domain.
func Devices(resource string, n int64) []Device {
	name := shortName(resource)
	out := make([]Device, 0, max(n, 0))
	for i := int64(0); i < n; i++ {
		out = append(out, Device{ID: fmt.Sprintf("%s-%d", name, i), Healthy: true})
	}
	return out
}

// Options configure a Plugin.
type Options struct {
	// ResourceName is the extended resource, e.g. "c8s.io/sim-slot".
	ResourceName string
	// Dir is the kubelet's device-plugins directory (default
	// /var/lib/kubelet/device-plugins).
	Dir string
	// Socket is the plugin's socket file name in Dir (default
	// "c8s-<name>.sock", e.g. c8s-sim-slot.sock).
	Socket string
	// EnvName is the variable Allocate sets to the comma-separated device
	// IDs (default "C8S_<NAME>", e.g. C8S_SIM_SLOT).
	EnvName string
	// Devices is the initial device list.
	Devices []Device
}

// Plugin serves one resource to the kubelet.
type Plugin struct {
	opts Options

	mu          sync.Mutex
	devices     []Device
	changed     chan struct{} // closed and replaced when devices change
	allocations map[string]time.Time
	server      *grpc.Server
	registered  os.FileInfo // the kubelet socket registered with
	registers   int

	// stat is os.Stat; tests interpose on it to order the plugin's looks
	// at the directory against a kubelet restart.
	stat func(string) (os.FileInfo, error)

	pluginapi.UnimplementedDevicePluginServer
}

// New validates opts and returns a Plugin; Run serves it.
func New(opts Options) (*Plugin, error) {
	if !strings.Contains(opts.ResourceName, "/") || strings.HasSuffix(opts.ResourceName, "/") {
		return nil, fmt.Errorf("deviceplugin: resource name %q must be domain/name, e.g. c8s.io/sim-slot", opts.ResourceName)
	}
	if opts.Dir == "" {
		opts.Dir = pluginapi.DevicePluginPath
	}
	name := shortName(opts.ResourceName)
	if opts.Socket == "" {
		opts.Socket = "c8s-" + name + ".sock"
	}
	if strings.Contains(opts.Socket, "/") || opts.Socket == KubeletSocketName {
		return nil, fmt.Errorf("deviceplugin: socket %q must be a plain file name other than %s", opts.Socket, KubeletSocketName)
	}
	if opts.EnvName == "" {
		opts.EnvName = "C8S_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
	}
	seen := map[string]bool{}
	for _, d := range opts.Devices {
		if d.ID == "" || seen[d.ID] {
			return nil, fmt.Errorf("deviceplugin: device ID %q is empty or repeated", d.ID)
		}
		seen[d.ID] = true
	}
	return &Plugin{
		opts:        opts,
		devices:     append([]Device(nil), opts.Devices...),
		changed:     make(chan struct{}),
		allocations: map[string]time.Time{},
		stat:        os.Stat,
	}, nil
}

// ResourceName is the resource this plugin serves.
func (p *Plugin) ResourceName() string { return p.opts.ResourceName }

// SocketPath is where the plugin serves.
func (p *Plugin) SocketPath() string { return filepath.Join(p.opts.Dir, p.opts.Socket) }

// SetDevices replaces the device list; open ListAndWatch streams receive it.
func (p *Plugin) SetDevices(devs []Device) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.devices = append([]Device(nil), devs...)
	close(p.changed)
	p.changed = make(chan struct{})
}

// Allocations returns the device IDs Allocate has handed out since the
// plugin started, sorted (see the package doc for what is not tracked).
func (p *Plugin) Allocations() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.allocations))
}

// Registrations is how many times the plugin registered with a kubelet.
func (p *Plugin) Registrations() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.registers
}

// Run serves the plugin and keeps it registered until ctx ends; then it
// stops the server and removes its socket. It returns an error only when
// the device-plugins directory cannot be watched or served in.
func (p *Plugin) Run(ctx context.Context) error {
	if err := os.MkdirAll(p.opts.Dir, 0o750); err != nil {
		return fmt.Errorf("deviceplugin: %w", err)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("deviceplugin: watching %s: %w", p.opts.Dir, err)
	}
	defer w.Close()
	if err := w.Add(p.opts.Dir); err != nil {
		return fmt.Errorf("deviceplugin: watching %s: %w", p.opts.Dir, err)
	}
	defer p.stopServer()
	if err := p.startServer(); err != nil {
		return err
	}
	tick := time.NewTicker(RecheckInterval)
	defer tick.Stop()
	// A failed registration is retried soon: the kubelet's socket file
	// appears (bind) a moment before it accepts connections (listen).
	backoff := retryMin
	for {
		var retry <-chan time.Time
		if p.check(ctx) {
			backoff = retryMin
		} else {
			retry = time.After(backoff)
			backoff = min(2*backoff, RecheckInterval)
		}
		select {
		case <-retry:
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("deviceplugin: the directory watch ended")
			}
			log.G(ctx).Debugf("deviceplugin %s: %s", p.opts.ResourceName, ev)
		case err := <-w.Errors:
			log.G(ctx).WithError(err).Warn("deviceplugin: directory watch error; checking the sockets")
		case <-tick.C:
		}
	}
}

// retryMin is the first delay before retrying a failed registration.
const retryMin = 50 * time.Millisecond

// check restarts the server if its socket is gone and registers when the
// kubelet socket is one the plugin has not registered with yet. It returns
// false when something failed and should be retried.
//
// A starting kubelet removes the plugin sockets before it creates its own
// (the device manager empties the directory, then listens), so check looks
// at the kubelet's socket first: a new kubelet seen there means the
// removal of the plugin's socket has happened and the second look sees it.
// Looking the other way round, a restart between the two looks would
// register a socket the new kubelet has just deleted, and the kubelet's
// dial of it fails (after its timeout) before the plugin tries again.
func (p *Plugin) check(ctx context.Context) bool {
	kubeletPath := filepath.Join(p.opts.Dir, KubeletSocketName)
	kubelet, kubeletErr := p.stat(kubeletPath)
	if _, err := p.stat(p.SocketPath()); err != nil {
		log.G(ctx).Infof("deviceplugin %s: socket %s is gone (kubelet restart?); serving a new one", p.opts.ResourceName, p.SocketPath())
		p.stopServer()
		if err := p.startServer(); err != nil {
			log.G(ctx).WithError(err).Error("deviceplugin: cannot serve")
			return false
		}
		p.setRegistered(nil)
	}
	if kubeletErr != nil {
		// No kubelet (yet, or it is restarting): its socket's creation
		// wakes Run up, and whatever socket comes next is a new kubelet.
		p.setRegistered(nil)
		return true
	}
	p.mu.Lock()
	done := sameSocket(p.registered, kubelet)
	p.mu.Unlock()
	if done {
		return true
	}
	if err := p.register(ctx); err != nil {
		// Not registered, even if the kubelet got the request: one that
		// went away before answering is a restart, and the next kubelet
		// is registered with afresh.
		log.G(ctx).WithError(err).Warnf("deviceplugin %s: registration with the kubelet failed; retrying", p.opts.ResourceName)
		return false
	}
	// The kubelet that answered is the one whose socket is there now (a
	// socket replaced since the first look belongs to a kubelet that was
	// dialled instead, and remembering the old one would register twice).
	// Should yet another restart come in between, it removed the plugin's
	// socket too, and the next check registers again.
	now, err := p.stat(kubeletPath)
	if err != nil {
		now = nil
	}
	p.mu.Lock()
	p.registered = now
	p.registers++
	p.mu.Unlock()
	log.G(ctx).Infof("deviceplugin: registered %s (%s) with the kubelet", p.opts.ResourceName, p.opts.Socket)
	return true
}

func (p *Plugin) setRegistered(fi os.FileInfo) {
	p.mu.Lock()
	p.registered = fi
	p.mu.Unlock()
}

// sameSocket reports whether a and b are the same socket file. Inode
// numbers are reused, so a re-created socket is told apart by its
// modification time too.
func sameSocket(a, b os.FileInfo) bool {
	return a != nil && b != nil && os.SameFile(a, b) && a.ModTime().Equal(b.ModTime())
}

func (p *Plugin) startServer() error {
	path := p.SocketPath()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("deviceplugin: removing stale socket: %w", err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("deviceplugin: serving on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("deviceplugin: %w", err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	p.mu.Lock()
	p.server = s
	p.mu.Unlock()
	go func() { _ = s.Serve(l) }()
	return nil
}

func (p *Plugin) stopServer() {
	p.mu.Lock()
	s := p.server
	p.server = nil
	p.mu.Unlock()
	if s != nil {
		s.Stop()
	}
	_ = os.Remove(p.SocketPath())
}

func (p *Plugin) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.opts.Dir, KubeletSocketName),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     p.opts.Socket,
		ResourceName: p.opts.ResourceName,
		Options:      p.options(),
	})
	return err
}

func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: false, GetPreferredAllocationAvailable: false}
}

// GetDevicePluginOptions implements the DevicePlugin service.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return p.options(), nil
}

// ListAndWatch implements the DevicePlugin service: the current list,
// then a new one after every SetDevices, until the kubelet hangs up.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream pluginapi.DevicePlugin_ListAndWatchServer) error {
	for {
		p.mu.Lock()
		devs, changed := p.devices, p.changed
		p.mu.Unlock()
		resp := &pluginapi.ListAndWatchResponse{}
		for _, d := range devs {
			health := pluginapi.Healthy
			if !d.Healthy {
				health = pluginapi.Unhealthy
			}
			resp.Devices = append(resp.Devices, &pluginapi.Device{ID: d.ID, Health: health})
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// Allocate implements the DevicePlugin service.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	known := map[string]bool{}
	for _, d := range p.devices {
		known[d.ID] = true
	}
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := cr.GetDevicesIds()
		if len(ids) == 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: a container request without devices", p.opts.ResourceName)
		}
		for _, id := range ids {
			if !known[id] {
				return nil, status.Errorf(codes.NotFound, "%s: unknown device %q", p.opts.ResourceName, id)
			}
		}
		joined := strings.Join(ids, ",")
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs:        map[string]string{p.opts.EnvName: joined},
			Annotations: map[string]string{p.opts.ResourceName: joined},
		})
	}
	now := time.Now()
	for _, cr := range req.GetContainerRequests() {
		for _, id := range cr.GetDevicesIds() {
			p.allocations[id] = now
		}
	}
	return resp, nil
}

// PreStartContainer implements the DevicePlugin service (not required).
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func shortName(resource string) string {
	return resource[strings.LastIndex(resource, "/")+1:]
}
