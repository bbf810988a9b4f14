package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/migrate/pooltest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// syncBuffer collects a process's output while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestMigratePod live-migrates a running pod from node A (the shim's
// node) to node B (`c8s-launcher serve` with its own state dir and sim
// identity) on loopback, through B's mutual-TLS API and with QEMU's
// migration stream under TLS (one pool CA, a certificate per node): the
// pod's counter continues without a reset, re-attestation shows B's chip,
// and containerd keeps managing the task (ps, exec, kill, wait, delete)
// after the move. Node C, a second `serve` of the same pool whose shared
// storage does not hold A's disks, refuses the pod before any QEMU starts;
// C's certificate cannot reach the VM A moved to B. Two QEMUs: the pod VM
// and its incoming copy.
func TestMigratePod(t *testing.T) {
	e := setup(t)
	c, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	bin := filepath.Join(e.root, "bin", "c8s-launcher")
	const pool = "pool-e2e"
	common := fmt.Sprintf(`
[hypervisor]
kernel = %q
initrd = %q
tee = "sim"
accel = "auto"
`, filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(e.imageDir, "initrd.img"))
	cfgA := e.writeConfig(t, "node-a.toml", common+fmt.Sprintf("\n[runtime]\nstate_dir = %q\n\n[node]\ntrust_pool = %q\n", e.stateDir, pool))
	// A's state dir stands for the storage A and B share: the pod's disks
	// (container layers and its writable disk) are there.
	bDir := filepath.Join(e.d.Dir, "nb")
	cfgB := e.writeConfig(t, "node-b.toml", common+fmt.Sprintf("\n[runtime]\nstate_dir = %q\n\n[node]\ntrust_pool = %q\n\n[migration]\nshared_storage_root = %q\n", bDir, pool, e.stateDir))
	cDir, cShared := filepath.Join(e.d.Dir, "nc"), filepath.Join(e.d.Dir, "shared-c")
	if err := os.MkdirAll(cShared, 0o700); err != nil {
		t.Fatal(err)
	}
	cfgC := e.writeConfig(t, "node-c.toml", common+fmt.Sprintf("\n[runtime]\nstate_dir = %q\n\n[node]\ntrust_pool = %q\n\n[migration]\nshared_storage_root = %q\n", cDir, pool, cShared))

	// The pool's CA issues each node its migration TLS identity.
	ca, err := pooltest.NewCA(pool)
	if err != nil {
		t.Fatal(err)
	}
	for dir, name := range map[string]string{e.stateDir: "node-a", bDir: "node-b", cDir: "node-c"} {
		if _, err := ca.Issue(statedir.MigrateTLS(dir), name); err != nil {
			t.Fatal(err)
		}
	}

	// Nodes B and C accept migrations; B also with mutual TLS.
	sock, sockC := filepath.Join(e.d.Dir, "b.sock"), filepath.Join(e.d.Dir, "c.sock")
	serveOut := startServe(t, bin, cfgB, sock, "node-b", "--listen-tls", "127.0.0.1:0")
	startServe(t, bin, cfgC, sockC, "node-c")
	m := regexp.MustCompile(`with mutual TLS on (127\.0\.0\.1:\d+)`).FindStringSubmatch(serveOut.String())
	if m == nil || !strings.Contains(serveOut.String(), "migration stream: TLS with the node's identity") {
		t.Fatalf("c8s-launcher serve output:\n%s", serveOut.String())
	}
	toB := "tls://" + m[1]
	spB, err := sim.Load(statedir.SimSP(bDir))
	if err != nil {
		t.Fatal(err)
	}
	chipB := spB.ChipID()

	// The pod: a counter in a file and on stdout.
	const pod = "mig1"
	stdout := &syncBuffer{}
	run := e.run(c, cfgA, "--annotation", "io.kubernetes.cri.sandbox-id="+pod, image, pod,
		"sh", "-c", `i=0; while true; do i=$((i+1)); echo $i > /tmp/count.new; mv /tmp/count.new /tmp/count; echo "tick $i"; sleep 0.3; done`)
	runErr := &syncBuffer{}
	run.Stdout, run.Stderr = stdout, runErr
	run.WaitDelay = 10 * time.Second
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{}) // closed once ctr run has ended, with runResult
	var runResult error
	go func() { runResult = run.Wait(); close(ran) }()
	t.Cleanup(func() {
		select {
		case <-ran:
		default:
			kctx, kcancel := context.WithTimeout(context.Background(), 30*time.Second)
			e.d.CtrCommand(kctx, "task", "kill", "-s", "SIGKILL", pod).Run()
			kcancel()
			select {
			case <-ran:
			case <-time.After(30 * time.Second):
				run.Process.Kill()
				<-ran
			}
		}
	})
	waitUntil(t, "the counter on the pod's stdout", func() bool { return strings.Contains(stdout.String(), "tick 3\n") })
	count := func() int {
		t.Helper()
		out, errOut, code := result(t, e.d.CtrCommand(c, "task", "exec", "--exec-id", fmt.Sprintf("c%d", time.Now().UnixNano()), pod, "cat", "/tmp/count"))
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if code != 0 || err != nil {
			t.Fatalf("exec cat /tmp/count: code %d, %q, %q\n%s", code, out, errOut, e.d.Log())
		}
		return n
	}
	before := count()
	sourceQEMU := e.qemus(t)
	if len(sourceQEMU) != 1 {
		t.Fatalf("QEMU processes of node A before the migration: %v", sourceQEMU)
	}

	// C's shared storage does not hold the pod's disks: C refuses the
	// pod, naming the disk and its root, before it starts a QEMU.
	out, err := exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"--to", sockC, pod).CombinedOutput()
	if err == nil || !regexp.MustCompile(`disk "[^"]+" at \S+ refused: it resolves to \S+, outside the shared storage root \(migration.shared_storage_root is `+regexp.QuoteMeta(cShared)+`\)`).Match(out) {
		t.Fatalf("c8s-launcher migrate to a node whose shared storage lacks the pod's disks: %v\n%s", err, out)
	}
	if now := e.qemus(t); len(now) != 1 || now[0] != sourceQEMU[0] {
		t.Fatalf("QEMU processes after node C's refusal: %v, want the source %v alone", now, sourceQEMU)
	}

	// B's root is not trusted by A yet: re-attestation on B fails after
	// the transfer, and the pod keeps running on A (cont from postmigrate).
	out, err = exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"--to", toB, pod).CombinedOutput()
	if err == nil || !regexp.MustCompile(`re-attestation on node node-b failed: .*VCEK`).Match(out) ||
		!strings.Contains(string(out), "rolled back") {
		t.Fatalf("c8s-launcher migrate to a node whose root A does not trust: %v\n%s", err, out)
	}
	if now := e.qemus(t); len(now) != 1 || now[0] != sourceQEMU[0] {
		t.Fatalf("QEMU processes after the rollback: %v, want the source %v alone", now, sourceQEMU)
	}
	rolledBack := count()
	if rolledBack < before {
		t.Fatalf("counter after the rollback %d < %d before", rolledBack, before)
	}
	waitUntil(t, "the counter to go on on A after the rollback", func() bool { return count() > rolledBack })

	// The administrator installs B's root in A's trust pool.
	poolDir := statedir.PoolRoots(e.stateDir)
	if err := os.MkdirAll(poolDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(poolDir, "node-b.pem"), spB.CertChainPEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"--to", toB, "--json", pod).CombinedOutput()
	if err != nil {
		t.Fatalf("c8s-launcher migrate: %v\n%s\ncontainerd log:\n%s\nserve:\n%s", err, out, e.d.Log(), serveOut.String())
	}
	var res struct {
		Node   string
		Claims struct {
			ChipID      string `json:"chip_id"`
			Measurement string
		}
		QEMUTotalMS int64 `json:"qemu_total_ms"`
		DowntimeMS  int64 `json:"downtime_ms"`
		TotalMS     int64 `json:"total_ms"`
		ReattestMS  int64 `json:"reattest_ms"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("c8s-launcher migrate --json: %v\n%s", err, out)
	}
	if res.Node != "node-b" || res.Claims.ChipID != hex.EncodeToString(chipB[:]) {
		t.Fatalf("migrated to %q with chip %s; want node-b with chip %x", res.Node, res.Claims.ChipID, chipB)
	}
	t.Logf("migrated: QEMU total %d ms, downtime %d ms, c8s end to end %d ms, re-attestation %d ms", res.QEMUTotalMS, res.DowntimeMS, res.TotalMS, res.ReattestMS)
	// One QEMU is left, B's (it mentions A's state dir for the shared disk).
	if left := e.qemus(t); len(left) != 1 || left[0] == sourceQEMU[0] || !cmdlineHas(left[0], bDir) {
		t.Fatalf("QEMU processes after the cut-over: %v (the source was %d); want only node B's", left, sourceQEMU[0])
	}

	// The stream went under TLS, bound to A's certificate.
	if log := serveOut.String(); !strings.Contains(log, `from="pool member \"CN=node-a\"`) || !strings.Contains(log, "tls=true") {
		t.Fatalf("node B's log shows no TLS stream from node A:\n%s", log)
	}
	// The moved VM is A's: node C's certificate (same CA) and B's unix
	// socket are refused for its status, agent channel and deletion.
	cfgCLoaded := config.Default()
	cfgCLoaded.Runtime.StateDir = cDir
	asC, err := migrate.Dial(toB, cfgCLoaded)
	if err != nil {
		t.Fatal(err)
	}
	for who, cl := range map[string]*migrate.Client{"node C": asC, "node B's unix socket": migrate.NewClient(sock)} {
		if _, err := cl.Status(c, pod); err == nil || !strings.Contains(err.Error(), `was migrated here by pool member "CN=node-a"`) {
			t.Fatalf("status of the moved VM by %s: %v; want a refusal naming node A", who, err)
		}
		if _, err := cl.DialAgent(c, pod); err == nil || !strings.Contains(err.Error(), "403 Forbidden") {
			t.Fatalf("agent channel of the moved VM by %s: %v; want 403", who, err)
		}
		if err := cl.Delete(c, pod); err == nil || !strings.Contains(err.Error(), "may not use it") {
			t.Fatalf("deletion of the moved VM by %s: %v; want a refusal", who, err)
		}
	}

	// The counter went on from where it was, on B.
	after := count()
	if after < before {
		t.Fatalf("counter after the migration %d < %d before: the pod restarted", after, before)
	}
	waitUntil(t, "the counter to go on after the migration", func() bool { return count() > after })
	n := strings.Count(stdout.String(), "tick 1\n")
	if n != 1 {
		t.Fatalf("the counter started %d times on stdout:\n%s", n, stdout.String())
	}
	waitUntil(t, "stdout to carry ticks from node B", func() bool {
		return strings.Contains(stdout.String(), fmt.Sprintf("tick %d\n", after+1))
	})

	// Re-attestation on demand now shows B's chip.
	aout, err := exec.CommandContext(c, bin, "attest", "--address", e.d.Address, "--namespace", e.d.Namespace, "--json", pod).CombinedOutput()
	if err != nil || !strings.Contains(string(aout), hex.EncodeToString(chipB[:])) {
		t.Fatalf("c8s-launcher attest after the move: %v\n%s", err, aout)
	}
	if ps := e.d.Ctr(t, "task", "ps", pod); len(strings.Split(strings.TrimSpace(ps), "\n")) < 2 {
		t.Fatalf("ctr task ps after the move lists no process:\n%s", ps)
	}

	// kill reaches the guest on B; ctr run's wait sees the exit and deletes the task.
	e.d.Ctr(t, "task", "kill", "-s", "SIGKILL", pod)
	select {
	case <-ran:
		err := runResult
		var ee *exec.ExitError
		if err == nil || !errors.As(err, &ee) || ee.ExitCode() != 137 {
			t.Fatalf("ctr run after kill: %v (want exit 137)\nstderr: %s", err, runErr.String())
		}
	case <-c.Done():
		t.Fatalf("ctr run did not end after kill\n%s", e.d.Log())
	}
	e.d.Ctr(t, "containers", "delete", pod)
	bVMs := func() int {
		ms, _ := filepath.Glob(filepath.Join(bDir, "migrate", "*"))
		return len(ms)
	}
	waitUntil(t, "node B to stop the pod VM", func() bool { return bVMs() == 0 })
	e.assertNothingLeft(t)

	// A moved pod whose shim dies: containerd's `shim delete` on A stops
	// the VM on B too.
	const orphan = "mig2"
	if _, stderr, code := result(t, e.run(c, cfgA, "-d", image, orphan, "sleep", "600")); code != 0 {
		t.Fatalf("start %s: exit %d: %s\n%s", orphan, code, stderr, e.d.Log())
	}
	if out, err := exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"--to", sock, orphan).CombinedOutput(); err != nil || !strings.Contains(string(out), "migrated to node node-b") {
		t.Fatalf("c8s-launcher migrate %s: %v\n%s", orphan, err, out)
	}
	if bVMs() != 1 {
		t.Fatalf("node B runs %d VMs after the second migration, want 1", bVMs())
	}
	shim := processMatching(t, "containerd-shim-c8s-v2", "-id "+orphan)
	if shim == 0 {
		t.Fatal("no shim process for " + orphan)
	}
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "containerd to drop the dead shim's task", func() bool { return !strings.Contains(e.d.Ctr(t, "task", "ls"), orphan) })
	e.d.Ctr(t, "container", "delete", orphan)
	waitUntil(t, "node B to stop the dead shim's moved VM", func() bool { return bVMs() == 0 })
	e.assertNothingLeft(t)
}

// startServe runs `c8s-launcher serve` for a node until the test ends and
// returns its output once it listens.
func startServe(t *testing.T, bin, cfg, sock, name string, extra ...string) *syncBuffer {
	out := &syncBuffer{}
	serve := exec.Command(bin, append([]string{"serve", "--config", cfg, "--socket", sock, "--name", name}, extra...)...)
	serve.Stdout, serve.Stderr = out, out
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { serve.Wait(); close(served) }()
	t.Cleanup(func() {
		serve.Process.Signal(syscall.SIGTERM)
		select {
		case <-served:
		case <-time.After(30 * time.Second):
			serve.Process.Kill()
			<-served
		}
		if t.Failed() {
			t.Logf("c8s-launcher serve %s output:\n%s", name, out.String())
		}
	})
	waitUntil(t, "c8s-launcher serve "+name+" to listen", func() bool {
		_, err := os.Stat(sock)
		return err == nil && strings.Contains(out.String(), "migration stream:") && (len(extra) == 0 || strings.Contains(out.String(), "with mutual TLS on"))
	})
	return out
}

func cmdlineHas(pid int, s string) bool {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Contains(string(b), s)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
