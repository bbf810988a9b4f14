package sharedfs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/internal/child"
)

// parentEnv makes the test binary act as a shim that starts virtiofsd for
// a share in the directory the variable names, prints its pid and blocks.
const parentEnv = "C8S_SHAREDFS_TEST_PARENT"

func TestMain(m *testing.M) {
	if dir := os.Getenv(parentEnv); dir != "" {
		s, err := Start(context.Background(), debianVirtiofsd, dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(s.cmd.Process.Pid)
		select {}
	}
	os.Exit(m.Run())
}

// A shim killed before its QEMU connected to virtiofsd (between the
// share's start and the VM's device init) takes virtiofsd with it:
// virtiofsd would otherwise wait for a frontend for ever.
func TestVirtiofsdDiesWithTheShim(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for virtiofsd's sandbox")
	}
	if _, err := os.Stat(debianVirtiofsd); err != nil {
		t.Fatalf("%s: %v (qemu-system-common)", debianVirtiofsd, err)
	}
	dir := t.TempDir() + "/fs"
	shim := exec.Command(os.Args[0], "-test.run=^$")
	shim.Env = append(os.Environ(), parentEnv+"="+dir)
	out, err := shim.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	shim.Stderr = os.Stderr
	if err := shim.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		shim.Process.Kill()
		t.Fatalf("the shim printed no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p, err := os.FindProcess(pid); err == nil {
			p.Kill()
		}
		Cleanup(dir)
	})
	shim.Process.Kill()
	shim.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for child.Running(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("virtiofsd (pid %d) outlived its shim", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
