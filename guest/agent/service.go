// Package agent implements the c8s guest agent's ttrpc services (Agent and
// IO from guest/api/agent/v1): it creates containers from the host's OCI
// specs with the guest's OCI runtime (crun by default, runc as the
// alternative; guest/ociruntime), tracks their processes and buffers their
// output.
package agent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/ttrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/api/reportdata"
	"github.com/c8s-dev/c8s/guest/ociruntime"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/rootfs"
)

// Version is the agent's version, reported by GetInfo.
var Version = "dev"

var (
	errNoStdin     = fmt.Errorf("the process has no stdin: %w", errdefs.ErrFailedPrecondition)
	errStdinClosed = fmt.Errorf("the process's stdin is closed: %w", errdefs.ErrFailedPrecondition)
)

// Config configures a Service. Paths are configurable so the service can be
// tested on a host without touching the guest's locations.
type Config struct {
	// StateDir holds one bundle directory per container
	// (guest: /run/c8s/containers).
	StateDir string
	// CgroupsParent is the cgroup containers are created under (guest: /c8s).
	CgroupsParent string
	// Runtime drives the OCI runtime (crun, or runc).
	Runtime *ociruntime.Runtime
	// MountRootfs mounts a container's root filesystem on target. Nil means
	// the guest's way: find the virtio-scsi disk and mount it.
	MountRootfs func(ctx context.Context, r *agentapi.Rootfs, target string) error
	// Channel names the transport for GetInfo ("virtio-serial" or "vsock").
	Channel string
	// PowerOff is called by Shutdown after filesystems are synced. Nil makes
	// Shutdown fail.
	PowerOff func()
	// Evidence produces TEE evidence binding reportData (guest/attest). Nil
	// makes GetEvidence fail: the guest has no TEE to vouch for it.
	Evidence func(ctx context.Context, reportData [64]byte) (*agentapi.GetEvidenceResponse, error)
	// KBSDial opens a byte stream to the pod's key broker (the guest: a
	// stream over the c8s.kbs port that the host relays). Nil dials TCP.
	KBSDial func(ctx context.Context, network, addr string) (net.Conn, error)
	// SecretsDir holds the pod's secrets (guest: SecretsDir).
	SecretsDir string
	// MountSecrets prepares SecretsDir before secrets are written to it
	// (guest: MountSecretsTmpfs). Nil only creates the directory.
	MountSecrets func(dir string) error
	// LoadNetDriver loads the virtio-net driver before the pod's NICs are
	// configured (guest: the deferred modules). Nil loads nothing.
	LoadNetDriver func()
	// LoadNetfilter loads the netfilter modules the mesh's redirects need
	// (nf_tables, NAT, redirect), only for a pod whose init data has a
	// [mesh] section (guest: the deferred modules). Nil loads nothing.
	LoadNetfilter func()
	// SharedDir is where the pod's virtio-fs share is mounted (guest:
	// SharedDir); MountShared mounts it there (nil: mount -t virtiofs).
	SharedDir   string
	MountShared func(tag, target string) error
	// SysDir is where sysfs is mounted (guest: /sys); OnlineCPUMem brings
	// hot-plugged vCPUs and memory online below it.
	SysDir string
	// ProcDir is where procfs is mounted (guest: /proc); PortForward reads
	// the listening sockets from it.
	ProcDir string
	// TEE is the TEE the guest was started as: c8s.tee on its measured
	// kernel command line (guest/api/teeparam), "" for none. The host
	// cannot change it without changing the launch measurement. In a
	// guest started as a TEE (sim too, so that CI runs the same code)
	// containers' writes and emptyDir volumes stay in guest memory
	// (confidential.go); in one started as snp or tdx without init data
	// the agent enforces policyapi.ZeroLaunchDefault.
	TEE string
	// ScratchSize bounds the tmpfs that holds the writable layer of a
	// container without a memory limit (a tmpfs size= value: bytes with
	// an optional k, m or g, or a percentage of the guest's RAM); a
	// container with a memory limit gets that limit. Default
	// DefaultScratchSize; the guest takes c8s.scratch_size from its
	// kernel command line.
	ScratchSize string
	// EmptyDirDir is where the pod's emptyDir volumes are kept in guest
	// memory, a tmpfs of EmptyDirSize (default: "emptydir" beside
	// StateDir, /run/c8s/emptydir in the guest; DefaultScratchSize, or
	// c8s.emptydir_size on the guest's kernel command line).
	EmptyDirDir  string
	EmptyDirSize string
	// LoadOverlay loads overlayfs before the first writable layer is
	// mounted (guest: the deferred overlay module). Nil loads nothing.
	LoadOverlay func()
	// LayersDir is where image layers are mounted (layers.go; default:
	// "layers" beside StateDir, /run/c8s/layers in the guest).
	LayersDir string
	// LayerDevices finds layer disks and maps them through dm-verity
	// (nil: GuestLayerDevices); LoadVerity loads device-mapper and
	// dm-verity before the first layer is mapped (guest: the deferred
	// modules). Nil loads nothing.
	LayerDevices LayerDevices
	LoadVerity   func()
	// ImagesDir is where images the guest pulls are kept (pull.go;
	// default: "images" beside StateDir, /run/c8s/images in the guest);
	// PullWait bounds a CreateContainer's wait for its image's pull
	// (default DefaultPullWait).
	ImagesDir string
	PullWait  time.Duration
}

// Service implements agentapi.AgentService and agentapi.IOService.
type Service struct {
	cfg      Config
	bootedAt time.Time

	mu         sync.Mutex
	containers map[string]*container
	// policy is the agent policy of the pod's measured init data;
	// policySet once SetInitData accepted it.
	policy    initdata.AgentPolicy
	policySet bool
	// eval decides host requests under the [policy] section of the
	// pod's init data (policy.go); nil until SetInitData.
	eval *policy.Evaluator
	// launchKnown once requirePolicy has read the launch digest from the
	// guest's evidence; launchMeasured if it is not zero (the VM was
	// launched with init data).
	launchKnown, launchMeasured bool
	// launchProvider names the evidence provider requirePolicy read it
	// from ("" without one).
	launchProvider string
	// secrets are the pod's secrets, once fetched from its key broker.
	secrets []secretMount
	// fetching serializes fetchSecrets: one broker handshake at a time,
	// none once the secrets are kept.
	fetching sync.Mutex
	// share is the pod's virtio-fs share, once mounted (sharedfs.go).
	share shareState
	// forward holds the port-forward connections (portforward.go).
	forward *portForward
	// zeroLaunch is set once the built-in policy of an snp or tdx VM
	// launched without init data is in force (confidential.go).
	zeroLaunch bool
	// overlayOnce loads overlayfs; emptyDirs is the emptyDir tmpfs, once
	// mounted (confidential.go).
	overlayOnce sync.Once
	emptyDirs   shareState
	// layers are the pod's open image layers (layers.go).
	layers layerStore
	// mesh is the pod's attested mesh (mesh.go).
	mesh meshState
	// pulls are the images the guest pulls (pull.go).
	pulls pullStore
}

var (
	_ agentapi.AgentService = (*Service)(nil)
	_ agentapi.IOService    = (*Service)(nil)
)

// New returns a Service.
func New(cfg Config) (*Service, error) {
	if cfg.StateDir == "" || cfg.Runtime == nil || cfg.Runtime.Reaper == nil {
		return nil, errors.New("agent.New: StateDir and Runtime (with a Reaper) are required")
	}
	if cfg.CgroupsParent == "" {
		cfg.CgroupsParent = "/c8s"
	}
	if cfg.SecretsDir == "" {
		cfg.SecretsDir = filepath.Join(cfg.StateDir, "secrets")
	}
	if cfg.MountSecrets == nil {
		cfg.MountSecrets = func(dir string) error { return os.MkdirAll(dir, 0o700) }
	}
	if cfg.SysDir == "" {
		cfg.SysDir = "/sys"
	}
	if cfg.MountRootfs == nil {
		cfg.MountRootfs = MountSCSIRootfs
	}
	if cfg.ScratchSize == "" {
		cfg.ScratchSize = DefaultScratchSize
	}
	if cfg.EmptyDirSize == "" {
		cfg.EmptyDirSize = DefaultScratchSize
	}
	if cfg.EmptyDirDir == "" {
		cfg.EmptyDirDir = filepath.Join(filepath.Dir(filepath.Clean(cfg.StateDir)), "emptydir")
	}
	if err := os.MkdirAll(cfg.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("create the agent's state dir: %w", err)
	}
	s := &Service{cfg: cfg, bootedAt: bootTime(), containers: map[string]*container{}}
	s.forward = newPortForward(s)
	return s, nil
}

// NewServer returns a ttrpc server with both services registered. Errors
// leave it as gRPC statuses carrying the errdefs class (NotFound, ...).
func (s *Service) NewServer() (*ttrpc.Server, error) {
	srv, err := ttrpc.NewServer(ttrpc.WithUnaryServerInterceptor(
		func(ctx context.Context, unmarshal ttrpc.Unmarshaler, info *ttrpc.UnaryServerInfo, method ttrpc.Method) (resp interface{}, err error) {
			// The agent is PID 1: a panic must fail the request, not
			// the VM.
			defer func() {
				if r := recover(); r != nil {
					log.G(ctx).WithField("method", info.FullMethod).Errorf("panic: %v\n%s", r, debug.Stack())
					resp, err = nil, errgrpc.ToGRPC(fmt.Errorf("agent panic in %s: %v: %w", info.FullMethod, r, errdefs.ErrInternal))
				}
			}()
			resp, err = method(ctx, unmarshal)
			if err != nil {
				log.G(ctx).WithError(err).WithField("method", info.FullMethod).Debug("request failed")
				return resp, errgrpc.ToGRPC(err)
			}
			return resp, nil
		}))
	if err != nil {
		return nil, err
	}
	agentapi.RegisterAgentService(srv, s)
	agentapi.RegisterIOService(srv, s)
	agentapi.RegisterPortForwardService(srv, s.forward)
	return srv, nil
}

// MountSCSIRootfs is the guest's MountRootfs: it finds the rootfs disk on the
// virtio-scsi controller, waiting for a hotplugged disk, and mounts it.
func MountSCSIRootfs(ctx context.Context, r *agentapi.Rootfs, target string) error {
	scsi := r.GetScsi()
	if scsi == nil {
		return fmt.Errorf("rootfs has no source (only scsi is supported): %w", errdefs.ErrInvalidArgument)
	}
	dev, err := rootfs.FindSCSIDisk(ctx, "/sys", "/dev", scsi.GetTarget(), scsi.GetLun(), 10*time.Second)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	return rootfs.Mount(dev, r.GetFstype(), r.GetOptions(), target)
}

// bootTime is when the kernel booted.
func bootTime() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return time.Now()
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// GetInfo answers the shim's readiness probe.
func (s *Service) GetInfo(ctx context.Context, _ *agentapi.GetInfoRequest) (*agentapi.GetInfoResponse, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return nil, fmt.Errorf("uname: %w", err)
	}
	return &agentapi.GetInfoResponse{
		AgentVersion:  Version,
		KernelRelease: unix.ByteSliceToString(u.Release[:]),
		Channel:       s.cfg.Channel,
		BootedAt:      timestamppb.New(s.bootedAt),
	}, nil
}

// Shutdown syncs filesystems and powers the VM off once the reply is sent.
func (s *Service) Shutdown(ctx context.Context, _ *agentapi.Empty) (*agentapi.Empty, error) {
	if s.cfg.PowerOff == nil {
		return nil, fmt.Errorf("this agent cannot power off (not running as the VM's init): %w", errdefs.ErrNotImplemented)
	}
	log.G(ctx).Info("shutdown requested")
	unix.Sync()
	go func() {
		// Give ttrpc a moment to send the reply before the VM goes away.
		time.Sleep(200 * time.Millisecond)
		s.cfg.PowerOff()
	}()
	return &agentapi.Empty{}, nil
}

// GetEvidence returns evidence from the guest's TEE with the host's nonce
// bound into it in the host-attestation domain: REPORT_DATA is
// reportdata.Host(nonce), never bytes the host chose, so the host cannot
// have the pod's TEE sign a key broker's handshake (or any other use's
// binding) for it.
func (s *Service) GetEvidence(ctx context.Context, r *agentapi.GetEvidenceRequest) (*agentapi.GetEvidenceResponse, error) {
	if len(r.Nonce) > reportdata.MaxNonce {
		return nil, fmt.Errorf("nonce has %d bytes, at most %d: %w", len(r.Nonce), reportdata.MaxNonce, errdefs.ErrInvalidArgument)
	}
	if s.cfg.Evidence == nil {
		return nil, fmt.Errorf("this guest has no TEE evidence provider: %w", errdefs.ErrFailedPrecondition)
	}
	ev, err := s.cfg.Evidence(ctx, reportdata.Host(r.Nonce))
	if err != nil {
		return nil, fmt.Errorf("get TEE evidence: %w", err)
	}
	// The host attests the pod before its first container: the launch
	// digest of this evidence spares requirePolicy reading its own.
	s.noteLaunch(ev)
	return ev, nil
}

// lookup returns a container or NotFound.
func (s *Service) lookup(id string) (*container, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.containers[id]
	if !ok {
		return nil, fmt.Errorf("container %q: %w", id, errdefs.ErrNotFound)
	}
	return c, nil
}

// process returns a container's process (init for an empty execID).
func (s *Service) process(containerID, execID string) (*container, *process, error) {
	c, err := s.lookup(containerID)
	if err != nil {
		return nil, nil, err
	}
	p, err := c.process(execID)
	if err != nil {
		return nil, nil, err
	}
	return c, p, nil
}

// ReadStdout returns the next stdout bytes of a process.
func (s *Service) ReadStdout(ctx context.Context, req *agentapi.ReadStreamRequest) (*agentapi.ReadStreamResponse, error) {
	return s.readStream(ctx, req, false)
}

// ReadStderr returns the next stderr bytes of a process.
func (s *Service) ReadStderr(ctx context.Context, req *agentapi.ReadStreamRequest) (*agentapi.ReadStreamResponse, error) {
	return s.readStream(ctx, req, true)
}

func (s *Service) readStream(ctx context.Context, req *agentapi.ReadStreamRequest, stderr bool) (*agentapi.ReadStreamResponse, error) {
	c, p, err := s.process(req.GetContainerId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := s.checkRead(c, req.GetExecId(), stderr); err != nil {
		return nil, err
	}
	out := p.stdout
	if stderr {
		out = p.stderr
	}
	data, eof, err := out.read(ctx, int(req.GetMaxBytes()))
	if err != nil {
		return nil, err
	}
	return &agentapi.ReadStreamResponse{Data: data, Eof: eof}, nil
}

// WriteStdin writes all of data to a process's stdin.
func (s *Service) WriteStdin(ctx context.Context, req *agentapi.WriteStdinRequest) (*agentapi.WriteStdinResponse, error) {
	c, p, err := s.process(req.GetContainerId(), req.GetExecId())
	if err != nil {
		return nil, err
	}
	if err := s.checkStdin(c, req.GetExecId()); err != nil {
		return nil, err
	}
	n, err := p.stdin.write(ctx, req.GetData())
	if err != nil {
		return &agentapi.WriteStdinResponse{Written: uint32(n)}, fmt.Errorf("write stdin of %s: %w", p.name(req.GetContainerId()), err)
	}
	return &agentapi.WriteStdinResponse{Written: uint32(n)}, nil
}
