package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/containerd/log"
	"golang.org/x/sys/unix"
)

// How a layer's corruption reaches the host (layers.go): dm-verity fails
// the read of a block the host changed with EIO and marks the mapping
// corrupted. Reading the disk's blocks up front would make a container's
// start cost grow with its image, so the guest looks at the mapping's
// status where a failure shows:
//
//   - CreateContainer: the layer's mount, and the OCI runtime's create
//     (which reads the image's directories);
//   - StartContainer: before the start, and once the container's process
//     has exec'd its program or failed to (awaitLayeredStart), so that an
//     entrypoint the host changed fails the start naming the layer;
//   - ExecProcess: before the exec, and after a failed one;
//   - while the container runs (watchLayers), which kills it.
//
// Once seen, a layer's corruption refuses every later create, start and
// exec of a container that uses it.

// startExecWait bounds how long StartContainer waits for a layered
// container's process to exec its program.
const startExecWait = 5 * time.Second

// Bounds of the backoff between its looks at the process's program.
const (
	execPollMin = time.Millisecond
	execPollMax = 5 * time.Millisecond
)

// heldLayers returns the layers c holds.
func (c *container) heldLayers() []*layer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.layers
}

// layerFailure returns err, the failure of a request on container c, led
// by the corruption of a layer of c's if dm-verity has seen one: the cause
// the host must see.
func (s *Service) layerFailure(ctx context.Context, c *container, err error) error {
	if lerr := s.layersCorrupted(ctx, c.heldLayers()); lerr != nil {
		return fmt.Errorf("container %q: %w (the OCI runtime: %v)", c.id, lerr, err)
	}
	return err
}

// exeOf is the program process pid runs, or "" if it cannot be read.
func exeOf(pid int) string {
	exe, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return ""
	}
	return exe
}

// awaitLayeredStart waits, for a container of image layers, until its
// started process has exec'd its program (it runs another than before, the
// OCI runtime's) or has exited, and fails the start if a layer of the
// container was found corrupted meanwhile: the process is killed and the
// error names the layer.
func (s *Service) awaitLayeredStart(ctx context.Context, c *container, p *process, before string) error {
	ls := c.heldLayers()
	if len(ls) == 0 {
		return nil
	}
	deadline := time.Now().Add(startExecWait)
	// The exec comes within milliseconds of the runtime's start: look
	// again soon, then less often (an exit ends the wait at once).
	backoff := execPollMin
	for before != "" && !p.exited() && exeOf(p.pid) == before {
		if time.Now().After(deadline) {
			log.G(ctx).WithField("container", c.id).Debugf("its process has not exec'd its program after %v", startExecWait)
			break
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, execPollMax)
	}
	if err := s.layersCorrupted(ctx, ls); err != nil {
		if kerr := c.byID(func() error { return signalCgroup(c.cgroupPath(), unix.SIGKILL) }); kerr != nil && !errors.Is(kerr, errRemoved) {
			log.G(ctx).WithError(kerr).WithField("container", c.id).Warn("kill the container of a corrupted layer")
		}
		return fmt.Errorf("container %q failed to start: %w", c.id, err)
	}
	return nil
}

// layerWatchInterval is how often a running container's layers are
// looked at (watchLayers).
var layerWatchInterval = 250 * time.Millisecond

// watchLayers looks at the layers of container c while its init runs,
// every layerWatchInterval, and kills the container (its whole cgroup)
// once dm-verity has seen one corrupted: a block the host changed fails
// its read with EIO, which a program may take for a missing file (a
// config, a marker that turns authentication on) and run on without it;
// killed, it runs on no view of its image that the host has changed. The
// window is the interval. When init exits, a corruption seen is logged:
// what made it fail, if nothing else reported it.
func (s *Service) watchLayers(c *container, init *process) {
	tick := time.NewTicker(layerWatchInterval)
	defer tick.Stop()
	for {
		select {
		case <-init.done:
			if err := s.layersCorrupted(context.Background(), c.heldLayers()); err != nil {
				init.mu.Lock()
				status := init.status
				init.mu.Unlock()
				log.L.WithField("container", c.id).WithField("status", status).Errorf("container exited, and its image does not verify: %v", err)
			}
			return
		case <-tick.C:
			err := s.layersCorrupted(context.Background(), c.heldLayers())
			if err == nil {
				continue
			}
			log.L.WithField("container", c.id).Errorf("killing the container: its image does not verify: %v", err)
			if kerr := c.byID(func() error { return signalCgroup(c.cgroupPath(), unix.SIGKILL) }); kerr != nil && !errors.Is(kerr, errRemoved) {
				log.L.WithError(kerr).WithField("container", c.id).Warn("kill the container of a corrupted layer")
			}
			<-init.done
			return
		}
	}
}
