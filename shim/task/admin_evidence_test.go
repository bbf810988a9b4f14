package task

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
	"github.com/c8s-dev/c8s/shim/task/internal/fakesandbox"
)

// The Admin API's Evidence: the caller's nonce reaches the guest, the
// guest's evidence comes back as it is, with the pod's launch parameters.
func TestAdminEvidence(t *testing.T) {
	h := newHarness(t, setup{hypervisor: "tee = \"sim\"\ndefault_vcpus = 2"})
	a := admin{h.s}
	nonce := bytes.Repeat([]byte{7}, 32)
	if _, err := a.Evidence(h.ctx, &adminapi.EvidenceRequest{Nonce: nonce}); !isClass(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Evidence with no pod: %v, want FailedPrecondition", errClass(err))
	}
	h.create("pod1", "pod1")
	sb := h.vm()
	for _, n := range [][]byte{nil, make([]byte, reportdata.MaxNonce+1)} {
		if _, err := a.Evidence(h.ctx, &adminapi.EvidenceRequest{Nonce: n}); !isClass(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Evidence with a %d-byte nonce: %v, want InvalidArgument", len(n), errClass(err))
		}
	}
	if c := sb.Calls("GetEvidence"); len(c) != 0 {
		t.Fatalf("a refused nonce reached the guest: %+v", c)
	}

	resp, err := a.Evidence(h.ctx, &adminapi.EvidenceRequest{Nonce: nonce})
	if err != nil {
		t.Fatal(err)
	}
	rd := reportdata.Host(nonce)
	if !bytes.Equal(resp.Report, rd[:]) || resp.Kind != fakesandbox.EvidenceKind || resp.Provider != fakesandbox.EvidenceProvider || string(resp.CertTable) != "certs" ||
		string(resp.EventLog) != "event log" || string(resp.SimRtmrs) != "rtmrs" {
		t.Errorf("evidence %+v: not the guest's for the caller's nonce", resp)
	}
	if resp.Sandbox != "pod1" || resp.Tee != "sim" || resp.Vcpus != 2 || !strings.HasSuffix(resp.Manifest, "manifest.json") {
		t.Errorf("launch parameters %+v", resp)
	}
	if len(resp.HostData) != 0 || len(resp.Mrconfigid) != 0 {
		t.Errorf("a pod without init data has expected digests %x %x", resp.HostData, resp.Mrconfigid)
	}

	doc := []byte("version = \"0.1.0\"\n")
	h.s.mu.Lock()
	h.s.pod.initData = doc
	h.s.mu.Unlock()
	if resp, err = a.Evidence(h.ctx, &adminapi.EvidenceRequest{Nonce: nonce}); err != nil {
		t.Fatal(err)
	}
	hd, mc := initdata.Digest(doc), initdata.DigestTDX(doc)
	if !bytes.Equal(resp.HostData, hd[:]) || !bytes.Equal(resp.Mrconfigid, mc[:]) {
		t.Errorf("expected digests %x %x, want those of the pod's init data %x %x", resp.HostData, resp.Mrconfigid, hd, mc)
	}

	sb.Fail("GetEvidence", errors.New("no TEE"))
	if _, err := a.Evidence(h.ctx, &adminapi.EvidenceRequest{Nonce: nonce}); !isClass(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no TEE") {
		t.Errorf("guest without evidence: %v, want FailedPrecondition with the reason", errClass(err))
	}
}
