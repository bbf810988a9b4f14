package deviceplugin

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A kubelet that stops after it got the registration but before it
// answered has not registered the plugin: the plugin counts only answered
// registrations, and registers with the next kubelet once, on its fresh
// socket. (CI saw this interleaving: the test expected two registrations
// where the plugin had made one.)
func TestKubeletRestartMidRegistration(t *testing.T) {
	dir := shortDir(t)
	const res = "c8s.io/sim-slot"
	p, err := New(Options{ResourceName: res, Dir: dir, Devices: Devices(res, 1)})
	if err != nil {
		t.Fatal(err)
	}
	looks := watchLooks(p)
	startPlugin(t, p)
	k1, err := listenKubelet(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k1.srv.Stop)
	req := k1.await(t)

	// The kubelet restarts with the plugin waiting for its answer.
	k1.stop()
	if err := os.Remove(filepath.Join(dir, req.Endpoint)); err != nil {
		t.Fatal(err)
	}
	k2 := startKubelet(t, dir)
	if req2 := k2.await(t); req2.Endpoint != req.Endpoint || req2.ResourceName != res {
		t.Fatalf("registration with the new kubelet = %+v", req2)
	}
	awaitRegistrations(t, p, 1)
	looks.settle(t, dir)
	if n := p.Registrations(); n != 1 {
		t.Fatalf("registrations = %d, want 1 (the unanswered one does not count)", n)
	}
	k2.none(t)
	k1.none(t)
}

// A kubelet restart can fall between the plugin's look at its own socket
// and its look at the kubelet's. The kubelet removes the plugin sockets
// before it listens, so the plugin looks at the kubelet's socket first and
// never registers a socket the new kubelet has just removed (the kubelet
// would fail to dial it, after its own timeout in a real one).
func TestKubeletRestartBetweenThePluginsLooks(t *testing.T) {
	dir := shortDir(t)
	const res = "c8s.io/snp-asid"
	p, err := New(Options{ResourceName: res, Dir: dir, Devices: Devices(res, 2)})
	if err != nil {
		t.Fatal(err)
	}
	looks := watchLooks(p)
	startPlugin(t, p)
	k1 := startKubelet(t, dir)
	req := k1.await(t)
	awaitRegistrations(t, p, 1)
	looks.settle(t, dir)

	// The restart happens right after one of the plugin's looks, the
	// first once the old kubelet's socket is gone; that look saw the
	// directory before the restart. The kubelet removes the plugin's
	// socket, then listens on a new kubelet.sock.
	restarted := make(chan *fakeKubelet, 1)
	failed := make(chan error, 1)
	kubeletPath := filepath.Join(dir, KubeletSocketName)
	fired := false
	looks.mu.Lock()
	looks.before = func(string) { // on the plugin's goroutine
		if _, err := os.Stat(kubeletPath); fired || err == nil {
			return
		}
		fired = true
		if err := os.Remove(filepath.Join(dir, req.Endpoint)); err != nil {
			failed <- err
			return
		}
		k2, err := listenKubelet(dir, false)
		if err != nil {
			failed <- err
			return
		}
		restarted <- k2
	}
	looks.mu.Unlock()
	k1.stop()

	var k2 *fakeKubelet
	select {
	case k2 = <-restarted:
		t.Cleanup(k2.srv.Stop)
	case err := <-failed:
		t.Fatal(err)
	case <-time.After(wait):
		t.Fatalf("the plugin did not look at the directory within %v of the kubelet stopping", wait)
	}
	// await fails if the plugin registered a socket that is gone.
	if req2 := k2.await(t); req2.Endpoint != req.Endpoint {
		t.Fatalf("registration with the new kubelet = %+v", req2)
	}
	awaitRegistrations(t, p, 2)
	looks.settle(t, dir)
	if n := p.Registrations(); n != 2 {
		t.Fatalf("registrations = %d, want 2", n)
	}
	k2.none(t)
}
