package e2e

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/manifest"
)

// TestPodVM runs every end-to-end scenario against one private containerd.
// The scenarios run in order; each checks that nothing leaked.
func TestPodVM(t *testing.T) {
	e := setup(t)
	t.Run("GuestKernelExitCodeAndEvents", func(t *testing.T) { testGuestKernelExitCodeAndEvents(t, e) })
	t.Run("PodSharesOneVMExecAndCleanup", func(t *testing.T) { testPodSharesOneVM(t, e) })
	t.Run("QEMUKilled", func(t *testing.T) { testQEMUKilled(t, e) })
	t.Run("ShimKilled", func(t *testing.T) { testShimKilled(t, e) })
	t.Run("BadInput", func(t *testing.T) { testBadInput(t, e) })
	t.Run("AlteredInitrdFailsAttestation", func(t *testing.T) { testAlteredInitrd(t, e) })
	t.Run("SealedRootWithAFlippedByteDoesNotBoot", func(t *testing.T) { testFlippedRootByte(t, e) })
	t.Run("SwappedRootHashFailsAttestation", func(t *testing.T) { testSwappedRootHash(t, e) })
}

// One VM: the container sees the guest kernel, its exit status reaches
// ctr, stdout and stderr reach containerd's FIFOs, and the task events are
// published.
func testGuestKernelExitCodeAndEvents(t *testing.T, e *env) {
	ev := e.watchEvents(t)
	// The Kata annotation for memory is allowlisted in the test config.
	stdout, stderr, code := result(t, e.run(ctx(t), e.config, "--rm",
		"--annotation", "io.katacontainers.config.hypervisor.default_memory=384", image, "k1",
		"sh", "-c", "uname -r; grep MemTotal /proc/meminfo >&2; tr ' ' '\\n' </proc/cmdline | grep -e c8s.verity.roothash= -e c8s.tee= >&2; echo to-stderr >&2; exit 3"))
	if code != 3 {
		t.Fatalf("exit code = %d, want 3\nstdout: %s\nstderr: %s\ncontainerd log:\n%s", code, stdout, stderr, e.d.Log())
	}
	guest := kernelRelease(t, e.imageDir)
	var uts syscall.Utsname
	if err := syscall.Uname(&uts); err != nil {
		t.Fatal(err)
	}
	host := utsString(uts.Release[:])
	var memKB int
	if _, err := fmt.Sscanf(stderr[strings.Index(stderr, "MemTotal:"):], "MemTotal: %d kB", &memKB); err != nil {
		t.Fatalf("no MemTotal in the container's stderr %q: %v", stderr, err)
	}
	if memKB > 384*1024 || memKB < 256*1024 {
		t.Fatalf("guest MemTotal = %d kB; the default_memory=384 annotation was not applied", memKB)
	}
	if strings.TrimSpace(stdout) != guest {
		t.Fatalf("uname -r in the container = %q, want the guest kernel %q (host: %q)", strings.TrimSpace(stdout), guest, host)
	}
	if guest == host {
		t.Fatalf("guest and host kernels are both %q: the test cannot tell them apart", host)
	}
	// The pod started only after its VM attested with the image's expected
	// sim launch digest for one vCPU.
	m, err := manifest.Load(filepath.Join(e.imageDir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	simDigests, err := m.Sim()
	if err != nil {
		t.Fatal(err)
	}
	// The guest booted the sealed image: its kernel command line names the
	// manifest's dm-verity root hash.
	if !m.Sealed() || !strings.Contains(stderr, "c8s.verity.roothash="+m.Verity.RootHash+"\n") {
		t.Fatalf("the guest command line does not carry the manifest's root hash (sealed image: %v)\nstderr: %s", m.Sealed(), stderr)
	}
	// It names its TEE, as the sim digest it attested with assumes
	// (digests.sim.cmdline): the guest took the sim port for that reason.
	if !strings.Contains(stderr, "\nc8s.tee=sim\n") || !strings.HasSuffix(simDigests.Cmdline, " c8s.tee=sim") {
		t.Fatalf("the guest command line does not name the sim TEE (manifest: %q)\nstderr: %s", simDigests.Cmdline, stderr)
	}
	attested := false
	for _, line := range strings.Split(e.d.Log(), "\n") {
		if strings.Contains(line, "pod VM attested") && strings.Contains(line, "sandbox=k1") &&
			strings.Contains(line, "measurement="+simDigests.ByVCPUs["1"]) && strings.Contains(line, "provider=sim") {
			attested = true
		}
	}
	if !attested {
		t.Fatalf("no \"pod VM attested\" line with measurement %s for k1 in containerd's log:\n%s", simDigests.ByVCPUs["1"], e.d.Log())
	}
	if !strings.Contains(stderr, "to-stderr") {
		t.Fatalf("stderr of the container did not reach ctr: %q", stderr)
	}
	deadline := time.Now().Add(5 * time.Second)
	want := []string{"/tasks/create", "/tasks/start", "/tasks/exit", "/tasks/delete"}
	for {
		got := strings.Join(ev.topics("k1"), " ")
		missing := ""
		for _, w := range want {
			if !strings.Contains(got, w) {
				missing = w
			}
		}
		if missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("event %s not published for k1; saw: %s", missing, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.assertNothingLeft(t)
}

// withoutCtrLog drops ctr's own log lines (such as its cgroup v1
// deprecation warning) from a process's stderr.
func withoutCtrLog(stderr string) string {
	var keep []string
	for _, l := range strings.Split(stderr, "\n") {
		if !strings.HasPrefix(l, "time=") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func utsString(b []int8) string {
	var s strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		s.WriteByte(byte(c))
	}
	return s.String()
}

// One VM: two containers with one sandbox id share one QEMU; exec works with
// and without a tty; ps lists processes; kill and delete leave nothing.
func testPodSharesOneVM(t *testing.T, e *env) {
	c := ctx(t)
	const pod = "pod1"
	ann := "io.kubernetes.cri.sandbox-id=" + pod
	if _, stderr, code := result(t, e.run(c, e.config, "-d", "--annotation", ann, image, pod, "sleep", "600")); code != 0 {
		t.Fatalf("start sandbox container: exit %d: %s\n%s", code, stderr, e.d.Log())
	}
	first := e.qemus(t)
	if len(first) != 1 {
		t.Fatalf("QEMU processes after the first container: %v, want 1", first)
	}
	if _, stderr, code := result(t, e.run(c, e.config, "-d", "--annotation", ann, image, "app1", "sleep", "600")); code != 0 {
		t.Fatalf("start second container: exit %d: %s\n%s", code, stderr, e.d.Log())
	}
	if both := e.qemus(t); len(both) != 1 || both[0] != first[0] {
		t.Fatalf("QEMU processes with two containers of one pod: %v, want just %v", both, first)
	}

	// A node admin re-attests the running pod on demand: fresh nonce,
	// verified claims.
	attestOut, err := exec.CommandContext(c, filepath.Join(e.root, "bin", "c8s-launcher"), "attest",
		"--address", e.d.Address, "--namespace", e.d.Namespace, "--json", pod).CombinedOutput()
	if err != nil {
		t.Fatalf("c8s-launcher attest %s: %v\n%s", pod, err, attestOut)
	}
	var attested struct {
		Sandbox, Provider string
		Claims            struct {
			Measurement, ReportData string `json:",omitempty"`
			Simulated               bool
			VCPUs                   int
		}
	}
	if err := json.Unmarshal(attestOut, &attested); err != nil {
		t.Fatalf("c8s-launcher attest --json: %v\n%s", err, attestOut)
	}
	if attested.Sandbox != pod || attested.Provider != "sim" || !attested.Claims.Simulated || attested.Claims.VCPUs != 1 {
		t.Fatalf("c8s-launcher attest: %s", attestOut)
	}

	// exec without a tty: stdout, stderr and the exit status come back.
	stdout, stderr, code := result(t, e.d.CtrCommand(c, "task", "exec", "--exec-id", "e1", "app1",
		"sh", "-c", "echo out-$((6*7)); echo err >&2; exit 5"))
	if code != 5 || strings.TrimSpace(stdout) != "out-42" || strings.TrimSpace(withoutCtrLog(stderr)) != "err" {
		t.Fatalf("exec: code %d stdout %q stderr %q", code, stdout, stderr)
	}
	// exec with a tty: the process sees a terminal.
	out, code := ptyRun(t, e.d.CtrCommand(c, "task", "exec", "-t", "--exec-id", "e2", "app1",
		"sh", "-c", "tty; test -t 1 && echo is-a-tty"))
	out = ansi.ReplaceAllString(out, "")
	if code != 0 || !strings.Contains(out, "/dev/pts/") || !strings.Contains(out, "is-a-tty") {
		t.Fatalf("exec -t: code %d, output %q", code, out)
	}
	// stdin reaches an exec, and closing it ends the process.
	cat := e.d.CtrCommand(c, "task", "exec", "--exec-id", "e3", "app1", "cat")
	cat.Stdin = strings.NewReader("through-stdin\n")
	if stdout, stderr, code := result(t, cat); code != 0 || stdout != "through-stdin\n" {
		t.Fatalf("exec with stdin: code %d stdout %q stderr %q", code, stdout, stderr)
	}

	// Stats come from the container's cgroup inside the VM.
	if m := e.d.Ctr(t, "task", "metrics", "app1"); !strings.Contains(m, "pids.current") || !strings.Contains(m, "memory.usage") {
		t.Fatalf("ctr task metrics app1 lacks the guest cgroup's figures:\n%s", m)
	}
	ps := e.d.Ctr(t, "task", "ps", "app1")
	if len(strings.Split(strings.TrimSpace(ps), "\n")) < 2 {
		t.Fatalf("ctr task ps app1 lists no process:\n%s", ps)
	}
	if ls := e.d.Ctr(t, "task", "ls"); !strings.Contains(ls, "app1") || !strings.Contains(ls, "RUNNING") {
		t.Fatalf("ctr task ls:\n%s", ls)
	}

	for _, id := range []string{"app1", pod} {
		e.d.Ctr(t, "task", "kill", "-s", "KILL", id)
	}
	for _, id := range []string{"app1", pod} {
		waitStopped(t, e, id)
		e.d.Ctr(t, "task", "delete", id)
		e.d.Ctr(t, "container", "delete", id)
	}
	e.assertNothingLeft(t)
}

func waitStopped(t *testing.T, e *env, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ls := e.d.Ctr(t, "task", "ls")
		for _, line := range strings.Split(ls, "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == id && f[2] == "STOPPED" {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s did not stop:\n%s", id, ls)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// One VM: killing QEMU under a running pod makes the task exit with an
// error status, and containerd can still delete it.
func testQEMUKilled(t *testing.T, e *env) {
	c := ctx(t)
	run := e.run(c, e.config, "--rm", image, "victim", "sleep", "600")
	var stderr strings.Builder
	run.Stderr = &stderr
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- run.Wait() }()
	deadline := time.Now().Add(3 * time.Minute)
	for !strings.Contains(e.d.Ctr(t, "task", "ls"), "RUNNING") {
		select {
		case err := <-exited:
			t.Fatalf("ctr run ended before the task ran: %v\n%s", err, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			run.Process.Kill()
			<-exited
			t.Fatalf("victim never ran: %s\n%s", stderr.String(), e.d.Log())
		}
		time.Sleep(100 * time.Millisecond)
	}
	pids := e.qemus(t)
	if len(pids) != 1 {
		t.Fatalf("QEMU processes: %v, want 1", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-exited
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("ctr run after QEMU was killed: %v (want a non-zero exit status)\n%s", err, stderr.String())
	}
	t.Logf("ctr run exited with %d after QEMU was killed", ee.ExitCode())
	// ctr run --rm deleted the task and the container through containerd.
	if ls := e.d.Ctr(t, "container", "ls", "-q"); strings.Contains(ls, "victim") {
		t.Fatalf("container victim was not deleted:\n%s\nctr: %s", ls, stderr.String())
	}
	e.assertNothingLeft(t)
}

// One VM: a pod whose measured init data forbids exec refuses `ctr task
// exec`; then, when the shim dies, containerd's `shim delete` clean-up
// stops the pod's QEMU and removes its state, disks and mounts.
func testShimKilled(t *testing.T, e *env) {
	c := ctx(t)
	noExec := base64.StdEncoding.EncodeToString([]byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n"))
	if _, stderr, code := result(t, e.run(c, e.config, "-d", "--annotation", "io.c8s.initdata="+noExec, image, "orphan", "sleep", "600")); code != 0 {
		t.Fatalf("start: exit %d: %s", code, stderr)
	}
	_, stderr, code := result(t, e.d.CtrCommand(c, "task", "exec", "--exec-id", "x1", "orphan", "true"))
	if code == 0 || !strings.Contains(stderr, "measured policy forbids exec") {
		t.Fatalf("exec into a pod whose policy forbids it: exit %d, stderr:\n%s", code, stderr)
	}
	if n := len(e.qemus(t)); n != 1 {
		t.Fatalf("QEMU processes: %d, want 1", n)
	}
	shim := processMatching(t, "containerd-shim-c8s-v2", "-id orphan")
	if shim == 0 {
		t.Fatal("no shim process for orphan")
	}
	if err := syscall.Kill(shim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// containerd notices the shim is gone, runs `shim delete` and drops the
	// task.
	deadline := time.Now().Add(30 * time.Second)
	for strings.Contains(e.d.Ctr(t, "task", "ls"), "orphan") {
		if time.Now().After(deadline) {
			t.Fatalf("containerd still lists the task of the dead shim:\n%s", e.d.Ctr(t, "task", "ls"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.d.Ctr(t, "container", "delete", "orphan")
	e.assertNothingLeft(t)
}

// processMatching returns the pid of a process whose command line holds
// every one of parts, or 0.
func processMatching(t *testing.T, parts ...string) int {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		cmd := strings.ReplaceAll(string(data), "\x00", " ")
		match := true
		for _, part := range parts {
			match = match && strings.Contains(cmd, part)
		}
		if match {
			var pid int
			fmt.Sscanf(filepath.Base(filepath.Dir(p)), "%d", &pid)
			return pid
		}
	}
	return 0
}

// One VM: an initrd changed on disk after the image manifest was made
// still boots, but its pod fails attestation: the sim TEE's modelled
// RTMR2 (checked through the event log as a TD's) names another initrd
// than the manifest's; nothing is left behind.
func testAlteredInitrd(t *testing.T, e *env) {
	dir := alteredInitrd(t, e, "altered")
	cfg := e.writeConfig(t, "altered.toml", fmt.Sprintf(`
[hypervisor]
kernel = %q
initrd = %q
[attestation]
manifest = %q
[runtime]
state_dir = %q
`, filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(dir, "initrd.img"), filepath.Join(e.imageDir, "manifest.json"), e.stateDir))
	e.expectPodFails(t, cfg, "altered", "attestation of pod VM altered failed", "RTMR2 event", "Linux initrd) mismatch", "expected")
}

// expectPodFails runs a pod named name with cfg, which must fail with an
// error at ctr containing each of wants, and leave nothing behind. It
// returns ctr's stderr.
func (e *env) expectPodFails(t *testing.T, cfg, name string, wants ...string) string {
	t.Helper()
	_, stderr, code := result(t, e.run(ctx(t), cfg, "--rm", image, name, "true"))
	if code == 0 {
		t.Fatalf("pod %s started; it must fail with %q", name, wants)
	}
	for _, want := range wants {
		if !strings.Contains(stderr, want) {
			t.Errorf("ctr's error does not say %q:\n%s", want, stderr)
		}
	}
	e.d.CtrCommand(ctx(t), "container", "delete", name).Run()
	e.assertNothingLeft(t)
	return stderr
}

// Bad input gets a clear error at ctr, and nothing leaks.
func testBadInput(t *testing.T, e *env) {
	kernel := filepath.Join(e.imageDir, "vmlinuz")
	initrd := filepath.Join(e.imageDir, "initrd.img")
	notAKernel := filepath.Join(e.d.Dir, "not-a-kernel")
	if err := os.WriteFile(notAKernel, []byte("this is not a bzImage\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := func(name, hypervisor string) string {
		return e.writeConfig(t, name, "[hypervisor]\n"+hypervisor+"\n[runtime]\nstate_dir = \""+e.stateDir+"\"\n")
	}
	cases := []struct {
		name, config string
		want         []string
	}{
		{"missing kernel", cfg("nokernel.toml", `kernel = "/nonexistent/vmlinuz"`+"\n"+`initrd = "`+initrd+`"`),
			[]string{"/nonexistent/vmlinuz"}},
		{"missing initrd", cfg("noinitrd.toml", `kernel = "`+kernel+`"`+"\n"+`initrd = "/nonexistent/initrd.img"`),
			[]string{"/nonexistent/initrd.img"}},
		{"unknown TEE", cfg("tee.toml", `kernel = "`+kernel+`"`+"\n"+`initrd = "`+initrd+`"`+"\n"+`tee = "sgx-magic"`),
			[]string{"sgx-magic", "sim"}},
		{"malformed config", e.writeConfig(t, "malformed.toml", "[hypervisor\nkernel = \n"),
			[]string{"malformed.toml"}},
		{"missing config file", filepath.Join(e.d.Dir, "does-not-exist.toml"),
			[]string{"does-not-exist.toml"}},
		{"QEMU fails to start", cfg("badkernel.toml", `kernel = "`+notAKernel+`"`+"\n"+`initrd = "`+initrd+`"`+"\n"+`accel = "tcg"`),
			[]string{"qemu stderr", "linux kernel too old"}}, // QEMU's own message
	}
	for i, tc := range cases {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			id := "bad" + string(rune('a'+i))
			_, stderr, code := result(t, e.run(ctx(t), tc.config, "--rm", image, id, "true"))
			if code == 0 {
				t.Fatalf("ctr run succeeded with a bad setup (%s)", tc.name)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("ctr's error does not mention %q:\n%s", w, stderr)
				}
			}
			e.d.CtrCommand(ctx(t), "container", "delete", id).Run()
			e.assertNothingLeft(t)
		})
	}
}
