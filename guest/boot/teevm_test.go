package boot_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// TestSNPGuestWithoutItsDeviceInVM boots the image under TCG as a host
// that starts an snp pod VM (c8s.tee=snp on the command line) without the
// SEV guest device would: no SEV-SNP, but the sim TEE's attestation port,
// which the host serves. The real agent on the real guest kernel (whose
// sev-guest module finds no SEV) must not take that port nor fall back to
// no TEE: evidence, and a container, are refused naming the missing
// device. Gated like TestAgentInVM.
func TestSNPGuestWithoutItsDeviceInVM(t *testing.T) {
	imgDir := needVM(t)
	dir := t.TempDir()
	attestSock := filepath.Join(dir, "attest.sock")
	vm := bootVM(t, imgDir, dir, "c8s.tee=snp", "512",
		"-chardev", "socket,id=attest,path="+attestSock+",server=on,wait=off",
		"-device", "virtserialport,chardev=attest,name=c8s.attest",
	)
	defer vm.close()
	agent := vm.agent
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	refused := func(what string, err error) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), "started as snp") || !strings.Contains(err.Error(), "/dev/sev-guest") {
			t.Errorf("%s in an snp guest without its SEV device: %v; want it refused, naming snp and /dev/sev-guest", what, err)
		}
	}
	_, err := agent.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: []byte("nonce")})
	refused("GetEvidence", err)
	_, err = agent.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "c1", Spec: []byte(`{"ociVersion":"1.1.0"}`),
		Rootfs: &agentapi.Rootfs{Fstype: "ext4", Options: []string{"ro"}, Source: &agentapi.Rootfs_Scsi{Scsi: &agentapi.ScsiDisk{Target: 2, Lun: 1}}}})
	refused("CreateContainer", err)
}
