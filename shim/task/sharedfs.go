package task

import (
	"context"
	"fmt"
	"os"
	"slices"

	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/sharedfs"
)

// FSDir is the directory of the virtio-fs share of the pod whose VM
// state dir is stateDir, for `shim delete`, which recorded only that
// (launcher/config/statedir lays the directories out).
func FSDir(stateDir string) string {
	return statedir.FSDir(stateDir)
}

// startShare starts the pod's virtio-fs share when hypervisor.
// virtio_fs_daemon is set; nil otherwise.
func startShare(ctx context.Context, pod *podState) (*sharedfs.Share, *vm.SharedFS, error) {
	daemon := pod.cfg.Hypervisor.VirtioFSDaemon
	if daemon == "" {
		return nil, nil, nil
	}
	sh, err := sharedfs.Start(ctx, daemon, pod.fsDir)
	if err != nil {
		return nil, nil, fmt.Errorf("pod %s: %w", pod.id, err)
	}
	return sh, &vm.SharedFS{Socket: sh.Socket(), Tag: sharedfs.Tag}, nil
}

// shareMounts shares the host paths container id bind-mounts that are not
// passed by value (byValue): directories, and files too large to copy.
// Without a share they are left to the guest, which drops them.
func (s *service) shareMounts(ctx context.Context, pod *podState, id string, spec *specs.Spec, byValue []*agent.File) ([]*agent.SharedMount, error) {
	if pod.share == nil {
		return nil, nil
	}
	var out []*agent.SharedMount
	for i, m := range spec.Mounts {
		if m.Type != "bind" && !hasOption(m.Options, "bind") && !hasOption(m.Options, "rbind") {
			continue
		}
		if slices.ContainsFunc(byValue, func(f *agent.File) bool { return f.Source == m.Source }) {
			continue
		}
		if slices.ContainsFunc(out, func(sm *agent.SharedMount) bool { return sm.Source == m.Source }) {
			continue
		}
		fi, err := os.Stat(m.Source)
		if err != nil || !(fi.IsDir() || fi.Mode().IsRegular()) {
			continue // sockets, devices, missing paths: the guest drops them
		}
		name := fmt.Sprintf("%s-%d", id, i)
		if err := pod.share.Add(m.Source, name, hasOption(m.Options, "ro")); err != nil {
			s.unshare(ctx, pod, id)
			return nil, fmt.Errorf("share %s of container %q with the pod VM: %w", m.Source, id, err)
		}
		s.mu.Lock()
		pod.shared[id] = append(pod.shared[id], name)
		s.mu.Unlock()
		sm := &agent.SharedMount{Source: m.Source, Name: name}
		if fi.IsDir() {
			// Without them a read-only volume's own mounts turn read-only
			// in the guest too (best effort: the volume works without).
			if sm.Submounts, err = sharedfs.Submounts(m.Source); err != nil {
				log.G(ctx).WithError(err).WithField("source", m.Source).Warn("list the mounts below a shared path")
			}
		}
		out = append(out, sm)
	}
	return out, nil
}

// unshare removes the shares of container id.
func (s *service) unshare(ctx context.Context, pod *podState, id string) {
	if pod == nil || pod.share == nil {
		return
	}
	s.mu.Lock()
	names := pod.shared[id]
	delete(pod.shared, id)
	s.mu.Unlock()
	for _, n := range names {
		if err := pod.share.Remove(n); err != nil {
			log.G(ctx).WithError(err).WithField("container", id).Warn("unshare host path")
		}
	}
}

// closeShare stops the pod's virtiofsd and unmounts what it shared.
func closeShare(ctx context.Context, pod *podState) {
	if pod.share == nil {
		return
	}
	if err := pod.share.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("stop the pod's virtio-fs share")
	}
}
