package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/guest/attest"
)

// snpEvidence is an evidence provider whose SNP reports carry hostData.
func snpEvidence(hostData [32]byte, calls *int) func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
	return func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		*calls++
		r := make([]byte, 1184)
		copy(r[snpHostDataOffset:], hostData[:])
		return &agentapi.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: r}, nil
	}
}

// A malicious host that never hands the agent the pod's init data (or
// calls ahead of it) must not get the allow-all policy of a pod without
// one: a VM launched with init data takes no container, exec or update
// until SetInitData has put its policy in force.
func TestMaliciousHostSkipsInitData(t *testing.T) {
	ctx := context.Background()
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	calls := 0
	svc := &Service{cfg: Config{Evidence: snpEvidence(initdata.Digest(doc), &calls)}, containers: map[string]*container{}}
	_, err := svc.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "c1", Rootfs: rootfsReq()})
	if !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("CreateContainer before SetInitData in a VM launched with init data: %v, want failed precondition", err)
	}
	// No container can exist yet, so exec and update are refused before
	// the lookup: a host that skipped SetInitData must not get NotFound
	// from a check that never ran.
	if _, err := svc.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "none", ExecId: "e0", Process: []byte(`{"args":["sh"]}`)}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("ExecProcess in an unknown container before SetInitData: %v, want failed precondition", err)
	}
	if _, err := svc.UpdateContainer(ctx, &agentapi.UpdateContainerRequest{ContainerId: "none", Resources: []byte(`{}`)}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("UpdateContainer of an unknown container before SetInitData: %v, want failed precondition", err)
	}
	svc.containers["c0"] = &container{id: "c0", init: &process{done: make(chan struct{})}, execs: map[string]*process{}}
	if _, err := svc.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c0", ExecId: "e1", Process: []byte(`{"args":["sh"]}`)}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("ExecProcess before SetInitData: %v, want failed precondition", err)
	}
	if _, err := svc.UpdateContainer(ctx, &agentapi.UpdateContainerRequest{ContainerId: "c0", Resources: []byte(`{}`)}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("UpdateContainer before SetInitData: %v, want failed precondition", err)
	}
	if calls != 1 {
		t.Errorf("the launch digest was read %d times, want once", calls)
	}
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
	if err := svc.requirePolicy(ctx, "create"); err != nil {
		t.Fatalf("after SetInitData: %v", err)
	}
	// Its policy then holds: exec is refused by allow_exec = false.
	if _, err := svc.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "c0", ExecId: "e1", Process: []byte(`{"args":["sh"]}`)}); !errdefs.IsPermissionDenied(err) {
		t.Fatalf("exec under the policy: %v, want permission denied", err)
	}
}

// A VM launched without init data (HOST_DATA zero) or without a TEE has
// the allow-all policy from the start.
func TestNoInitDataAllowsAll(t *testing.T) {
	ctx := context.Background()
	calls := 0
	zero := &Service{cfg: Config{Evidence: snpEvidence([32]byte{}, &calls)}}
	for range 2 {
		if err := zero.requirePolicy(ctx, "create"); err != nil {
			t.Fatalf("HOST_DATA zero: %v", err)
		}
	}
	if calls != 1 {
		t.Errorf("the launch digest was read %d times, want once", calls)
	}
	if err := (&Service{}).requirePolicy(ctx, "create"); err != nil {
		t.Fatalf("no evidence source: %v", err)
	}
	noTEE := &Service{cfg: Config{Evidence: func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		return nil, fmt.Errorf("%w: looked everywhere", attest.ErrNoProvider)
	}}}
	if err := noTEE.requirePolicy(ctx, "create"); err != nil {
		t.Fatalf("a guest without a TEE: %v", err)
	}
	// Any other failure to read the launch digest refuses: fail closed.
	broken := &Service{cfg: Config{Evidence: func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		return nil, errors.New("the TEE device timed out")
	}}}
	if err := broken.requirePolicy(ctx, "create"); err == nil {
		t.Fatal("a failed evidence read let a container through")
	}
}

// A malicious host asking an SNP or TDX guest to bring hot-plugged memory
// online would have the guest use memory it never accepted: refused. The
// sim TEE's guest is no confidential VM and may grow.
func TestMaliciousHostOnlinesMemoryInACVM(t *testing.T) {
	ctx := context.Background()
	for provider, refused := range map[string]bool{"sev-guest": true, "configfs-tsm": true, "tdx-guest": true, attest.NameSim: false} {
		calls := 0
		ev := snpEvidence([32]byte{}, &calls)
		svc := &Service{cfg: Config{SysDir: t.TempDir(), Evidence: func(ctx context.Context, rd [64]byte) (*agentapi.GetEvidenceResponse, error) {
			r, err := ev(ctx, rd)
			if r != nil {
				r.Provider = provider
			}
			return r, err
		}}}
		_, err := svc.OnlineCPUMem(ctx, &agentapi.OnlineCPUMemRequest{TimeoutMs: 1})
		if got := errdefs.IsFailedPrecondition(err); got != refused {
			t.Errorf("provider %s: OnlineCPUMem = %v, want refused %v", provider, err, refused)
		}
	}
}

// A guest started as snp or tdx is a confidential VM whatever provider its
// evidence names: hot-plugged memory stays offline even if the evidence
// read says "sim".
func TestMaliciousHostOnlinesMemoryInAGuestStartedAsCVM(t *testing.T) {
	ctx := context.Background()
	for _, tee := range []string{teeparam.SNP, teeparam.TDX} {
		calls := 0
		svc := &Service{cfg: Config{TEE: tee, SysDir: t.TempDir(), Evidence: snpEvidence([32]byte{}, &calls)}}
		if _, err := svc.OnlineCPUMem(ctx, &agentapi.OnlineCPUMemRequest{TimeoutMs: 1}); !errdefs.IsFailedPrecondition(err) {
			t.Errorf("guest started as %s, evidence from %q: OnlineCPUMem = %v, want refused", tee, attest.NameSim, err)
		}
	}
}

// The same, when the host hands the init data first: SetInitData reads
// the evidence too, and what it says of the launch (a confidential VM)
// must hold for the requests after it.
func TestMaliciousHostOnlinesMemoryAfterInitData(t *testing.T) {
	ctx := context.Background()
	doc := []byte("version = \"0.1\"\n")
	calls := 0
	ev := snpEvidence(initdata.Digest(doc), &calls)
	svc := &Service{containers: map[string]*container{}, cfg: Config{SysDir: t.TempDir(), Evidence: func(ctx context.Context, rd [64]byte) (*agentapi.GetEvidenceResponse, error) {
		r, err := ev(ctx, rd)
		if r != nil {
			r.Provider = "sev-guest"
		}
		return r, err
	}}}
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.OnlineCPUMem(ctx, &agentapi.OnlineCPUMemRequest{TimeoutMs: 1}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("OnlineCPUMem in an SNP guest after SetInitData: %v, want refused", err)
	}
}

// The host attests the pod (GetEvidence) before its first container; the
// agent takes the launch digest from that evidence rather than reading
// its own again. A VM launched with init data still takes no container
// before SetInitData, whichever request read the digest first.
func TestMaliciousHostAttestsThenSkipsInitData(t *testing.T) {
	ctx := context.Background()
	doc := []byte("version = \"0.1\"\n[agent_policy]\nallow_exec = false\n")
	calls := 0
	svc := &Service{cfg: Config{Evidence: snpEvidence(initdata.Digest(doc), &calls)}, containers: map[string]*container{}}
	if _, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: []byte("host nonce")}); err != nil {
		t.Fatal(err)
	}
	_, err := svc.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: "c1", Rootfs: rootfsReq()})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "init data") {
		t.Fatalf("CreateContainer after GetEvidence, before SetInitData, in a VM launched with init data: %v, want failed precondition for the init data", err)
	}
	// Refused before the lookup, not NotFound.
	if _, err := svc.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "none", ExecId: "e0", Process: []byte(`{"args":["sh"]}`)}); !errdefs.IsFailedPrecondition(err) {
		t.Fatalf("ExecProcess after GetEvidence, before SetInitData: %v, want failed precondition", err)
	}
	if calls != 1 {
		t.Errorf("evidence was read %d times, want once (the host's GetEvidence)", calls)
	}
}

// A VM launched without init data: the evidence the host asked for says
// so, and the first create reads no evidence of its own.
func TestGetEvidenceSparesTheLaunchRead(t *testing.T) {
	ctx := context.Background()
	calls := 0
	svc := &Service{cfg: Config{Evidence: snpEvidence([32]byte{}, &calls)}}
	if _, err := svc.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: []byte("n")}); err != nil {
		t.Fatal(err)
	}
	if err := svc.requirePolicy(ctx, "create"); err != nil {
		t.Fatalf("HOST_DATA zero: %v", err)
	}
	if calls != 1 {
		t.Errorf("evidence was read %d times, want once", calls)
	}
	// Evidence whose launch digest cannot be read records nothing: the
	// create reads its own, and fails closed on it.
	short := &Service{cfg: Config{Evidence: func(context.Context, [64]byte) (*agentapi.GetEvidenceResponse, error) {
		return &agentapi.GetEvidenceResponse{Kind: "snp", Provider: "sim", Report: make([]byte, 16)}, nil
	}}}
	if _, err := short.GetEvidence(ctx, &agentapi.GetEvidenceRequest{Nonce: []byte("n")}); err != nil {
		t.Fatal(err)
	}
	if err := short.requirePolicy(ctx, "create"); err == nil {
		t.Fatal("evidence without a readable launch digest let a container through")
	}
}
