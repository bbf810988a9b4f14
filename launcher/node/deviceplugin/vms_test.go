package deviceplugin

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/node/internal/fakevms"
)

// TestScanVMs: a state root as the shim leaves it (one directory per pod
// VM with its QEMU pid file) and a /proc fixture with the QEMUs that run.
func TestScanVMs(t *testing.T) {
	state, proc := filepath.Join(t.TempDir(), "run-c8s"), t.TempDir()
	ns := filepath.Join(state, "k8s.io")
	vmDir := func(name string, pid int, cmdline []byte) string {
		dir := filepath.Join(ns, name)
		fakevms.WriteFile(t, filepath.Join(dir, "console.log"), nil)
		if pid != 0 {
			fakevms.WriteFile(t, filepath.Join(dir, statedir.PidFile), []byte(strconv.Itoa(pid)))
		}
		if cmdline != nil {
			fakevms.WriteFile(t, filepath.Join(proc, strconv.Itoa(pid), "cmdline"), cmdline)
		}
		return dir
	}
	snp := vmDir("snp-pod", 101, fakevms.Cmdline(t, "snp", filepath.Join(ns, "snp-pod")))
	tdx := vmDir("tdx-pod", 102, fakevms.Cmdline(t, "tdx", filepath.Join(ns, "tdx-pod")))
	sim := vmDir("sim-pod", 103, fakevms.Cmdline(t, "sim", filepath.Join(ns, "sim-pod")))
	dead := vmDir("leaked-dead", 104, nil)                                                    // QEMU gone, dir left behind
	recycled := vmDir("recycled", 105, []byte("/bin/sleep\x00600\x00"))                       // the pid belongs to another process now
	zombie := vmDir("zombie", 106, []byte{})                                                  // exited, not reaped
	other := vmDir("other-vm", 107, fakevms.Cmdline(t, "snp", filepath.Join(ns, "snp-pod2"))) // another VM's QEMU
	vmDir("starting", 0, nil)                                                                 // no pid file yet
	fakevms.WriteFile(t, filepath.Join(ns, "garbage", statedir.PidFile), []byte("not a pid"))
	fakevms.WriteFile(t, filepath.Join(ns, "disks", "snp-pod", statedir.PidFile), []byte("101")) // too deep: not a state dir
	fakevms.WriteFile(t, filepath.Join(state, "direct", statedir.PidFile), []byte("108"))        // c8s-launcher run's <root>/<id>
	fakevms.WriteFile(t, filepath.Join(proc, "108", "cmdline"), fakevms.Cmdline(t, "sim", filepath.Join(state, "direct")))
	// A pod of a long namespace: shortened dir names, the index names it.
	ix := statedir.Index{Namespace: strings.Repeat("n", 76), ID: strings.Repeat("ab", 32)}
	indexed := statedir.ForPod(state, ix.Namespace, ix.ID).VM
	fakevms.WriteFile(t, filepath.Join(indexed, statedir.PidFile), []byte("109"))
	fakevms.WriteFile(t, filepath.Join(proc, "109", "cmdline"), fakevms.Cmdline(t, "snp", indexed))
	if err := statedir.WriteIndex(indexed, ix); err != nil {
		t.Fatal(err)
	}

	vms, err := ScanVMs(state, proc)
	if err != nil {
		t.Fatal(err)
	}
	want := []VM{
		{StateDir: filepath.Join(state, "direct"), PID: 108, Alive: true, TEE: VMSim},
		{StateDir: dead, PID: 104},
		{StateDir: other, PID: 107},
		{StateDir: recycled, PID: 105},
		{StateDir: sim, PID: 103, Alive: true, TEE: VMSim},
		{StateDir: snp, PID: 101, Alive: true, TEE: VMSNP},
		{StateDir: tdx, PID: 102, Alive: true, TEE: VMTDX},
		{StateDir: zombie, PID: 106},
		{StateDir: indexed, PID: 109, Alive: true, TEE: VMSNP, Namespace: ix.Namespace, ID: ix.ID},
	}
	if !reflect.DeepEqual(vms, want) {
		t.Fatalf("ScanVMs:\n got %+v\nwant %+v", vms, want)
	}
	if got := CountLive(vms); !reflect.DeepEqual(got, map[string]int64{VMSNP: 2, VMTDX: 1, VMSim: 2}) {
		t.Fatalf("CountLive = %v", got)
	}

	if vms, err := ScanVMs(filepath.Join(state, "none"), proc); err != nil || len(vms) != 0 {
		t.Fatalf("missing state root: %v %v", vms, err)
	}
}

// TestScanVMsRealProcess checks liveness against the real /proc: a process
// whose command line names the state dir counts while it runs and not
// after it exits.
func TestScanVMsRealProcess(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "k8s.io", "pod")
	cmd := exec.Command("/bin/sh", "-c", "read x", "sh", "-qmp", "unix:"+filepath.Join(dir, "qmp.sock")+",server=on,wait=off")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	fakevms.WriteFile(t, filepath.Join(dir, statedir.PidFile), []byte(strconv.Itoa(cmd.Process.Pid)))
	// Start returns once execve closed the exec pipe, a moment before the
	// kernel sets up the new command line, as the shim writes the pid
	// file only once QEMU answers on QMP.
	for {
		if c, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "cmdline")); len(c) > 0 {
			break
		}
		runtime.Gosched()
	}

	vms, err := ScanVMs(state, "/proc")
	if err != nil || len(vms) != 1 || !vms[0].Alive || vms[0].TEE != VMSim {
		t.Fatalf("running: %+v %v", vms, err)
	}
	stdin.Close()  // the shell reads EOF and exits
	_ = cmd.Wait() // (read fails on EOF: exit status 1)
	vms, err = ScanVMs(state, "/proc")
	if err != nil || len(vms) != 1 || vms[0].Alive {
		t.Fatalf("exited: %+v %v", vms, err)
	}
}
