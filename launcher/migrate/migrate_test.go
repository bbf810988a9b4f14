package migrate

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/migrate/pooltest"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/testguest"
)

// guestInit counts on the serial console (the counter lives in guest
// memory, so a migrated guest continues it) and serves a shell on the
// agent port.
const guestInit = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/virtio-ports
for p in /sys/class/virtio-ports/*; do
	ln -s ../$(basename $p) /dev/virtio-ports/$(cat $p/name)
done
( i=0; while true; do i=$((i+1)); echo "C8S-TICK $i"; echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; sleep 0.2; done ) &
echo C8S-GUEST-READY
exec 3<>/dev/virtio-ports/c8s.agent
while true; do sh <&3 >&3 2>&3; sleep 0.1; done
`

// guestWait bounds every wait for the guest (TCG on a loaded machine).
const guestWait = 3 * time.Minute

var tickRE = regexp.MustCompile(`C8S-TICK (\d+)`)

// lastTick is the last counter value on a console log (0 if none).
func lastTick(path string) int {
	b, _ := os.ReadFile(path)
	m := tickRE.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(string(m[len(m)-1][1]))
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(guestWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// node is one simulated node: its config and state dir.
func node(t *testing.T, base config.Config, dir, pool string) config.Config {
	cfg := base
	cfg.Runtime.StateDir = dir
	cfg.Node.TrustPool = pool
	return cfg
}

type env struct {
	a, b   config.Config
	src    *vm.VM
	server *Server
	// client reaches the server on its unix socket, tlsClient with node
	// A's certificate; both migrate the stream under TLS with A's identity.
	client, tlsClient *Client
	// root holds every node's state; ca is the trust pool's CA, and
	// identityC another member's identity.
	root      string
	ca        *pooltest.CA
	identityC string
}

func newEnv(t *testing.T) *env {
	var err error
	qemu := testguest.QEMU(t)
	k := testguest.GetKernel(t)
	initrd := testguest.Initramfs(t, guestInit, nil)
	root, err := os.MkdirTemp("", "c8s-mig-") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	base := config.Default()
	base.Hypervisor.Path, base.Hypervisor.Kernel, base.Hypervisor.Initrd = qemu, k.Path, initrd
	base.Hypervisor.DefaultMemoryMiB = 256
	e := &env{a: node(t, base, filepath.Join(root, "a"), "pool-1"), b: node(t, base, filepath.Join(root, "b"), "pool-1"), root: root}
	if e.ca, err = pooltest.NewCA("pool-1"); err != nil {
		t.Fatal(err)
	}
	e.identityC = filepath.Join(root, "c-identity")
	for dir, name := range map[string]string{statedir.MigrateTLS(e.a.Runtime.StateDir): "node-a", statedir.MigrateTLS(e.b.Runtime.StateDir): "node-b", e.identityC: "node-c"} {
		if _, err := e.ca.Issue(dir, name); err != nil {
			t.Fatal(err)
		}
	}

	e.server = &Server{Config: e.b, Name: "node-b"}
	sock := filepath.Join(root, "b.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	serverTLS, _, err := LoadTLS(statedir.MigrateTLS(e.b.Runtime.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	tl, err := ListenTLS("127.0.0.1:0", serverTLS)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 2)
	go func() { served <- e.server.Serve(sctx, l) }()
	go func() { served <- e.server.Serve(sctx, tl) }()
	t.Cleanup(func() {
		stop()
		for range 2 {
			if err := <-served; err != nil {
				t.Errorf("Serve: %v", err)
			}
		}
	})
	e.client = NewClient(sock).WithStream(statedir.MigrateTLS(e.a.Runtime.StateDir), false)
	serveRelay(t, e.a) // node A's server relays its tls:// calls
	if e.tlsClient, err = Dial("tls://"+tl.Addr().String(), e.a); err != nil {
		t.Fatal(err)
	}

	spec := vm.Spec{ID: "pod1", StateDir: filepath.Join(e.a.Runtime.StateDir, "pods", "pod1"), Hypervisor: e.a.Hypervisor, Accel: "tcg"}
	e.src, err = vm.Start(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.src.Stop(context.Background()) })
	waitFor(t, "the source guest to count", func() bool { return lastTick(e.src.ConsolePath()) > 0 })
	return e
}

func (e *env) source(t *testing.T) Source {
	n, err := LocalNode(e.a, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	return Source{VM: e.src, Node: n, HostData: make([]byte, 32)}
}

// requireSourceRunning checks the rollback's promise: the source runs and
// its guest keeps counting, and the destination runs no VM.
func (e *env) requireSourceRunning(t *testing.T) {
	t.Helper()
	st, err := e.src.QMP().RunState(context.Background())
	if err != nil || st != "running" {
		t.Fatalf("source run state = %q, %v; want running", st, err)
	}
	n := lastTick(e.src.ConsolePath())
	waitFor(t, "the source guest to count on after the rollback", func() bool { return lastTick(e.src.ConsolePath()) > n+1 })
	e.server.mu.Lock()
	left := len(e.server.vms)
	e.server.mu.Unlock()
	if left != 0 {
		t.Fatalf("the destination still runs %d VM(s) after the rollback", left)
	}
	if _, err := e.client.Status(context.Background(), "pod1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("destination status of pod1 = %v; want not found", err)
	}
	e.requireNothingLeft(t)
}

// requireNothingLeft checks that no destination QEMU runs (none of the
// nodes' other state dirs on a QEMU command line) and that no copy of
// TLS credentials is left in a state dir.
func (e *env) requireNothingLeft(t *testing.T) {
	t.Helper()
	waitFor(t, "the destination QEMUs to exit", func() bool {
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, _ := os.ReadFile(p)
			if strings.Contains(string(b), "qemu") && strings.Contains(string(b), e.root) && !strings.Contains(string(b), e.a.Runtime.StateDir) {
				return false
			}
		}
		return true
	})
	filepath.WalkDir(e.root, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Name() == streamCredsDir {
			t.Fatalf("a copy of the stream's TLS credentials is left: %s", p)
		}
		return nil
	})
}

// destPid is the destination QEMU's pid while a migration runs.
func (e *env) destPid() int {
	e.server.mu.Lock()
	defer e.server.mu.Unlock()
	if h := e.server.vms["pod1"]; h != nil {
		return h.vm.Pid()
	}
	return 0
}

// slow keeps a migration going long enough to interfere with it.
var slow = vm.MigrationParameters{MaxBandwidth: 2 << 20}

func midway(info vm.MigrationInfo) bool {
	return info.Status == "active" && info.RAM != nil && info.RAM.Transferred > 1<<20
}

// TestMigrate boots one source VM and runs every rollback case against it,
// then a migration that succeeds.
func TestMigrate(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()

	t.Run("refused: other trust pool", func(t *testing.T) {
		other := &Server{Config: node(t, e.b, filepath.Join(filepath.Dir(e.b.Runtime.StateDir), "c"), "pool-2"), Name: "node-c"}
		sock := filepath.Join(filepath.Dir(e.b.Runtime.StateDir), "c.sock")
		l, err := Listen(sock)
		if err != nil {
			t.Fatal(err)
		}
		sctx, stop := context.WithCancel(ctx)
		defer stop()
		go other.Serve(sctx, l)
		_, err = Run(ctx, e.source(t), NewClient(sock), Options{})
		var ref *Refusal
		if !errors.As(err, &ref) || !strings.Contains(err.Error(), `trust pool "pool-2"`) {
			t.Fatalf("Run to another pool = %v; want a refusal naming the pool", err)
		}
		e.requireSourceRunning(t)
	})

	// A source QEMU without TLS credentials: the destination QEMU, which
	// expects TLS, refuses the stream; the migration fails and is rolled
	// back, the destination QEMU is gone.
	t.Run("refused: plain stream to a TLS destination", func(t *testing.T) {
		_, err := Run(ctx, e.source(t), e.client, Options{Parameters: slow, plainStream: true, Timeout: 30 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "QEMU reports the migration failed") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run with a plain stream to a TLS destination = %v; want a failed migration, rolled back", err)
		}
		e.requireSourceRunning(t)
	})

	// Node C is a member of the same pool (its certificate is from the same
	// CA) but node A asked for the incoming VM: the destination QEMU admits
	// only A's certificate on the stream (tls-authz).
	t.Run("refused: stream from another pool member", func(t *testing.T) {
		_, err := Run(ctx, e.source(t), e.tlsClient, Options{Parameters: slow, streamIdentity: e.identityC, Timeout: 30 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "QEMU reports the migration failed") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run with node C's certificate on the stream = %v; want a failed migration, rolled back", err)
		}
		e.requireSourceRunning(t)
	})

	// A destination without a TLS identity offers plain TCP on loopback
	// when migration.plain_loopback allows it; the source takes it only if
	// it allows it too.
	t.Run("plain stream on loopback only when both allow it", func(t *testing.T) {
		pcfg := node(t, e.b, filepath.Join(e.root, "p"), "pool-1")
		pcfg.Migration.PlainLoopback = true
		psock := filepath.Join(e.root, "p.sock")
		l, err := Listen(psock)
		if err != nil {
			t.Fatal(err)
		}
		pctx, stop := context.WithCancel(ctx)
		served := make(chan struct{})
		go func() { (&Server{Config: pcfg, Name: "node-p"}).Serve(pctx, l); close(served) }()
		defer func() { stop(); <-served }()

		_, err = Run(ctx, e.source(t), NewClient(psock).WithStream(statedir.MigrateTLS(e.a.Runtime.StateDir), false), Options{})
		if err == nil || !strings.Contains(err.Error(), "node node-p offers a plain-TCP migration stream") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run to a plain destination from a source that does not allow it = %v", err)
		}
		e.requireSourceRunning(t)

		var state string
		var tls bool
		_, err = Run(ctx, e.source(t), NewClient(psock).WithStream("", true), Options{Reattest: func(ctx context.Context, in IncomingResponse) error {
			state, _ = e.src.QMP().RunState(ctx)
			tls = in.TLS
			return errors.New("stop here")
		}})
		if err == nil || !strings.Contains(err.Error(), "stop here") || state != vm.RunStatePostmigrate || tls {
			t.Fatalf("Run over a plain loopback stream: %v (source state %q, tls %v); want a completed transfer, then the rollback", err, state, tls)
		}
		e.requireSourceRunning(t)
	})

	t.Run("rollback: destination dies mid-migration", func(t *testing.T) {
		var killed atomic.Bool
		_, err := Run(ctx, e.source(t), e.client, Options{Parameters: slow, Progress: func(info vm.MigrationInfo) {
			if midway(info) && !killed.Load() {
				if pid := e.destPid(); pid != 0 {
					syscall.Kill(pid, syscall.SIGKILL)
					killed.Store(true)
				}
			}
		}})
		if err == nil || !killed.Load() || !strings.Contains(err.Error(), "QEMU reports the migration failed") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run with the destination killed (killed=%v) = %v; want a failed migration, rolled back", killed.Load(), err)
		}
		e.requireSourceRunning(t)
	})

	t.Run("rollback: cancelled", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, err := Run(cctx, e.source(t), e.client, Options{Parameters: slow, Progress: func(info vm.MigrationInfo) {
			if midway(info) {
				cancel()
			}
		}})
		if err == nil || !strings.Contains(err.Error(), "cancelled") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run cancelled = %v; want a cancelled migration, rolled back", err)
		}
		e.requireSourceRunning(t)
	})

	t.Run("rollback: timeout", func(t *testing.T) {
		_, err := Run(ctx, e.source(t), e.client, Options{Parameters: slow, Timeout: 2 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "timed out after 2s") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run with a 2s timeout = %v; want a timeout, rolled back", err)
		}
		e.requireSourceRunning(t)
	})

	t.Run("rollback: connection cut", func(t *testing.T) {
		p := newCutProxy(t, 1<<20)
		_, err := Run(ctx, e.source(t), e.client, Options{Parameters: slow, rewriteURI: p.rewrite})
		if err == nil || !p.cut.Load() || !strings.Contains(err.Error(), "QEMU reports the migration failed") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run through a proxy that cuts the connection (cut=%v) = %v; want a failed migration, rolled back", p.cut.Load(), err)
		}
		e.requireSourceRunning(t)
	})

	t.Run("rollback: re-attestation fails, source resumes from postmigrate", func(t *testing.T) {
		var state string
		_, err := Run(ctx, e.source(t), e.client, Options{Reattest: func(ctx context.Context, in IncomingResponse) error {
			state, _ = e.src.QMP().RunState(ctx)
			return errors.New("evidence does not chain to a root of trust pool pool-1")
		}})
		if err == nil || !strings.Contains(err.Error(), "re-attestation on node node-b failed: evidence does not chain") || !strings.Contains(err.Error(), "rolled back") {
			t.Fatalf("Run with a failing re-attestation = %v", err)
		}
		if state != vm.RunStatePostmigrate {
			t.Fatalf("source state during re-attestation = %q, want %s", state, vm.RunStatePostmigrate)
		}
		e.requireSourceRunning(t)
	})

	t.Run("migrates over TLS: the counter continues on the destination", func(t *testing.T) {
		before := lastTick(e.src.ConsolePath())
		var onDest int
		var progress []vm.MigrationInfo
		wire := newCutProxy(t, 1<<40) // records the stream's first bytes
		res, err := Run(ctx, e.source(t), e.tlsClient, Options{
			rewriteURI: wire.rewrite,
			Progress:   func(info vm.MigrationInfo) { progress = append(progress, info) },
			Reattest: func(ctx context.Context, in IncomingResponse) error {
				// The guest answers on the destination's agent channel
				// with the counter it kept in memory.
				// (through the destination API's agent tunnel).
				out, err := guestShell(ctx, func() (net.Conn, error) { return e.tlsClient.DialAgent(ctx, in.ID) }, "cat /tmp/count")
				if err != nil {
					return err
				}
				onDest, err = strconv.Atoi(strings.TrimSpace(out))
				return err
			},
		})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		if onDest < before {
			t.Fatalf("the counter on the destination is %d, it was %d on the source before: the guest restarted", onDest, before)
		}
		// A TLS handshake record (content type 22, version 3.x), not
		// QEMU's plain stream ("QEVM"), went over the wire.
		if head := wire.first(); len(head) < 3 || head[0] != 0x16 || head[1] != 3 || bytes.Contains(head, []byte("QEVM")) || !res.Incoming.TLS {
			t.Fatalf("the migration stream began with %q (TLS %v); want a TLS handshake", head, res.Incoming.TLS)
		}
		if res.Info.Status != vm.MigrationCompleted || res.Info.TotalTime <= 0 || len(progress) == 0 {
			t.Fatalf("result %+v after %d progress reports", res.Info, len(progress))
		}
		if st, _ := e.src.QMP().RunState(ctx); st != vm.RunStatePostmigrate {
			t.Fatalf("source state after the migration = %q, want %s", st, vm.RunStatePostmigrate)
		}
		if err := e.src.Stop(ctx); err != nil {
			t.Fatal(err)
		}
		destConsole := filepath.Join(res.Incoming.StateDir, vm.ConsoleLogName)
		waitFor(t, "the guest to count on the destination", func() bool { return lastTick(destConsole) > onDest })
		b, _ := os.ReadFile(destConsole)
		if first := tickRE.FindSubmatch(b); first == nil || string(first[1]) == "1" {
			t.Fatalf("the destination's console starts at tick %q: the counter was reset", first)
		}
		st, err := e.tlsClient.Status(ctx, "pod1")
		if err != nil || st.RunState != "running" {
			t.Fatalf("destination status = %+v, %v", st, err)
		}
		// The VM is node A's: neither node C nor the unix socket may use it.
		cc := e.a
		cc.Runtime.StateDir = filepath.Join(e.root, "c")
		if err := os.MkdirAll(filepath.Dir(statedir.MigrateTLS(cc.Runtime.StateDir)), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(e.identityC, statedir.MigrateTLS(cc.Runtime.StateDir)); err != nil {
			t.Fatal(err)
		}
		serveRelay(t, cc)
		nodeC, err := Dial(e.tlsClient.Address(), cc)
		if err != nil {
			t.Fatal(err)
		}
		for name, c := range map[string]*Client{"node C": nodeC, "the unix socket": e.client} {
			if err := c.Delete(ctx, "pod1"); err == nil || !strings.Contains(err.Error(), `was migrated here by pool member "CN=node-a"`) {
				t.Fatalf("delete by %s = %v; want a refusal", name, err)
			}
			if _, err := c.DialAgent(ctx, "pod1"); err == nil || !strings.Contains(err.Error(), "403 Forbidden") {
				t.Fatalf("agent channel by %s = %v; want 403", name, err)
			}
		}
		// A dead shim's cleanup on the source stops the moved VM through
		// the handoff file.
		dir := t.TempDir()
		if err := WriteHandoff(dir, e.tlsClient, "pod1", statedir.MigrateTLS(e.a.Runtime.StateDir)); err != nil {
			t.Fatal(err)
		}
		if found, err := StopHandedOff(ctx, dir); !found || err != nil {
			t.Fatalf("StopHandedOff = %v, %v", found, err)
		}
		if _, err := e.tlsClient.Status(ctx, "pod1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the moved VM still runs after StopHandedOff: %v", err)
		}
		e.requireNothingLeft(t)
		if found, err := StopHandedOff(ctx, dir); found || err != nil {
			t.Fatalf("StopHandedOff without a handoff file = %v, %v", found, err)
		}
		t.Logf("QEMU total %d ms, downtime %d ms; c8s total %s", res.Info.TotalTime, res.Info.Downtime, res.Total)
	})
}

// guestShell runs cmd in the test guest's shell on the agent channel.
func guestShell(ctx context.Context, dial func() (net.Conn, error), cmd string) (string, error) {
	c, err := dial()
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(guestWait))
	if _, err := fmt.Fprintf(c, "%s; echo C8S-END\n", cmd); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	var out strings.Builder
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return out.String(), fmt.Errorf("guest shell: %w", err)
		}
		if strings.TrimSpace(line) == "C8S-END" {
			return out.String(), nil
		}
		out.WriteString(line)
	}
}

// cutProxy forwards one migration connection and cuts it after limit
// bytes.
type cutProxy struct {
	l     net.Listener
	limit int64
	cut   atomic.Bool
	wg    sync.WaitGroup
	mu    sync.Mutex
	head  []byte // the first bytes from the source
}

// first returns the first bytes the source sent.
func (p *cutProxy) first() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Clone(p.head)
}

func (p *cutProxy) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := 64 - len(p.head); n > 0 {
		p.head = append(p.head, b[:min(n, len(b))]...)
	}
	return len(b), nil
}

func newCutProxy(t *testing.T, limit int64) *cutProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{l: l, limit: limit}
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

// rewrite starts forwarding to uri and returns the proxy's URI.
func (p *cutProxy) rewrite(uri string) string {
	target := strings.TrimPrefix(uri, "tcp:")
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		defer in.Close()
		out, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer out.Close()
		go func() {
			// The destination closed: so does the source's side.
			io.Copy(in, out)
			in.Close()
		}()
		if n, _ := io.CopyN(out, io.TeeReader(in, p), p.limit); n == p.limit {
			p.cut.Store(true)
		}
	}()
	return "tcp:" + p.l.Addr().String()
}
