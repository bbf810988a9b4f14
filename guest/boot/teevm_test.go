package boot_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/attest"
)

// TestSNPGuestWithoutSNPInVM boots the image under TCG as a host that
// starts a VM as snp (c8s.tee=snp on the command line) without SEV-SNP
// would, with the sim TEE's attestation port it serves as bait. The real
// agent on the real guest kernel must see that the hardware is not SEV-SNP
// (attest.KernelHardware) and power the VM off before it serves anything,
// the reason on the console, where the shim reports it from. It runs as
// neither snp nor the sim TEE nor none. Gated like TestAgentInVM.
func TestSNPGuestWithoutSNPInVM(t *testing.T) {
	imgDir := needVM(t)
	dir := t.TempDir()
	attestSock := filepath.Join(dir, "attest.sock")
	vm := startVM(t, imgDir, dir, "c8s.tee=snp", "512",
		"-chardev", "socket,id=attest,path="+attestSock+",server=on,wait=off",
		"-device", "virtserialport,chardev=attest,name=c8s.attest",
	)
	started := time.Now()
	deadline := time.After(3 * time.Minute)
wait:
	for {
		select {
		case err := <-vm.done:
			vm.done <- err // for the cleanup
			t.Logf("QEMU exited after %s: %v", time.Since(started).Round(time.Millisecond), err)
			break wait
		case <-deadline:
			t.Fatal("the VM started as snp without SEV-SNP still runs after 3 minutes; want it powered off")
		case <-time.After(200 * time.Millisecond):
		}
		out, _ := os.ReadFile(consoleLog(dir))
		if strings.Contains(string(out), "msg=serving") {
			t.Fatal("the agent of a VM started as snp without SEV-SNP serves; want it powered off")
		}
	}
	out, err := os.ReadFile(consoleLog(dir))
	if err != nil {
		t.Fatal(err)
	}
	console := string(out)
	for _, line := range strings.Split(console, "\n") {
		if strings.Contains(line, "fatal error in c8s-agent") {
			t.Logf("the console says: %s", line)
		}
	}
	for _, want := range []string{"fatal error in c8s-agent", attest.ErrHardwareMismatch.Error(), "started as snp", "c8s.tee=snp",
		"does not run in AMD SEV-SNP", "/" + attest.SNPSysfsDir, attest.TDXGuestFlag} {
		if !strings.Contains(console, want) {
			t.Errorf("the console does not say %q", want)
		}
	}
	if strings.Contains(console, "msg=serving") {
		t.Error("the agent served before it powered the VM off")
	}
}
