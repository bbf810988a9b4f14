package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
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
// Like the kubelet, it answers a registration only once it has reached the
// plugin at the endpoint named.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	reqs chan registration
	srv  *grpc.Server
	path string
	// hang makes Register keep every request unanswered until the
	// kubelet stops: a kubelet that goes away mid-registration.
	hang bool
}

// registration is a request the fake kubelet received and what came of
// reaching the plugin's endpoint.
type registration struct {
	*pluginapi.RegisterRequest
	dialErr error
}

func startKubelet(t *testing.T, dir string) *fakeKubelet {
	t.Helper()
	k, err := listenKubelet(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.srv.Stop)
	return k
}

// listenKubelet starts a fake kubelet; it is safe off the test goroutine.
func listenKubelet(dir string, hang bool) (*fakeKubelet, error) {
	k := &fakeKubelet{reqs: make(chan registration, 8), srv: grpc.NewServer(), path: filepath.Join(dir, KubeletSocketName), hang: hang}
	l, err := net.Listen("unix", k.path)
	if err != nil {
		return nil, err
	}
	// Its socket goes in stop, before the server stops: unlinked on close,
	// it could be the next kubelet's.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(l) }()
	return k, nil
}

func (k *fakeKubelet) Register(ctx context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	err := k.reach(ctx, r.Endpoint)
	k.reqs <- registration{r, err}
	if k.hang {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "cannot reach the plugin at %s: %v", r.Endpoint, err)
	}
	return &pluginapi.Empty{}, nil
}

// reach asks the plugin at endpoint for its options, as the kubelet dials
// a plugin that registers.
func (k *fakeKubelet) reach(ctx context.Context, endpoint string) error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(filepath.Dir(k.path), endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	_, err = pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	return err
}

// await returns the next registration; the plugin must be serving the
// endpoint it registered.
func (k *fakeKubelet) await(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-k.reqs:
		if r.dialErr != nil {
			t.Fatalf("the plugin registered endpoint %s, which the kubelet cannot reach: %v", r.Endpoint, r.dialErr)
		}
		return r.RegisterRequest
	case <-time.After(wait):
		t.Fatalf("the plugin did not register with the kubelet at %s within %v", k.path, wait)
		return nil
	}
}

// none fails if the kubelet received a registration not yet awaited.
func (k *fakeKubelet) none(t *testing.T) {
	t.Helper()
	select {
	case r := <-k.reqs:
		t.Fatalf("an extra registration: %+v (endpoint reached: %v)", r.RegisterRequest, r.dialErr)
	default:
	}
}

// stop is the kubelet going away: its socket goes and its server stops.
func (k *fakeKubelet) stop() {
	_ = os.Remove(k.path)
	k.srv.Stop()
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

// startPlugin runs p until the test ends.
func startPlugin(t *testing.T, p *Plugin) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// looks records which paths the plugin stats, in order; before, when set,
// runs first (on the plugin's goroutine) and may change the directory.
type looks struct {
	mu     sync.Mutex
	paths  chan string
	before func(path string)
}

// watchLooks makes p report its looks at the directory.
func watchLooks(p *Plugin) *looks {
	l := &looks{paths: make(chan string, 1024)}
	p.stat = func(path string) (os.FileInfo, error) {
		fi, err := os.Stat(path)
		l.mu.Lock()
		before := l.before
		l.mu.Unlock()
		if before != nil {
			before(path)
		}
		l.paths <- path
		return fi, err
	}
	return l
}

// settle returns once the plugin has run a whole check that began after
// settle was called: it makes directory events and waits until two checks
// began (a check looks at the kubelet's socket first; checks run one at a
// time, so the first of the two has ended when the second begins).
func (l *looks) settle(t *testing.T, dir string) {
	t.Helper()
	for len(l.paths) > 0 {
		<-l.paths
	}
	kubelet := filepath.Join(dir, KubeletSocketName)
	for i := range 2 {
		name := filepath.Join(dir, fmt.Sprintf("event-%d", i))
		if err := os.WriteFile(name, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		os.Remove(name)
		for began := false; !began; {
			select {
			case path := <-l.paths:
				began = path == kubelet
			case <-time.After(wait):
				t.Fatalf("the plugin did not look at the directory within %v of an event", wait)
			}
		}
	}
}

func awaitRegistrations(t *testing.T, p *Plugin, want int) {
	t.Helper()
	for deadline := time.Now().Add(wait); p.Registrations() != want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("registrations = %d, want %d", p.Registrations(), want)
		}
	}
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
	p, err := New(Options{ResourceName: res, Dir: dir, Devices: Devices(res, 3)})
	if err != nil {
		t.Fatal(err)
	}
	looks := watchLooks(p)
	startPlugin(t, p)
	k := startKubelet(t, dir)
	req := k.await(t)
	// The kubelet has the request before the plugin has the reply; a
	// kubelet stopped in between would not have answered it.
	awaitRegistrations(t, p, 1)
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

	// Once registered, the plugin stays so: directory events do not make
	// it register again.
	looks.settle(t, dir)
	k.none(t)

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
	awaitRegistrations(t, p, 2)
	looks.settle(t, dir)
	if n := p.Registrations(); n != 2 {
		t.Fatalf("registrations = %d after the restart settled, want 2", n)
	}
	k2.none(t)
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
