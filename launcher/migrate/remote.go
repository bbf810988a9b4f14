package migrate

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// Remote is a pod VM that a destination node runs after a migration, as
// the source's shim sees it: the same methods as a *vm.VM for what a pod
// needs after its move (agent channel, exit, stop). Hot-plugging disks
// into it is not supported yet.
type Remote struct {
	c     *Client
	in    IncomingResponse
	disks map[string]vm.DiskAddress

	done     chan struct{}
	stopOnce sync.Once
	cancel   context.CancelFunc
	mu       sync.Mutex
	stopping bool
	err      error
}

// NewRemote follows the destination VM in (started by c's server) until
// it exits. disks are the disks it was started with, at targets 0..n-1.
func NewRemote(c *Client, in IncomingResponse, disks []vm.Disk) *Remote {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Remote{c: c, in: in, disks: map[string]vm.DiskAddress{}, done: make(chan struct{}), cancel: cancel}
	for i, d := range disks {
		r.disks[d.ID] = vm.DiskAddress{Target: i}
	}
	go r.follow(ctx)
	return r
}

// follow waits for the VM's exit on the destination.
func (r *Remote) follow(ctx context.Context) {
	defer close(r.done)
	for {
		st, err := r.c.Wait(ctx, r.in.ID)
		switch {
		case err == nil:
			if st.Error != "" {
				r.setErr(fmt.Errorf("the pod VM on node %s: %s", r.in.Node.Name, st.Error))
			}
			return
		case ctx.Err() != nil:
			return
		case errors.Is(err, ErrNotFound):
			r.setErr(fmt.Errorf("node %s no longer runs the pod VM", r.in.Node.Name))
			return
		}
		// The connection broke: a server that is gone took its VMs along.
		if _, serr := r.c.Status(ctx, r.in.ID); serr != nil && !errors.Is(serr, context.Canceled) {
			r.setErr(fmt.Errorf("lost the destination node %s: %v", r.in.Node.Name, err))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

func (r *Remote) setErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.stopping {
		r.err = err
	}
}

// Node is the destination node's name.
func (r *Remote) Node() string { return r.in.Node.Name }

// Done is closed once the VM has exited.
func (r *Remote) Done() <-chan struct{} { return r.done }

// Err says why the VM exited; nil after Stop.
func (r *Remote) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Pid is the destination QEMU's pid (on the destination host).
func (r *Remote) Pid() int { return r.in.Pid }

// ConsolePath is the destination VM's console log (a path on the
// destination host).
func (r *Remote) ConsolePath() string { return filepath.Join(r.in.StateDir, vm.ConsoleLogName) }

// DialAgent connects to the VM's agent channel through the destination's
// API.
func (r *Remote) DialAgent(ctx context.Context) (net.Conn, error) {
	return r.c.DialAgent(ctx, r.in.ID)
}

// DiskAddress returns where the guest has the disk id.
func (r *Remote) DiskAddress(id string) (vm.DiskAddress, bool) {
	a, ok := r.disks[id]
	return a, ok
}

var errNoHotplug = errors.New("hot-plugging disks into a pod VM after its migration is not supported yet")

// AddDisk is not supported after a migration.
func (r *Remote) AddDisk(context.Context, vm.Disk) (vm.DiskAddress, error) {
	return vm.DiskAddress{}, errNoHotplug
}

// RemoveDisk is not supported after a migration.
func (r *Remote) RemoveDisk(context.Context, string) error { return errNoHotplug }

// Close stops following the VM without stopping it.
func (r *Remote) Close() {
	r.cancel()
	<-r.done
}

// Stop stops the VM on the destination and waits for it.
func (r *Remote) Stop(ctx context.Context) error {
	var err error
	r.stopOnce.Do(func() {
		r.mu.Lock()
		r.stopping = true
		r.err = nil
		r.mu.Unlock()
		err = r.c.Delete(ctx, r.in.ID)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
		}
		r.cancel()
		<-r.done
	})
	return err
}
