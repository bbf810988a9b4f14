package migrate

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
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
	client *Client
}

func newEnv(t *testing.T) *env {
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
	e := &env{a: node(t, base, filepath.Join(root, "a"), "pool-1"), b: node(t, base, filepath.Join(root, "b"), "pool-1")}

	e.server = &Server{Config: e.b, Name: "node-b"}
	sock := filepath.Join(root, "b.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- e.server.Serve(sctx, l) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	e.client = NewClient(sock)

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

	t.Run("migrates: the counter continues on the destination", func(t *testing.T) {
		before := lastTick(e.src.ConsolePath())
		var onDest int
		var progress []vm.MigrationInfo
		res, err := Run(ctx, e.source(t), e.client, Options{
			Progress: func(info vm.MigrationInfo) { progress = append(progress, info) },
			Reattest: func(ctx context.Context, in IncomingResponse) error {
				// The guest answers on the destination's agent channel
				// with the counter it kept in memory.
				// (through the destination API's agent tunnel).
				out, err := guestShell(ctx, func() (net.Conn, error) { return e.client.DialAgent(ctx, in.ID) }, "cat /tmp/count")
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
		st, err := e.client.Status(ctx, "pod1")
		if err != nil || st.RunState != "running" {
			t.Fatalf("destination status = %+v, %v", st, err)
		}
		// A dead shim's cleanup on the source stops the moved VM through
		// the handoff file.
		dir := t.TempDir()
		if err := WriteHandoff(dir, e.client, "pod1", ""); err != nil {
			t.Fatal(err)
		}
		if found, err := StopHandedOff(ctx, dir); !found || err != nil {
			t.Fatalf("StopHandedOff = %v, %v", found, err)
		}
		if _, err := e.client.Status(ctx, "pod1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the moved VM still runs after StopHandedOff: %v", err)
		}
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
		go io.Copy(in, out)
		if n, _ := io.CopyN(out, in, p.limit); n == p.limit {
			p.cut.Store(true)
		}
	}()
	return "tcp:" + p.l.Addr().String()
}
