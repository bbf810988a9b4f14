package deviceplugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// wait bounds every wait for the plugin; it is a deadlock guard, not a
// performance assertion.
const wait = 30 * time.Second

// fakeKubelet serves the kubelet's Registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	reqs chan *pluginapi.RegisterRequest
	srv  *grpc.Server
	path string
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{reqs: make(chan *pluginapi.RegisterRequest, 8), srv: grpc.NewServer(), path: filepath.Join(dir, KubeletSocketName)}
	l, err := net.Listen("unix", k.path)
	if err != nil {
		t.Fatal(err)
	}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.reqs <- r
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) await(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.reqs:
		return r
	case <-time.After(wait):
		t.Fatalf("the plugin did not register with the kubelet at %s within %v", k.path, wait)
		return nil
	}
}

// stop is the kubelet going away: its server stops and its socket goes.
func (k *fakeKubelet) stop() {
	k.srv.Stop()
	_ = os.Remove(k.path)
}

// shortDir is a temp dir short enough for unix socket paths.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "c8s-dp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func runPlugin(t *testing.T, opts Options) *Plugin {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return p
}

func dialPlugin(t *testing.T, dir, endpoint string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func recv(t *testing.T, s pluginapi.DevicePlugin_ListAndWatchClient) map[string]string {
	t.Helper()
	r, err := s.Recv()
	if err != nil {
		t.Fatalf("ListAndWatch: %v", err)
	}
	got := map[string]string{}
	for _, d := range r.Devices {
		got[d.ID] = d.Health
	}
	return got
}

func TestPluginRegistersServesAndReregisters(t *testing.T) {
	dir := shortDir(t)
	const res = "c8s.io/sim-slot"
	// The plugin starts before the kubelet, as after a node reboot.
	p := runPlugin(t, Options{ResourceName: res, Dir: dir, Devices: Devices(res, 3)})
	k := startKubelet(t, dir)
	req := k.await(t)
	if req.ResourceName != res || req.Version != pluginapi.Version || req.Endpoint != "c8s-sim-slot.sock" {
		t.Fatalf("registration = %+v", req)
	}
	if req.Options == nil || req.Options.PreStartRequired || req.Options.GetPreferredAllocationAvailable {
		t.Fatalf("registration options = %+v", req.Options)
	}
	if st, err := os.Stat(filepath.Join(dir, req.Endpoint)); err != nil || st.Mode().Type() != os.ModeSocket {
		t.Fatalf("endpoint %s is not a socket: %v", req.Endpoint, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	c := dialPlugin(t, dir, req.Endpoint)
	opts, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || opts.PreStartRequired {
		t.Fatalf("GetDevicePluginOptions = %+v, %v", opts, err)
	}
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	healthy := map[string]string{"sim-slot-0": pluginapi.Healthy, "sim-slot-1": pluginapi.Healthy, "sim-slot-2": pluginapi.Healthy}
	if got := recv(t, stream); !reflect.DeepEqual(got, healthy) {
		t.Fatalf("devices = %v", got)
	}
	devs := Devices(res, 3)
	devs[1].Healthy = false
	p.SetDevices(devs)
	if got := recv(t, stream); got["sim-slot-1"] != pluginapi.Unhealthy || got["sim-slot-0"] != pluginapi.Healthy || len(got) != 3 {
		t.Fatalf("devices after SetDevices = %v", got)
	}

	alloc, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"sim-slot-2"}},
		{DevicesIds: []string{"sim-slot-0", "sim-slot-1"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(alloc.ContainerResponses) != 2 {
		t.Fatalf("allocate = %+v", alloc)
	}
	if r := alloc.ContainerResponses[0]; r.Envs["C8S_SIM_SLOT"] != "sim-slot-2" || r.Annotations[res] != "sim-slot-2" {
		t.Fatalf("first container: envs %v annotations %v", r.Envs, r.Annotations)
	}
	if r := alloc.ContainerResponses[1]; r.Envs["C8S_SIM_SLOT"] != "sim-slot-0,sim-slot-1" {
		t.Fatalf("second container: envs %v", r.Envs)
	}
	if got := p.Allocations(); !reflect.DeepEqual(got, []string{"sim-slot-0", "sim-slot-1", "sim-slot-2"}) {
		t.Fatalf("allocations = %v", got)
	}
	_, err = c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"sim-slot-9"}}}})
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "sim-slot-9") {
		t.Fatalf("allocating an unknown device: %v", err)
	}
	_, err = c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("allocating nothing: %v", err)
	}

	// The kubelet restarts: it goes away, deletes the plugin sockets and
	// comes back with a new kubelet.sock.
	k.stop()
	if err := os.Remove(filepath.Join(dir, req.Endpoint)); err != nil {
		t.Fatal(err)
	}
	k2 := startKubelet(t, dir)
	req2 := k2.await(t)
	if req2.ResourceName != res || req2.Endpoint != req.Endpoint {
		t.Fatalf("re-registration = %+v", req2)
	}
	// The kubelet has the request before the plugin has the reply.
	for deadline := time.Now().Add(wait); p.Registrations() != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("registrations = %d, want 2", p.Registrations())
		}
	}
	// The old stream ended with the old server; a new one works.
	if _, err := stream.Recv(); err == nil {
		t.Fatal("the stream from before the restart still delivers")
	}
	s2, err := dialPlugin(t, dir, req2.Endpoint).ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, s2); got["sim-slot-1"] != pluginapi.Unhealthy || len(got) != 3 {
		t.Fatalf("devices after the restart = %v", got)
	}
}

func TestRunRemovesItsSocketWhenDone(t *testing.T) {
	dir := shortDir(t)
	k := startKubelet(t, dir)
	p, err := New(Options{ResourceName: "c8s.io/snp-asid", Dir: dir, Devices: Devices("c8s.io/snp-asid", 2)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	if r := k.await(t); r.Endpoint != "c8s-snp-asid.sock" || r.ResourceName != "c8s.io/snp-asid" {
		t.Fatalf("registration = %+v", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.SocketPath()); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
}

func TestNewValidates(t *testing.T) {
	for _, o := range []Options{
		{ResourceName: "sim-slot"},
		{ResourceName: "c8s.io/"},
		{ResourceName: "c8s.io/x", Socket: "a/b.sock"},
		{ResourceName: "c8s.io/x", Socket: KubeletSocketName},
		{ResourceName: "c8s.io/x", Devices: []Device{{ID: "a"}, {ID: "a"}}},
		{ResourceName: "c8s.io/x", Devices: []Device{{}}},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
	p, err := New(Options{ResourceName: "c8s.io/tdx-key"})
	if err != nil {
		t.Fatal(err)
	}
	if p.SocketPath() != filepath.Join(pluginapi.DevicePluginPath, "c8s-tdx-key.sock") || p.opts.EnvName != "C8S_TDX_KEY" {
		t.Fatalf("defaults: %s %s", p.SocketPath(), p.opts.EnvName)
	}
}

func TestDevices(t *testing.T) {
	if got := Devices("c8s.io/snp-asid", 2); !reflect.DeepEqual(got, []Device{{"snp-asid-0", true}, {"snp-asid-1", true}}) {
		t.Fatalf("%v", got)
	}
	if got := Devices("c8s.io/snp-asid", -1); len(got) != 0 {
		t.Fatalf("%v", got)
	}
}
