package policy

import (
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

const volumesPolicy = `
mounts = [
  { destination = "/cache", kind = "emptydir", volume = "cache" },
  { destination = "/shared", kind = "emptydir" },
]
`

// emptyDir binds the emptyDir volume name of pod uid on dest, as the
// guest adapts a kubelet emptyDir.
func emptyDir(s *specs.Spec, uid, name, dest string) *specs.Spec {
	s.Mounts = append(s.Mounts, specs.Mount{Destination: dest, Type: "bind", Source: "/run/c8s/emptydir/" + uid + "/" + name, Options: []string{"rbind", "rw"}})
	return s
}

// A rule names the emptyDir volume a mount is: the host can neither hand
// the container another volume (another container's) nor one of another
// pod; a mount without a volume name takes any of the pod's.
func TestMaliciousHostEmptyDirVolumes(t *testing.T) {
	e := evaluator(t, podPolicy+volumesPolicy)
	sidecar := func() *specs.Spec {
		s := appSpec()
		s.Annotations = map[string]string{AnnotationContainerType: "container", AnnotationContainerName: "sidecar", AnnotationImageName: "ghcr.io/example/sidecar@sha256:" + "0f6e4b9a3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f"}
		s.Process.Args, s.Process.Env, s.Process.User = []string{"/sidecar"}, nil, specs.User{}
		s.Mounts = standardMounts()
		return s
	}
	if _, err := create(t, e, emptyDir(emptyDir(sidecar(), "pod-1", "cache", "/cache"), "pod-1", "anything", "/shared")); err != nil {
		t.Fatalf("the volumes the rule names: %v", err)
	}
	d := denied(t, second(create(t, e, emptyDir(sidecar(), "pod-1", "secret-cache", "/cache"))), "mounts[6]", "policy.containers.sidecar.mounts")
	if d.Actual != `"/cache" (emptydir volume "secret-cache")` {
		t.Errorf("denial %v: want the volume named", d)
	}
	// The same volume name in another pod's directory.
	d = denied(t, second(create(t, e, emptyDir(sidecar(), "pod-2", "cache", "/cache"))), "mounts[6].source", "")
	if d.Reason != "another pod's emptyDir" {
		t.Errorf("denial %v", d)
	}
}

// The pod is the sandbox's, by its sandbox-uid annotation, before any
// emptyDir is mounted.
func TestEmptyDirPodFromSandbox(t *testing.T) {
	e := evaluator(t, podPolicy+volumesPolicy)
	s := sandboxSpec()
	s.Annotations[AnnotationSandboxUID] = "pod-1"
	sb, err := e.CreateContainer(&CreateContainer{ID: "pod", Spec: s, MountKinds: kindsOf(s.Mounts)})
	if err != nil {
		t.Fatal(err)
	}
	side := appSpec()
	side.Annotations = map[string]string{AnnotationContainerType: "container", AnnotationContainerName: "sidecar", AnnotationImageName: "ghcr.io/example/sidecar@sha256:" + "0f6e4b9a3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f"}
	side.Process.Args, side.Process.Env, side.Process.User = []string{"/sidecar"}, nil, specs.User{}
	side.Mounts = standardMounts()
	emptyDir(side, "pod-2", "cache", "/cache")
	_, err = e.CreateContainer(&CreateContainer{ID: "side", Spec: side, MountKinds: kindsOf(side.Mounts), Joined: sb})
	denied(t, err, "mounts[6].source", "")
}

func TestVolumeOnlyOnEmptyDir(t *testing.T) {
	p := parsePolicy(t, `
[policy.containers.x]
image = "i"
args = ["a"]
working_dir = "/"
uid = 0
gid = 0
mounts = [{ destination = "/d", kind = "tmpfs", volume = "cache" }]
`)
	if err := p.Validate(nil); err == nil {
		t.Error("a tmpfs mount naming a volume: Validate passed")
	}
}

// A pod whose policy allows no shared mount anywhere never has the host's
// virtio-fs mounted in the guest: a create that brings shares is refused
// before the agent mounts it (the guest kernel's FUSE client stays out of
// the host's reach). Audit mode logs it.
func TestMaliciousHostShareUnderPolicyWithoutOne(t *testing.T) {
	if err := evaluator(t, podPolicy).MountShare("abc"); err != nil {
		t.Fatalf("a policy with a shared mount: %v", err)
	}
	noShare := strings.Replace(podPolicy, `  { destination = "/var/run/secrets/kubernetes.io/serviceaccount", kind = "shared", read_only = true },
`, "", 1)
	d := denied(t, evaluator(t, noShare).MountShare("abc"), "shared mounts", "policy.containers.*.mounts")
	if d.ContainerID != "abc" || !strings.Contains(d.Reason, "kind shared") {
		t.Errorf("denial %v: want the container and the missing kind named", d)
	}
	if err := evaluator(t, "[policy]\naudit = true\n"+strings.TrimPrefix(noShare, "\n[policy]\n")).MountShare("abc"); err != nil {
		t.Errorf("audit mode: %v", err)
	}
	var none *Evaluator
	if err := none.MountShare("abc"); err != nil {
		t.Errorf("no policy: %v", err)
	}
}
