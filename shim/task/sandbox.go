package task

import (
	"context"
	"errors"
	"io"

	"github.com/containerd/containerd/v2/core/mount"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/layers"
	"github.com/c8s-dev/c8s/shim/rootfs"
	"github.com/c8s-dev/c8s/shim/sandbox"
)

// The service reaches the pod VM only through the interfaces below: Host
// builds root disks and starts the VM, and the Sandbox it starts is the
// guest's agent (Guest), the VM itself (Machine) and what vouches for it
// (Attester, Mover). shim/sandbox and shim/rootfs provide them in the
// shim (hostVMs); the tests use a fake (internal/fakesandbox).

// Host is what the service does on the host for the pod's VM.
type Host interface {
	// BuildRootfs writes the root disk image of a container whose rootfs
	// is mounts (on target), as shim/rootfs Build does.
	BuildRootfs(ctx context.Context, mounts []mount.Mount, target, image string) error
	// RemoveRootfs deletes an image BuildRootfs wrote; a missing one is
	// not an error.
	RemoveRootfs(image string) error
	// OpenImages connects to containerd's images (layer mode,
	// shim/layers); the caller closes them.
	OpenImages(ctx context.Context) (Images, error)
	// ConvertLayer writes the layer disk of a layer blob, as
	// layers.Convert does.
	ConvertLayer(ctx context.Context, blob io.Reader, mediaType string, out io.ReadWriteSeeker) (layers.Info, error)
	// StartSandbox boots the pod VM and waits for its agent. On error
	// nothing is left behind.
	StartSandbox(ctx context.Context, opts sandbox.Options) (Sandbox, error)
}

// Sandbox is a running pod VM.
type Sandbox interface {
	Guest
	Machine
	Attester
	Mover
}

// Guest is c8s-agent in the pod VM.
type Guest interface {
	// Agent carries the container and process calls.
	Agent() agent.AgentService
	// IO carries the processes' stdio.
	IO() agent.IOService
}

// Machine is the pod VM as hardware: its life, its disks and its size.
type Machine interface {
	// Done is closed when the VM has exited; Err then says why.
	Done() <-chan struct{}
	Err() error
	// Stop tears the VM down; it is idempotent.
	Stop(ctx context.Context) error
	// Pid is QEMU's host pid.
	Pid() int
	// AttachDisk makes d visible to the guest and says where.
	AttachDisk(ctx context.Context, d vm.Disk) (vm.DiskAddress, error)
	DetachDisk(ctx context.Context, id string) error
	// Size is the VM's vCPUs and memory and how far they can grow; Grow
	// hot-plugs up to at least vcpus and memMiB.
	Size() (vm.Size, error)
	Grow(ctx context.Context, vcpus, memMiB uint32) (vm.Size, error)
}

// Attester establishes trust in the pod VM.
type Attester interface {
	// Attest verifies fresh evidence from the VM against cfg's expected
	// digests, then hands the agent the pod's init data.
	Attest(ctx context.Context, cfg config.Config) (*sandbox.Verified, error)
	// HandInitData hands the agent the pod's init data unverified
	// (attestation off).
	HandInitData(ctx context.Context) error
}

// Mover live-migrates the pod VM (the Admin API's Migrate).
type Mover interface {
	Migrate(ctx context.Context, cfg config.Config, dst *migrate.Client, o sandbox.MigrateOptions) (*sandbox.Migrated, error)
	MigrationProgress() (vm.MigrationInfo, bool)
}

// Images is containerd's view of container images, for layer mode.
type Images interface {
	layers.Images
	io.Closer
}

// hostVMs is the shim's Host: real root disks and QEMU VMs, and the
// images of the containerd at address (its gRPC socket).
type hostVMs struct{ address string }

var _ Host = hostVMs{}

func (h hostVMs) OpenImages(context.Context) (Images, error) {
	if h.address == "" {
		return nil, errors.New("containerd's address is not known to the shim")
	}
	return ctrdimage.Dial(h.address)
}

// LayerAccountant counts the layer cache in cacheDir in the image file
// system of the shim's containerd (CRI ImageFsInfo), so that kubelet
// sees its bytes (layercache.Accountant; nil when the shim does not know
// containerd's address). The service uses it where its Host has it.
func (h hostVMs) LayerAccountant(cacheDir string) layercache.Accountant {
	if h.address == "" {
		return nil
	}
	return ctrdimage.NewImageFS(h.address, cacheDir)
}

func (hostVMs) ConvertLayer(ctx context.Context, blob io.Reader, mediaType string, out io.ReadWriteSeeker) (layers.Info, error) {
	return layers.Convert(ctx, blob, mediaType, out)
}

func (hostVMs) BuildRootfs(ctx context.Context, mounts []mount.Mount, target, image string) error {
	return rootfs.Build(ctx, mounts, target, image, rootfs.Options{FreeMiB: 256})
}

func (hostVMs) RemoveRootfs(image string) error { return rootfs.Remove(image) }

func (hostVMs) StartSandbox(ctx context.Context, opts sandbox.Options) (Sandbox, error) {
	sb, err := sandbox.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	return podVM{sb}, nil
}

// podVM is a *sandbox.Sandbox as a Sandbox: its Agent and IO fields
// become methods (which take precedence over the promoted fields).
type podVM struct{ *sandbox.Sandbox }

var _ Sandbox = podVM{}

func (v podVM) Agent() agent.AgentService { return v.Sandbox.Agent }
func (v podVM) IO() agent.IOService       { return v.Sandbox.IO }
