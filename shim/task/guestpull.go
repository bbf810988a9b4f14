package task

import (
	"context"
	"errors"
	"fmt"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/layercache"
)

// Guest pull: where the pod's measured policy names, in a container's
// rule, a digest-pinned image for the guest to pull (policy pull), the
// shim may offer the container no root at all (an empty Rootfs: neither a
// disk nor layers), and the guest pulls and verifies that image itself
// over the pod's network (guest/agent pull.go). The shim never names the
// image: the reference is the policy's. runtime.guest_pull decides
// (config.Runtime.GuestPull): by default the guest pulls where the rule
// pins no layers (the guest refuses the node's disks under such a rule)
// or the node's layer cache lacks one of them, so that a node that has
// converted the image starts it from its disks, and one that has not
// does not convert it on the pod's critical path.

// ContainerNameAnnotation is containerd CRI's container name annotation,
// which the policy names container rules by.
const ContainerNameAnnotation = "io.kubernetes.cri.container-name"

// pullRule returns the policy rule of the container of spec id, as the
// guest matches it (guest/api/policy), or nil.
func pullRule(initData []byte, id string, spec *specs.Spec) *policyapi.Container {
	if len(initData) == 0 {
		return nil
	}
	doc, err := initdata.Parse(initData)
	if err != nil || doc.Policy == nil {
		return nil
	}
	p := doc.Policy
	switch spec.Annotations[ContainerTypeAnnotation] {
	case "sandbox":
		return p.Sandbox
	case "container":
		return p.Containers[spec.Annotations[ContainerNameAnnotation]]
	}
	return p.Containers[id]
}

// Cached is the part of the node's layer cache the decision reads.
type Cached interface {
	Lookup(diffID digest.Digest) (layercache.Entry, error)
}

// guestPulls decides whether container id's root is the image its rule
// has the guest pull: mode is runtime.guest_pull, cache the node's layer
// cache (nil: not opened).
func guestPulls(mode string, rule *policyapi.Container, cache func() (Cached, error)) (bool, string) {
	if rule == nil || rule.Pull == "" || mode == config.GuestPullNever {
		return false, ""
	}
	if len(rule.Layers) == 0 {
		return true, "the rule pins no layers"
	}
	if mode == config.GuestPullAlways {
		return true, "runtime.guest_pull = always"
	}
	c, err := cache()
	if err != nil {
		return true, fmt.Sprintf("the node's layer cache: %v", err)
	}
	for _, l := range rule.Layers {
		if _, err := c.Lookup(digest.Digest(l.Digest)); err != nil {
			if errors.Is(err, layercache.ErrNotCached) {
				return true, fmt.Sprintf("layer %s is not in the node's layer cache", l.Digest)
			}
			return true, fmt.Sprintf("layer %s: %v", l.Digest, err)
		}
	}
	return false, ""
}

// guestPullRoot returns the root of container r if the guest pulls its
// image, or nil.
func (s *service) guestPullRoot(ctx context.Context, pod *podState, r *taskAPI.CreateTaskRequest) *containerRoot {
	if pod.cfg.Runtime.GuestPull == config.GuestPullNever {
		return nil
	}
	_, spec, err := readSpec(r.Bundle)
	if err != nil {
		return nil
	}
	rule := pullRule(pod.initData, r.ID, spec)
	ok, why := guestPulls(pod.cfg.Runtime.GuestPull, rule, func() (Cached, error) {
		return layercache.Open(pod.cfg.LayerCachePath())
	})
	if !ok {
		return nil
	}
	log.G(ctx).WithFields(log.Fields{"container": r.ID, "image": rule.Pull, "why": why}).Info("no layer disks: the guest pulls the image its policy names")
	return &containerRoot{pulled: true}
}
