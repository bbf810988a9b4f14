package agent

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
)

// TestMaliciousHostSetInitDataAgainKeepsSandbox: the host may hand the
// measured init data again (a re-attestation does). That must not put a
// fresh evaluator in force, which would forget the pod's one sandbox and
// admit a second.
func TestMaliciousHostSetInitDataAgainKeepsSandbox(t *testing.T) {
	doc := policyDoc(t, `
[policy.sandbox]
image = "registry.k8s.io/pause:3.10"
args = ["/pause"]
env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
working_dir = "/"
uid = 65535
gid = 65535
`)
	svc := snpService(t, doc)
	svc.secrets = []secretMount{{resource: "kbs:///default/key/db", source: "/x", destination: "/run/secrets/db"}}
	ctx := ctxT(t)
	sandbox := func(id string) error {
		_, err := svc.evaluator().CreateContainer(&policy.CreateContainer{ID: id, Spec: &specs.Spec{
			Annotations: map[string]string{policy.AnnotationContainerType: "sandbox", policy.AnnotationSandboxImageName: "registry.k8s.io/pause:3.10"},
			Process: &specs.Process{Args: []string{"/pause"}, Cwd: "/", Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
				User: specs.User{UID: 65535, GID: 65535}},
			Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
				MaskedPaths: policyapi.DefaultMaskedPaths, ReadonlyPaths: policyapi.DefaultReadonlyPaths},
		}})
		return err
	}
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatal(err)
	}
	if err := sandbox("pod1"); err != nil {
		t.Fatalf("the pod's sandbox: %v", err)
	}
	if err := sandbox("pod2"); err == nil {
		t.Fatal("a second sandbox was admitted under the first SetInitData")
	}
	if _, err := svc.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		t.Fatalf("the same init data again: %v", err)
	}
	if err := sandbox("pod2"); err == nil {
		t.Fatal("after the init data was handed again, a second sandbox was admitted: the policy's record of the pod was thrown away")
	}
}
