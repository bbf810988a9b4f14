package policy

import (
	"fmt"
	"path"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// AnnotationSandboxUID is the pod's uid, which containerd's CRI annotates
// each of the pod's specs with.
const AnnotationSandboxUID = "io.kubernetes.cri.sandbox-uid"

// An emptyDir mount's source, once the guest adapted it (guest/spec), is
// <emptyDir tmpfs>/<pod uid>/<volume name>: the volume is its last
// element, the pod its parent.

// volumeMatch reports whether an emptyDir mount from source is the
// volume want names; want "" is any volume.
func volumeMatch(want policyapi.Pattern, source string) bool {
	return want == "" || want.Match(path.Base(source))
}

// emptyDirPod refuses an emptyDir of another pod than the VM's: the host
// names an emptyDir by the kubelet's path, pods/<uid>/volumes/...; under
// another uid, a volume of the same name is another directory, and the
// containers that should share it would not. The pod is the sandbox's
// (its io.kubernetes.cri.sandbox-uid annotation) or, without one, the
// pod of the first emptyDir the policy admitted.
func (e *Evaluator) emptyDirPod(k *checker, who Identity, ann map[string]string, ms []specs.Mount, kinds []policyapi.MountKind) {
	e.mu.Lock()
	defer e.mu.Unlock()
	pod := e.podUID
	if who.Sandbox() && pod == "" {
		pod = ann[AnnotationSandboxUID]
	}
	first := ""
	for i, m := range ms {
		if i >= len(kinds) || kinds[i] != policyapi.KindEmptyDir {
			continue
		}
		uid := path.Base(path.Dir(m.Source))
		switch {
		case pod == "" && first == "":
			first = uid
		case pod == "" && uid == first, uid == pod:
		default:
			want := pod
			if want == "" {
				want = first
			}
			d := k.deny(fmt.Sprintf("mounts[%d].source", i), fmt.Sprintf("emptyDir %q of pod %q", path.Base(m.Source), uid), "", fmt.Sprintf("the emptyDirs of pod %q", want))
			d.Reason = "another pod's emptyDir"
			d.Hint = "a pod VM holds one pod's emptyDir volumes: under another pod uid the volume is another directory, which the containers that share it would not see"
		}
	}
	if e.podUID != "" || len(k.ds) > 0 && !e.Audit() {
		return
	}
	if pod == "" {
		pod = first
	}
	e.podUID = pod
}

// MountShare decides whether the guest may mount the host's virtio-fs
// share for container id's create: only if some rule of the policy
// allows a shared mount. Otherwise no create of the pod could use it,
// and the guest kernel's FUSE client is kept from the host's server.
func (e *Evaluator) MountShare(id string) error {
	if !e.Governs() {
		return nil
	}
	rules := []*policyapi.Container{e.p.Sandbox, e.p.Default}
	for _, r := range e.p.Containers {
		rules = append(rules, r)
	}
	for _, r := range rules {
		if r == nil {
			continue
		}
		for _, m := range r.Mounts {
			if m.Kind == policyapi.KindShared {
				return nil
			}
		}
	}
	k := &checker{req: "CreateContainer", id: id}
	rule := "policy.containers.*.mounts"
	if e.p.Default != nil {
		rule = e.defaultKey() + ".mounts"
	}
	d := k.deny("shared mounts", "", rule, "")
	d.Reason = "no rule of the policy allows a mount of kind shared"
	d.Hint = "the host's paths (hostPath, configMap, secret and projected volumes) reach the guest over virtio-fs, which this pod's policy never uses: the guest does not mount it"
	return e.decide(k.ds)
}
