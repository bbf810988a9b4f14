package task

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// The pod VM's life in the service: started with the pod's first
// container (and attested before any container reaches it), watched for
// QEMU's death, stopped with the last container or at shutdown.

// ensureSandbox returns the pod VM, starting it with the first container's
// disks attached at boot. started reports whether this call started it; tr
// then becomes the pod's start trace.
func (s *service) ensureSandbox(ctx context.Context, pod *podState, disks []vm.Disk, tr *podTrace) (Sandbox, bool, error) {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	s.mu.Lock()
	sb := s.sb
	s.mu.Unlock()
	if sb != nil {
		select {
		case <-sb.Done():
			return nil, false, fmt.Errorf("pod VM %s has exited (%v): %w", pod.id, sb.Err(), errdefs.ErrFailedPrecondition)
		default:
			return sb, false, nil
		}
	}
	gpus, err := podGPUs(ctx, pod.cfg, pod.k8s)
	if err != nil {
		return nil, false, err
	}
	nics, fs, err := wireVM(ctx, pod)
	if err != nil {
		return nil, false, err
	}
	tr.mark("wire")
	sb, err = s.host.StartSandbox(ctx, sandbox.Options{
		ID:          pod.id,
		StateDir:    pod.stateDir,
		Config:      pod.cfg,
		InitData:    pod.initData,
		Disks:       disks,
		NICs:        nics,
		SharedFS:    fs,
		NetNS:       pod.netns,
		PortForward: pod.portForward,
		VFIO:        gpus,
	})
	if pod.network != nil {
		pod.network.ReleaseTaps() // QEMU has them now
	}
	if err != nil {
		unwireVM(ctx, pod)
		return nil, false, err
	}
	tr.mark("vm_start")
	tr.setBoot(sb)
	if err := attestSandbox(ctx, sb, pod); err != nil {
		sb.Stop(context.WithoutCancel(ctx))
		unwireVM(ctx, pod)
		return nil, false, err
	}
	tr.mark("attest")
	s.mu.Lock()
	s.sb = sb
	s.trace = tr
	s.mu.Unlock()
	go s.watchSandbox(sb, pod.id)
	return sb, true, nil
}

// attestSandbox gates the pod: unless attestation is off, it starts only
// once fresh evidence from its VM has verified against the image's
// expected launch digests.
func attestSandbox(ctx context.Context, sb Attester, pod *podState) error {
	if pod.cfg.Attestation.Mode == config.AttestOff {
		if doc, err := initdata.Parse(pod.initData); err == nil && len(doc.KBS.Secrets) > 0 {
			return fmt.Errorf("pod %s asks for secrets from a key broker, which releases them only to an attested pod: attestation.mode is off: %w", pod.id, errdefs.ErrFailedPrecondition)
		}
		log.G(ctx).WithField("sandbox", pod.id).Warn("attestation is off (attestation.mode): the pod VM is not verified")
		// The agent takes no container until it has the init data the VM
		// was launched with, verified or not.
		if len(pod.initData) == 0 {
			return nil
		}
		return sb.HandInitData(ctx)
	}
	t0 := time.Now()
	v, err := sb.Attest(ctx, pod.cfg)
	if err != nil {
		return fmt.Errorf("attestation of pod VM %s failed: %w: %w", pod.id, err, errdefs.ErrFailedPrecondition)
	}
	fields := log.Fields{"sandbox": pod.id, "provider": v.Provider, "took": time.Since(t0).Round(time.Millisecond)}
	if v.SNP != nil {
		fields["measurement"] = v.SNP.Measurement.String()
		fields["simulated"] = v.SNP.Simulated
		fields["vcpus"] = v.SNP.VCPUs
	}
	if v.TDX != nil {
		fields["mrtd"] = v.TDX.MRTD.String()
	}
	log.G(ctx).WithFields(fields).Info("pod VM attested")
	// Boot and verification are the shim's peak; it then idles for the
	// pod's life, so give the heap they used back to the node.
	debug.FreeOSMemory()
	return nil
}

// watchSandbox turns the death of the VM into exits of every process that
// was still running in it.
func (s *service) watchSandbox(sb Machine, id string) {
	<-sb.Done()
	err := sb.Err()
	s.mu.Lock()
	var procs []*process
	for _, c := range s.conts {
		procs = append(procs, c.init)
		for _, p := range c.execs {
			procs = append(procs, p)
		}
	}
	s.mu.Unlock()
	if err != nil {
		log.G(s.ctx).WithError(err).WithField("sandbox", id).Error("pod VM exited")
	}
	for _, p := range procs {
		s.exited(p, exitStatusVMLost, time.Now())
	}
}

// exitStatusVMLost is the exit status of processes whose VM died under
// them, as for a process killed by SIGKILL.
const exitStatusVMLost = 128 + 9

// stopSandbox tears the pod VM down and removes the pod's disk directory.
func (s *service) stopSandbox(ctx context.Context) {
	s.mu.Lock()
	sb, pod := s.sb, s.pod
	s.mu.Unlock()
	if sb != nil {
		if err := sb.Stop(context.WithoutCancel(ctx)); err != nil {
			log.G(ctx).WithError(err).Warn("stop pod VM")
		}
	}
	if pod != nil {
		// The VM is gone: so are its layer disks.
		if pl := pod.heldLayers(); pl != nil {
			pl.Close(ctx)
		}
		unwireVM(ctx, pod)
		os.Remove(filepath.Dir(pod.fsDir)) // once no other pod shares
		os.RemoveAll(pod.diskDir)
		// Drop the per-namespace dirs too once no other pod uses them.
		disks := filepath.Dir(pod.diskDir)
		os.Remove(disks)
		os.Remove(filepath.Dir(disks))
	}
	if sb != nil {
		s.podTrace().log(ctx)
	}
}

func vmGone(sb Machine) bool {
	select {
	case <-sb.Done():
		return true
	default:
		return false
	}
}
