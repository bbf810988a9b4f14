// Package layers gives a pod VM its containers' image layers: each layer
// a read-only disk from the node's layer cache (launcher/layercache),
// built from the layer's blob in containerd's content store where the
// cache lacks it, attached once per pod however many of its containers
// use it, and detached when the last of them is removed. The guest opens
// each through dm-verity and stacks them with overlayfs (guest/agent);
// where the pod's measured policy pins the layers, with the policy's root
// hashes, never these.
//
// A Pod records its use of a layer in the cache (a reference) before the
// disk is attached and drops it after the disk is detached or the VM is
// gone, so that pruning the cache never takes a disk a running pod uses.
package layers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"

	"github.com/containerd/log"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/vm"
)

// ErrUnavailable says layer mode cannot serve a container: it has no
// image in containerd, its snapshot is not the image's, or a layer the
// cache lacks has no blob left in the content store. The caller may fall
// back to copying the container's snapshot where that is allowed.
var ErrUnavailable = errors.New("the container's image layers are not available")

// Images is containerd's view of container images (launcher/ctrdimage's
// Client).
type Images interface {
	ContainerImage(ctx context.Context, id string) (ctrdimage.Image, error)
	HasBlob(ctx context.Context, d digest.Digest) (bool, error)
	OpenBlob(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error)
}

// Info describes a layer disk as the converter built it.
type Info struct {
	DiffID     digest.Digest
	RootHash   string
	DataBlocks uint64
	Size       int64
}

// Converter writes the layer disk (measurements/layer's format) of one
// layer blob of the given media type to out.
type Converter func(ctx context.Context, blob io.Reader, mediaType string, out io.ReadWriteSeeker) (Info, error)

// Cache is the node's layer cache (launcher/layercache's Cache).
type Cache interface {
	Lookup(diffID digest.Digest) (layercache.Entry, error)
	Acquire(ctx context.Context, diffID digest.Digest, ref layercache.Ref, build layercache.Builder) (layercache.Entry, bool, error)
	Release(ctx context.Context, diffID digest.Digest, ref string) error
}

// Machine is the pod VM's disk bus (the shim's Sandbox).
type Machine interface {
	AttachDisk(ctx context.Context, d vm.Disk) (vm.DiskAddress, error)
	DetachDisk(ctx context.Context, id string) error
}

// Pod is the layers of one pod VM.
type Pod struct {
	cache   Cache
	convert Converter
	ref     layercache.Ref

	mu     sync.Mutex
	layers map[digest.Digest]*podLayer
	// conts are the layers of each container, bottom first.
	conts map[string][]digest.Digest
}

// podLayer is one layer the pod holds.
type podLayer struct {
	diffID digest.Digest
	// users are the containers using it.
	users map[string]bool
	// ready is closed once acquired (or failed: err); entry is the
	// cached disk.
	ready chan struct{}
	err   error
	entry layercache.Entry
	// gone is set once its last user left and it is being released,
	// and closed when that is done.
	gone chan struct{}

	// attachMu serializes attaching; addr is set once attached.
	attachMu sync.Mutex
	addr     *vm.DiskAddress
}

// NewPod returns the layers of the pod whose cache reference is ref.
func NewPod(cache Cache, convert Converter, ref layercache.Ref) *Pod {
	return &Pod{cache: cache, convert: convert, ref: ref, layers: map[digest.Digest]*podLayer{}, conts: map[string][]digest.Digest{}}
}

// RefName is the name of the pod's references in the cache.
func (p *Pod) RefName() string { return p.ref.Name }

// DiskID is the name of a layer's disk in the pod VM.
func DiskID(diffID digest.Digest) string {
	hex := diffID.Encoded()
	if len(hex) > 24 {
		hex = hex[:24]
	}
	return "layer-" + hex
}

// Prepare makes ready the layers of container id's image, as images
// resolves it: each layer the pod does not hold yet is acquired in the
// cache with the pod's reference (built from its blob where missing,
// several at once). It returns the container's layer disks, bottom first;
// Attach then attaches them. On error the container holds nothing; an
// error wrapping ErrUnavailable comes before anything was acquired.
func (p *Pod) Prepare(ctx context.Context, images Images, id string) ([]vm.Disk, error) {
	im, err := images.ContainerImage(ctx, id)
	if errors.Is(err, ctrdimage.ErrNotImage) {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if err != nil {
		return nil, err
	}
	if len(im.Layers) == 0 {
		return nil, fmt.Errorf("%w: image %s has no layers", ErrUnavailable, im.Name)
	}
	if err := p.checkBlobs(ctx, images, im); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if _, dup := p.conts[id]; dup {
		p.mu.Unlock()
		return nil, fmt.Errorf("container %s: layers already prepared", id)
	}
	ids := make([]digest.Digest, len(im.Layers))
	for i, l := range im.Layers {
		ids[i] = l.DiffID
	}
	p.conts[id] = ids
	p.mu.Unlock()

	disks, err := p.acquireAll(ctx, images, id, im)
	if err != nil {
		p.Release(context.WithoutCancel(ctx), nil, id)
		return nil, err
	}
	return disks, nil
}

// checkBlobs makes sure each layer that neither the pod nor the cache
// holds can be built: its blob is still in the content store.
func (p *Pod) checkBlobs(ctx context.Context, images Images, im ctrdimage.Image) error {
	for _, l := range im.Layers {
		p.mu.Lock()
		_, held := p.layers[l.DiffID]
		p.mu.Unlock()
		if held {
			continue
		}
		if _, err := p.cache.Lookup(l.DiffID); err == nil {
			continue
		} else if !errors.Is(err, layercache.ErrNotCached) {
			return err
		}
		ok, err := images.HasBlob(ctx, l.Blob.Digest)
		if err != nil {
			return fmt.Errorf("layer %s of image %s: %w", l.DiffID, im.Name, err)
		}
		if !ok {
			return fmt.Errorf("%w: layer %s of image %s is not in the node's layer cache and its blob %s is gone from containerd's content store "+
				"(containerd's CRI discards unpacked layers when discard_unpacked_layers = true: set it to false and pull the image again)",
				ErrUnavailable, l.DiffID, im.Name, l.Blob.Digest)
		}
	}
	return nil
}

// acquireAll acquires the container's layers, at most GOMAXPROCS builds
// at a time, and returns their disks.
func (p *Pod) acquireAll(ctx context.Context, images Images, id string, im ctrdimage.Image) ([]vm.Disk, error) {
	disks := make([]vm.Disk, len(im.Layers))
	errs := make([]error, len(im.Layers))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, l := range im.Layers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			pl, err := p.use(ctx, images, id, l)
			if err != nil {
				errs[i] = err
				return
			}
			disks[i] = vm.Disk{ID: DiskID(l.DiffID), Path: pl.entry.Path, ReadOnly: true}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return disks, nil
}

// use adds container id to the users of layer l, acquiring it for the
// pod if it is the first.
func (p *Pod) use(ctx context.Context, images Images, id string, l ctrdimage.Layer) (*podLayer, error) {
	for {
		p.mu.Lock()
		pl := p.layers[l.DiffID]
		if pl != nil && pl.gone != nil {
			// Its last user went a moment ago: wait until it is
			// released, then acquire it again.
			gone := pl.gone
			p.mu.Unlock()
			select {
			case <-gone:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		first := pl == nil
		if first {
			pl = &podLayer{diffID: l.DiffID, users: map[string]bool{}, ready: make(chan struct{})}
			p.layers[l.DiffID] = pl
		}
		pl.users[id] = true
		p.mu.Unlock()
		if first {
			pl.entry, pl.err = p.acquire(ctx, images, l)
			p.mu.Lock()
			if pl.err != nil && p.layers[l.DiffID] == pl {
				delete(p.layers, l.DiffID)
			}
			close(pl.ready)
			p.mu.Unlock()
		} else {
			select {
			case <-pl.ready:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if pl.err != nil {
			return nil, pl.err
		}
		return pl, nil
	}
}

// acquire takes the pod's reference on the layer in the cache, building
// its disk from the blob when the cache lacks it.
func (p *Pod) acquire(ctx context.Context, images Images, l ctrdimage.Layer) (layercache.Entry, error) {
	build := func(ctx context.Context, out *os.File) (layercache.Meta, error) {
		rc, err := images.OpenBlob(ctx, l.Blob)
		if err != nil {
			return layercache.Meta{}, err
		}
		defer rc.Close()
		info, err := p.convert(ctx, rc, l.Blob.MediaType, out)
		if err != nil {
			return layercache.Meta{}, fmt.Errorf("convert blob %s (%s): %w", l.Blob.Digest, l.Blob.MediaType, err)
		}
		return layercache.Meta{DiffID: info.DiffID, RootHash: info.RootHash, DataBlocks: info.DataBlocks, Size: info.Size,
			Source: l.Blob.Digest, MediaType: l.Blob.MediaType}, nil
	}
	e, built, err := p.cache.Acquire(ctx, l.DiffID, p.ref, build)
	if err != nil {
		return layercache.Entry{}, err
	}
	if built {
		log.G(ctx).WithFields(log.Fields{"layer": l.DiffID, "blob": l.Blob.Digest, "size": e.Size, "took_ms": e.BuildMillis}).Info("layer disk built")
	}
	return e, nil
}

// Attach attaches container id's layers (Prepare) to m, those the pod VM
// does not have yet, and returns them as the agent's Rootfs.layers,
// bottom first.
func (p *Pod) Attach(ctx context.Context, m Machine, id string) ([]*agent.Layer, error) {
	p.mu.Lock()
	ids, ok := p.conts[id]
	var pls []*podLayer
	for _, d := range ids {
		pls = append(pls, p.layers[d])
	}
	p.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("container %s: layers not prepared", id)
	}
	out := make([]*agent.Layer, 0, len(pls))
	for _, pl := range pls {
		if pl == nil {
			return nil, fmt.Errorf("container %s: a layer was released before it was attached", id)
		}
		addr, err := pl.attach(ctx, m)
		if err != nil {
			return nil, fmt.Errorf("attach layer %s: %w", pl.diffID, err)
		}
		out = append(out, &agent.Layer{
			Scsi:       &agent.ScsiDisk{Target: uint32(addr.Target), Lun: uint32(addr.LUN)},
			Digest:     pl.diffID.String(),
			RootHash:   pl.entry.RootHash,
			DataBlocks: pl.entry.DataBlocks,
		})
	}
	return out, nil
}

func (pl *podLayer) attach(ctx context.Context, m Machine) (vm.DiskAddress, error) {
	pl.attachMu.Lock()
	defer pl.attachMu.Unlock()
	if pl.addr != nil {
		return *pl.addr, nil
	}
	addr, err := m.AttachDisk(ctx, vm.Disk{ID: DiskID(pl.diffID), Path: pl.entry.Path, ReadOnly: true})
	if err != nil {
		return vm.DiskAddress{}, err
	}
	pl.addr = &addr
	return addr, nil
}

// Release drops container id's use of its layers: a layer no other
// container of the pod uses is detached from m (nil: the VM is gone) and
// the pod's reference on it dropped. Errors are logged: the container is
// gone either way.
func (p *Pod) Release(ctx context.Context, m Machine, id string) {
	p.mu.Lock()
	ids := p.conts[id]
	delete(p.conts, id)
	var last []*podLayer
	for _, d := range ids {
		pl := p.layers[d]
		if pl == nil || !pl.users[id] {
			continue
		}
		delete(pl.users, id)
		if len(pl.users) == 0 {
			pl.gone = make(chan struct{})
			last = append(last, pl)
		}
	}
	p.mu.Unlock()
	for _, pl := range last {
		p.close(ctx, m, pl)
	}
}

// Close releases every layer of the pod, whose VM is gone.
func (p *Pod) Close(ctx context.Context) {
	p.mu.Lock()
	var all []*podLayer
	for _, pl := range p.layers {
		if pl.gone == nil {
			pl.gone = make(chan struct{})
			all = append(all, pl)
		}
	}
	p.conts = map[string][]digest.Digest{}
	p.mu.Unlock()
	for _, pl := range all {
		p.close(ctx, nil, pl)
	}
}

// close detaches a layer its last user left and drops the pod's
// reference.
func (p *Pod) close(ctx context.Context, m Machine, pl *podLayer) {
	<-pl.ready // an acquisition in flight ends first
	pl.attachMu.Lock()
	if pl.addr != nil && m != nil {
		if err := m.DetachDisk(ctx, DiskID(pl.diffID)); err != nil {
			log.G(ctx).WithError(err).WithField("layer", pl.diffID).Warn("detach layer disk")
		}
	}
	pl.addr = nil
	pl.attachMu.Unlock()
	if err := p.cache.Release(ctx, pl.diffID, p.ref.Name); err != nil {
		log.G(ctx).WithError(err).WithField("layer", pl.diffID).Warn("drop the pod's reference on a cached layer")
	}
	p.mu.Lock()
	if p.layers[pl.diffID] == pl {
		delete(p.layers, pl.diffID)
	}
	close(pl.gone)
	p.mu.Unlock()
}

// Attached lists the diff IDs of the layers attached to the pod VM.
func (p *Pod) Attached() []digest.Digest {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []digest.Digest
	for d, pl := range p.layers {
		pl.attachMu.Lock()
		if pl.addr != nil {
			out = append(out, d)
		}
		pl.attachMu.Unlock()
	}
	return out
}
