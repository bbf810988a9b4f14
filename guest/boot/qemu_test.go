package boot_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// testVM is the guest image booted under QEMU (TCG) with the agent built
// by this test as /init, its agent port on a unix socket.
type testVM struct {
	dir   string // the test's scratch dir
	sock  string // the agent port's socket
	agent agentapi.AgentService
	io    agentapi.IOService
	close func() // closes the agent connection
	// done receives QEMU's exit; a test that takes it must put it back
	// for the cleanup.
	done chan error
}

// needVM skips unless VM tests are asked for (C8S_AGENT_VM_TEST=1, or make
// test's C8S_E2E_REQUIRED=1), and returns the image dir (C8S_IMAGE_DIR,
// default _output/image).
func needVM(t *testing.T) string {
	t.Helper()
	if os.Getenv("C8S_AGENT_VM_TEST") != "1" && os.Getenv("C8S_E2E_REQUIRED") != "1" {
		t.Skip("set C8S_AGENT_VM_TEST=1 to boot the guest image (needs make image, qemu-system-x86_64)")
	}
	imgDir := os.Getenv("C8S_IMAGE_DIR")
	if imgDir == "" {
		imgDir = filepath.Join("..", "..", "_output", "image")
	}
	imgDir, err := filepath.Abs(imgDir)
	if err != nil {
		t.Fatal(err)
	}
	return imgDir
}

// bootVM boots the image in imgDir with the kernel parameters params,
// memory memMiB and the devices in extra besides the agent port, waits
// until the agent answers GetInfo and returns it connected. The VM is
// killed at cleanup, and its console logged if the test failed.
func bootVM(t *testing.T, imgDir, dir, params string, memMiB string, extra ...string) *testVM {
	t.Helper()
	vm := startVM(t, imgDir, dir, params, memMiB, extra...)
	booted := time.Now()
	vm.agent, vm.io, vm.close = dialAgent(t, vm.sock)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := vm.agent.GetInfo(cctx, &agentapi.GetInfoRequest{})
		ccancel()
		if err == nil {
			t.Logf("GetInfo after %s: %+v", time.Since(booted).Round(time.Millisecond), info)
			return vm
		}
		if ctx.Err() != nil {
			t.Fatalf("agent never answered GetInfo: %v", err)
		}
		vm.close()
		vm.agent, vm.io, vm.close = dialAgent(t, vm.sock)
	}
}

// consoleLog is where startVM has QEMU write the guest's console.
func consoleLog(dir string) string { return filepath.Join(dir, "console.log") }

// startVM starts QEMU as bootVM does, without connecting to the agent.
func startVM(t *testing.T, imgDir, dir, params string, memMiB string, extra ...string) *testVM {
	t.Helper()
	initrd := agentInitrd(t, imgDir, dir)
	vm := &testVM{dir: dir, sock: filepath.Join(dir, "agent.sock")}
	console := consoleLog(dir)
	args := []string{"-accel", "tcg", "-m", memMiB,
		"-kernel", filepath.Join(imgDir, "vmlinuz"), "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 no_timer_check c8s.log_level=debug " + params, // no_timer_check: as launcher/vm.BaseKernelParams
		"-nographic", "-no-reboot", "-nodefaults",
		"-serial", "file:" + console,
		"-device", "virtio-serial",
		"-chardev", "socket,id=agent,path=" + vm.sock + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=c8s.agent",
	}
	qemu := exec.Command("qemu-system-x86_64", append(args, extra...)...)
	if err := qemu.Start(); err != nil {
		t.Fatal(err)
	}
	qemuDone := make(chan error, 1)
	vm.done = qemuDone
	go func() { qemuDone <- qemu.Wait() }()
	t.Cleanup(func() {
		_ = qemu.Process.Kill()
		<-qemuDone
		if t.Failed() {
			out, _ := os.ReadFile(console)
			t.Logf("guest console:\n%s", out)
		}
	})
	return vm
}
