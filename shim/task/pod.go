package task

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/internal/child"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/shim/layers"
	"github.com/c8s-dev/c8s/shim/podnet"
	"github.com/c8s-dev/c8s/shim/sharedfs"
)

const (
	// SandboxIDAnnotation groups the containers of a Kubernetes pod; they
	// share one shim and one VM.
	SandboxIDAnnotation = "io.kubernetes.cri.sandbox-id"
	// DefaultConfigPath is read when the runtime options name no config.
	DefaultConfigPath = "/etc/c8s/config.toml"
	// ConfigPathEnv overrides DefaultConfigPath for a whole containerd.
	ConfigPathEnv = "C8S_CONFIG_PATH"
	// bundleStateFile records, in each bundle, what the shim created for
	// the container, so `shim delete` can clean up after a crashed shim.
	bundleStateFile = "c8s.json"
	// maxSharedFile bounds the host files passed by value into the guest.
	maxSharedFile = 1 << 20
)

// podState is what the shim fixed when the pod's first container arrived.
type podState struct {
	id       string
	cfg      config.Config
	stateDir string
	diskDir  string
	// initData is the pod's init data (guest/api/initdata).
	initData []byte
	// netns is the pod's network namespace (network.go); network is what
	// the shim set up in it while the VM runs.
	netns   string
	network *podnet.Network
	// portForward mirrors the pod's ports for CRI port-forward
	// (shim/portfwd): into netns, or with netns "" onto the node's
	// loopback.
	portForward bool
	// fsDir holds the pod's virtio-fs share (sharedfs.go); shared lists
	// the names shared per container.
	fsDir  string
	share  *sharedfs.Share
	shared map[string][]string
	// layers are the image layers attached to the VM (root.go), once a
	// container ran in layer mode.
	layersMu sync.Mutex
	layers   *layers.Pod
	// k8s is the Kubernetes pod, whose allocated GPUs the VM gets (gpu.go).
	k8s k8sPod
}

// heldLayers returns the pod's layers (nil if it has none).
func (p *podState) heldLayers() *layers.Pod {
	p.layersMu.Lock()
	defer p.layersMu.Unlock()
	return p.layers
}

// podFor returns the pod of a new container, fixing it on the first one.
// Every container of a shim must belong to the same sandbox.
func (s *service) podFor(ctx context.Context, ns string, r *taskAPI.CreateTaskRequest, spec *specs.Spec) (*podState, error) {
	id := r.ID
	if sid := spec.Annotations[SandboxIDAnnotation]; sid != "" {
		id = sid
	}
	s.mu.Lock()
	pod := s.pod
	s.mu.Unlock()
	if pod != nil {
		if pod.id != id {
			return nil, fmt.Errorf("container %q belongs to sandbox %q, but this shim serves sandbox %q: %w", r.ID, id, pod.id, errdefs.ErrInvalidArgument)
		}
		return pod, nil
	}
	path, err := configPath(r)
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfig(path)
	if err != nil {
		return nil, err
	}
	withAnn, err := cfg.WithAnnotations(spec.Annotations)
	if err != nil {
		return nil, fmt.Errorf("pod annotations: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if err := withAnn.Validate(); err != nil {
		return nil, fmt.Errorf("c8s configuration %s: %w: %w", path, err, errdefs.ErrInvalidArgument)
	}
	initData, err := podInitData(spec.Annotations, withAnn)
	if err != nil {
		return nil, fmt.Errorf("pod %s: %w: %w", id, err, errdefs.ErrInvalidArgument)
	}
	if len(initData) > 0 {
		// Measured at launch: SNP HOST_DATA, TDX MRCONFIGID (the sim TEE
		// takes HOST_DATA from the sandbox).
		d, dt := initdata.Digest(initData), initdata.DigestTDX(initData)
		withAnn.Hypervisor.SNP.HostData = hex.EncodeToString(d[:])
		withAnn.Hypervisor.TDX.MRConfigID = hex.EncodeToString(dt[:])
	}
	// Short, bounded directory names whatever the lengths of ns and id, so
	// that the VM's unix sockets fit (the VM's state dir holds an index
	// with both in full).
	dirs := statedir.ForPod(withAnn.Runtime.StateDir, ns, id)
	pod = &podState{
		id:       id,
		cfg:      withAnn,
		stateDir: dirs.VM,
		diskDir:  dirs.Disks,
		initData: initData,
		netns:    netnsPath(spec),
		// CRI pods get port-forward: into their network namespace, or, for
		// a host-network pod, onto the node's loopback, where containerd
		// dials it for them.
		portForward: netnsPath(spec) != "" || spec.Annotations[ContainerTypeAnnotation] == "sandbox",
		fsDir:       dirs.FS,
		shared:      map[string][]string{},
		k8s:         k8sPodOf(spec.Annotations),
	}
	log.G(ctx).WithFields(log.Fields{"sandbox": id, "config": path, "tee": withAnn.Hypervisor.TEE}).Info("new pod")
	s.mu.Lock()
	s.pod = pod
	s.mu.Unlock()
	return pod, nil
}

// podInitData returns the pod's init data: the annotation io.c8s.initdata
// (base64), else the node's default file (attestation.initdata), else none.
// It must parse, so that a typo fails the pod here rather than in the VM.
func podInitData(ann map[string]string, cfg config.Config) ([]byte, error) {
	var data []byte
	if v, ok := ann[initdata.Annotation]; ok {
		d, err := base64.StdEncoding.DecodeString(v)
		if err != nil {
			return nil, fmt.Errorf("annotation %s is not base64: %w", initdata.Annotation, err)
		}
		data = d
	} else if cfg.Attestation.InitData != "" {
		d, err := os.ReadFile(cfg.Attestation.InitData)
		if err != nil {
			return nil, fmt.Errorf("attestation.initdata: %w", err)
		}
		data = d
	}
	if _, err := initdata.Parse(data); err != nil {
		return nil, err
	}
	return data, nil
}

// configPath finds the c8s config: the runtime option ConfigPath (as
// containerd's CRI and `ctr --runtime-config-path` pass it), else
// $C8S_CONFIG_PATH, else the default path.
func configPath(r *taskAPI.CreateTaskRequest) (string, error) {
	if r.Options != nil && r.Options.GetValue() != nil {
		v, err := typeurl.UnmarshalAny(r.Options)
		if err != nil {
			return "", fmt.Errorf("decode runtime options (%s): %w: %w", r.Options.GetTypeUrl(), err, errdefs.ErrInvalidArgument)
		}
		if o, ok := v.(*runtimeoptions.Options); ok && o.ConfigPath != "" {
			return o.ConfigPath, nil
		}
	}
	if p := os.Getenv(ConfigPathEnv); p != "" {
		return p, nil
	}
	return DefaultConfigPath, nil
}

// loadConfig reads the config file. Only the default path may be absent,
// in which case the built-in defaults apply.
func loadConfig(path string) (config.Config, error) {
	cfg, err := config.Load(path)
	if err == nil {
		return *cfg, nil
	}
	if path == DefaultConfigPath && errors.Is(err, fs.ErrNotExist) {
		return config.Default(), nil
	}
	return config.Config{}, fmt.Errorf("load c8s configuration: %w: %w", err, errdefs.ErrInvalidArgument)
}

// BundleState is written into the bundle at Create.
type BundleState struct {
	Sandbox  string `json:"sandbox"`
	StateDir string `json:"state_dir"`
	Disk     string `json:"disk"`
	// LayerCache and LayerRef are the node's layer cache and the pod's
	// reference name in it, for a container run from its image's layers.
	LayerCache string `json:"layer_cache,omitempty"`
	LayerRef   string `json:"layer_ref,omitempty"`
	// NetNS is the pod's network namespace, which the VM's taps wire
	// (shim/podnet).
	NetNS string `json:"netns,omitempty"`
	// ShimPid and ShimStart name the shim that serves the pod (its pid
	// and start time, child.StartTime): `shim delete` leaves the pod to
	// it while it runs (ShimAlive).
	ShimPid   int    `json:"shim_pid,omitempty"`
	ShimStart uint64 `json:"shim_start,omitempty"`
}

// ShimAlive reports whether the shim that wrote st still runs. containerd
// runs `shim delete` in a task's bundle whenever it closes the task's
// connection, after a Delete the live shim answered too, not only after
// the shim died.
func (st BundleState) ShimAlive() bool {
	if st.ShimPid <= 0 || !child.Running(st.ShimPid) {
		return false
	}
	start, err := child.StartTime(st.ShimPid)
	return err == nil && start == st.ShimStart
}

// thisShim is this process, as BundleState names a shim.
var thisShim = sync.OnceValues(func() (int, uint64) {
	start, _ := child.StartTime(os.Getpid())
	return os.Getpid(), start
})

func writeBundleState(bundle string, st BundleState) error {
	st.ShimPid, st.ShimStart = thisShim()
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, bundleStateFile), data, 0o600)
}

// ReadBundleState reads what Create recorded in a bundle.
func ReadBundleState(bundle string) (BundleState, error) {
	var st BundleState
	data, err := os.ReadFile(filepath.Join(bundle, bundleStateFile))
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(data, &st)
}

// sharedFiles collects the small regular files the container bind-mounts
// from the host (such as CRI's /etc/hosts and /etc/resolv.conf), to pass
// them by value. Directories and large files are not shared.
func sharedFiles(ctx context.Context, spec *specs.Spec) []*agent.File {
	var files []*agent.File
	for _, m := range spec.Mounts {
		if m.Type != "bind" && !hasOption(m.Options, "bind") && !hasOption(m.Options, "rbind") {
			continue
		}
		fi, err := os.Stat(m.Source)
		if err != nil || !fi.Mode().IsRegular() || fi.Size() > maxSharedFile {
			continue
		}
		data, err := os.ReadFile(m.Source)
		if err != nil {
			log.G(ctx).WithError(err).WithField("source", m.Source).Warn("cannot share bind-mounted file with the guest")
			continue
		}
		files = append(files, &agent.File{Source: m.Source, Content: data, Mode: uint32(fi.Mode().Perm())})
	}
	return files
}

func hasOption(opts []string, o string) bool {
	for _, x := range opts {
		if x == o {
			return true
		}
	}
	return false
}

// fromAgent turns an error from the agent's ttrpc API back into an errdefs
// error, keeping its message.
func fromAgent(err error) error {
	return errgrpc.ToNative(err)
}

// refused reports whether err is the agent's refusal of a request, which
// it answers before doing anything or after undoing what it did: not a
// lost answer (a deadline, a cancellation, the connection gone) nor an
// unclassified failure.
func refused(err error) bool {
	e := fromAgent(err)
	for _, is := range []func(error) bool{errdefs.IsInvalidArgument, errdefs.IsPermissionDenied, errdefs.IsFailedPrecondition,
		errdefs.IsNotFound, errdefs.IsAlreadyExists, errdefs.IsNotImplemented, errdefs.IsOutOfRange, errdefs.IsResourceExhausted} {
		if is(e) {
			return true
		}
	}
	return false
}
