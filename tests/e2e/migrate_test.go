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
// C's certificate cannot reach the VM A moved to B. The pod runs from
// image layers, each node with its own layer cache: C, which lacks them,
// and B, while its disk of a layer has another dm-verity root, refuse the
// pod; B then converts the layers itself and holds them for the moved VM
// while A drops its references. Two QEMUs: the pod VM and its incoming
// copy.
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
	// The pod runs from its image's layers (runtime.rootfs = "layers"):
	// each node has its own layer cache, none of it on shared storage. B
	// finds or converts the layers itself, from its containerd (the same
	// daemon here, standing for B's own pull of the image).
	layersA := filepath.Join(e.d.Dir, "layers-a")
	cfgA := e.writeConfig(t, "node-a.toml", common+fmt.Sprintf("\n[runtime]\nstate_dir = %q\nlayer_cache_dir = %q\n\n[node]\ntrust_pool = %q\n", e.stateDir, layersA, pool))
	// A's state dir stands for the storage A and B share (disks that are
	// not image layers would be there).
	bDir := filepath.Join(e.d.Dir, "nb")
	layersB := filepath.Join(bDir, "cache", "layers")
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

	// Nodes B and C accept migrations; B also with mutual TLS. Every node
	// runs its server on its own socket: it relays the node's calls to
	// tls:// destinations (the shim holds no TLS identity, issue 18).
	sock, sockC := filepath.Join(e.d.Dir, "b.sock"), statedir.MigrateSocket(cDir)
	serveOut := startServe(t, bin, cfgB, sock, "node-b", "--listen-tls", "127.0.0.1:0", "--containerd", e.d.Address)
	startServe(t, bin, cfgC, sockC, "node-c")
	startServe(t, bin, cfgA, statedir.MigrateSocket(e.stateDir), "node-a")
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

	// The pod's layers, as A's cache holds them for it.
	podLayers := nodeLayers(t, layersA)
	if len(podLayers) == 0 {
		t.Fatalf("node A's layer cache %s holds no layer: the pod does not run in layer mode", layersA)
	}
	for hex, l := range podLayers {
		if l.refs != 1 {
			t.Fatalf("layer %s has %d references on node A before the move, want the pod's", hex, l.refs)
		}
	}

	// C has neither the layers nor a containerd to convert them from: C
	// refuses the pod, naming a layer, before it starts a QEMU.
	out, err := exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"--to", sockC, pod).CombinedOutput()
	if err == nil || !regexp.MustCompile(`layer sha256:[0-9a-f]{64} \(disk "layer-[0-9a-f]+"\) is not in this node's layer cache \S+ and cannot be built here: .*--containerd`).Match(out) {
		t.Fatalf("c8s-launcher migrate to a node that lacks the pod's layers: %v\n%s", err, out)
	}
	if now := e.qemus(t); len(now) != 1 || now[0] != sourceQEMU[0] || len(qemusWith(cDir)) != 0 {
		t.Fatalf("QEMU processes after node C's refusal: %v, want the source %v alone", now, sourceQEMU)
	}

	// B holds a disk of one of the layers with another dm-verity root (as
	// a node converting differently would): B refuses the pod, naming the
	// layer, before it starts a QEMU, and keeps no reference for it.
	var oddHex string
	for hex := range podLayers {
		oddHex = hex
		break
	}
	plantLayer(t, layersA, layersB, oddHex, strings.Repeat("0", 64))
	out, err = exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"--to", toB, pod).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "layer sha256:"+oddHex) || !strings.Contains(string(out), "dm-verity root "+strings.Repeat("0", 64)) {
		t.Fatalf("c8s-launcher migrate to a node whose disk of a layer has another root: %v\n%s", err, out)
	}
	if now := e.qemus(t); len(now) != 1 || now[0] != sourceQEMU[0] || len(qemusWith(bDir)) != 0 {
		t.Fatalf("QEMU processes after node B's refusal: %v, want the source %v alone", now, sourceQEMU)
	}
	for hex, l := range nodeLayers(t, layersB) {
		if l.refs != 0 {
			t.Fatalf("node B keeps %d references on layer %s after refusing the pod", l.refs, hex)
		}
	}
	for _, suffix := range []string{".disk", ".json"} {
		if err := os.Remove(filepath.Join(layersB, oddHex+suffix)); err != nil {
			t.Fatal(err)
		}
	}

	// B's root is not trusted by A yet: re-attestation on B fails after
	// the transfer, and the pod keeps running on A (cont from postmigrate).
	out, err = exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace,
		"--to", toB, pod).CombinedOutput()
	if err == nil || !regexp.MustCompile(`re-attestation on node node-b failed: .*VCEK`).Match(out) ||
		!strings.Contains(string(out), "rolled back") {
		t.Fatalf("c8s-launcher migrate to a node whose root A does not trust: %v\n%s", err, out)
	}
	if now := e.qemus(t); len(now) != 1 || now[0] != sourceQEMU[0] || len(qemusWith(bDir)) != 0 {
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
	// One QEMU is left, B's, on B's own copies of the layers.
	if left, onB := e.qemus(t), qemusWith(bDir); len(left) != 0 || len(onB) != 1 || !cmdlineHas(onB[0], layersB) || cmdlineHas(onB[0], layersA) {
		t.Fatalf("QEMU processes after the cut-over: node A %v (the source was %d), node B %v; want only node B's, on B's layer disks", left, sourceQEMU[0], onB)
	}
	// B converted each layer into the disk A has, and holds the moved
	// VM's reference on it; A dropped the pod's references (its layers
	// may be pruned there now).
	inB := nodeLayers(t, layersB)
	for hex, l := range podLayers {
		if b, ok := inB[hex]; !ok || b.root != l.root || b.size != l.size || b.refs != 1 {
			t.Fatalf("layer %s on node B: %+v, want node A's root %s and size %d with one reference", hex, b, l.root, l.size)
		}
	}
	if !strings.Contains(serveOut.String(), "layer disk of an incoming VM built") {
		t.Fatalf("node B's log shows no layer conversion:\n%s", serveOut.String())
	}
	for hex, l := range nodeLayers(t, layersA) {
		if l.refs != 0 {
			t.Fatalf("node A keeps %d references on layer %s after the hand-off", l.refs, hex)
		}
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
	noLayerRefs(t, layersA, layersB)
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
	noLayerRefs(t, layersA, layersB)
	e.assertNothingLeft(t)

	// A shim that dies once B runs the guest, before it has re-attested
	// it there: B's VM holds the whole guest, and `shim delete` on A
	// stops it too (the handoff file is written once B has started the
	// VM). The re-attestation's first request is held (stallProxy).
	const midway = "mig3"
	if _, stderr, code := result(t, e.run(c, cfgA, "-d", image, midway, "sleep", "600")); code != 0 {
		t.Fatalf("start %s: exit %d: %s\n%s", midway, code, stderr, e.d.Log())
	}
	stall := newStallProxy(t, e.d.Dir, sock)
	migrating := exec.CommandContext(c, bin, "migrate", "--address", e.d.Address, "--namespace", e.d.Namespace, "--to", stall.sock, midway)
	migrating.WaitDelay = 10 * time.Second
	if err := migrating.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stall.reattesting:
	case <-c.Done():
		t.Fatalf("the re-attestation of %s on B never began\n%s", midway, e.d.Log())
	}
	shim = processMatching(t, "containerd-shim-c8s-v2", "-id "+midway)
	if shim == 0 || bVMs() != 1 {
		t.Fatalf("shim %d, %d VMs on node B while %s re-attests there; want a shim and 1", shim, bVMs(), midway)
	}
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := migrating.Wait(); err == nil {
		t.Fatal("c8s-launcher migrate succeeded although the shim was killed")
	}
	waitUntil(t, "containerd to drop the dead shim's task", func() bool { return !strings.Contains(e.d.Ctr(t, "task", "ls"), midway) })
	e.d.Ctr(t, "container", "delete", midway)
	waitUntil(t, "node B to stop the VM of a shim that died re-attesting it", func() bool { return bVMs() == 0 })
	noLayerRefs(t, layersA, layersB)
	e.assertNothingLeft(t)
}

// nodeLayer is a layer of a node's layer cache (launcher/layercache's
// layout): its dm-verity root, disk size and references.
type nodeLayer struct {
	root string
	size int64
	refs int
}

func nodeLayers(t *testing.T, dir string) map[string]nodeLayer {
	t.Helper()
	metas, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	out := map[string]nodeLayer{}
	for _, m := range metas {
		b, err := os.ReadFile(m)
		if err != nil {
			t.Fatal(err)
		}
		var meta struct {
			RootHash string `json:"root_hash"`
			Size     int64  `json:"size"`
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		hex := strings.TrimSuffix(filepath.Base(m), ".json")
		refs, _ := os.ReadDir(filepath.Join(dir, "refs", hex))
		out[hex] = nodeLayer{root: meta.RootHash, size: meta.Size, refs: len(refs)}
	}
	return out
}

// plantLayer puts node A's disk of layer hex into node B's cache with its
// root hash replaced by root.
func plantLayer(t *testing.T, from, to, hex, root string) {
	t.Helper()
	disk, err := os.ReadFile(filepath.Join(from, hex+".disk"))
	if err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(from, hex+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(meta, &m); err != nil {
		t.Fatal(err)
	}
	m["root_hash"] = root
	meta, _ = json.Marshal(m)
	if err := os.MkdirAll(to, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(to, hex+".disk"), disk, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(to, hex+".json"), meta, 0o600); err != nil {
		t.Fatal(err)
	}
}

// noLayerRefs fails if a layer cache still has a reference a few seconds
// on (a node drops its VM's references once its QEMU has stopped).
func noLayerRefs(t *testing.T, dirs ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, dir := range dirs {
		for time.Now().Before(deadline) {
			n := 0
			for _, l := range nodeLayers(t, dir) {
				n += l.refs
			}
			if n == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for hex, l := range nodeLayers(t, dir) {
			if l.refs != 0 {
				t.Errorf("layer %s in %s keeps %d references after its pods ended", hex, dir, l.refs)
			}
		}
	}
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

// qemusWith returns the QEMU processes whose command line mentions s.
func qemusWith(s string) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		if cmd := string(b); strings.Contains(cmd, "qemu-system") && strings.Contains(cmd, s) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
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
