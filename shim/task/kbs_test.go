package task

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/c8s-dev/c8s/launcher/broker"
	"github.com/c8s-dev/c8s/launcher/config"
)

// A pod whose init data asks for broker secrets never starts unattested:
// with attestation off nothing would fetch them.
func TestSecretsNeedAttestation(t *testing.T) {
	cert, _, err := broker.SelfSigned([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf("version = \"0.1\"\n[kbs]\nurl = \"https://127.0.0.1:8443\"\ncert = '''\n%s'''\n[[kbs.secrets]]\nresource = \"default/key/db-password\"\npath = \"/run/secrets/db\"\n", cert)
	pod := &podState{id: "p1", initData: []byte(doc)}
	pod.cfg.Attestation.Mode = config.AttestOff
	err = attestSandbox(context.Background(), nil, pod)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "key broker") {
		t.Fatalf("attestSandbox = %v, want a failed precondition naming the key broker", err)
	}
	pod.initData = nil
	if err := attestSandbox(context.Background(), nil, pod); err != nil {
		t.Fatalf("attestation off without init data: %v", err)
	}
}
