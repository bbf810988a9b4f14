package child

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// parentEnv makes the test binary act as a shim that starts a "VM"
// (sleep) through Start and then blocks: "die" with
// dieWithParent, "keep" without.
const parentEnv = "C8S_CHILD_TEST_PARENT"

func actAsParent(die bool) int {
	cmd := exec.Command("sleep", "300")
	if err := Start(cmd, die, func() { cmd.Wait() }); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Other goroutines lock and end threads, as a shim's network code
	// may: none of that may take the VM with it.
	for i := 0; i < 8; i++ {
		go func() { runtime.LockOSThread() }()
	}
	fmt.Println(cmd.Process.Pid)
	select {}
}

// startParent runs the test binary as a parent in mode and returns it
// and the pid of the process it started.
func startParent(t *testing.T, mode string) (*exec.Cmd, int) {
	t.Helper()
	parent := exec.Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), parentEnv+"="+mode)
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	parent.Stderr = os.Stderr
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		parent.Process.Kill()
		t.Fatalf("the parent printed no pid: %v", err)
	}
	pid, err := strconv.Atoi(line[:len(line)-1])
	if err != nil {
		t.Fatal(err)
	}
	return parent, pid
}

// A shim that dies (containerd SIGKILLs one that outlived its create
// deadline) takes the child it started with it; one started without
// dieWithParent outlives its parent, which is what left orphan QEMUs.
func TestChildDiesWithItsParent(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		survives bool
	}{{"die", false}, {"keep", true}} {
		t.Run(tc.mode, func(t *testing.T) {
			parent, pid := startParent(t, tc.mode)
			time.Sleep(200 * time.Millisecond) // the lockers have run and ended their threads
			if !Running(pid) {
				t.Fatalf("the child %d died while its parent lived", pid)
			}
			parent.Process.Signal(syscall.SIGKILL)
			parent.Wait()
			deadline := time.Now().Add(5 * time.Second)
			for Running(pid) && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			if got := Running(pid); got != tc.survives {
				t.Errorf("child alive after its parent was killed: %v, want %v", got, tc.survives)
			}
			syscall.Kill(pid, syscall.SIGKILL)
		})
	}
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(parentEnv); mode != "" {
		os.Exit(actAsParent(mode == "die"))
	}
	os.Exit(m.Run())
}
