// Package manager is the shim's process side of containerd's shim v2
// protocol: `start` spawns (or reuses) the shim that serves a pod,
// `delete` cleans up after a shim that is gone, and `-info` describes the
// runtime, its OCI features included (features.go).
package manager

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/core/mount"
	// Registers the TypeUrl of features.Features that containerd decodes
	// RuntimeInfo.Features with.
	_ "github.com/containerd/containerd/v2/core/runtime"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/shim/podnet"
	"github.com/c8s-dev/c8s/shim/sharedfs"
	"github.com/c8s-dev/c8s/shim/task"
)

// RuntimeName is the containerd runtime type c8s registers.
const RuntimeName = "io.containerd.c8s.v2"

// Version is the c8s version reported to containerd.
var Version = "0.1.0-dev"

// groupAnnotations group containers into one shim, in order of precedence:
// c8s's own grouping label, then the Kubernetes pod.
var groupAnnotations = []string{"io.containerd.c8s.v2.group", task.SandboxIDAnnotation}

// New returns the shim manager for runtime type name.
func New(name string) shim.Manager { return manager{name: name} }

type manager struct{ name string }

func (m manager) Name() string { return m.name }

// Start returns the address of the shim serving the container's pod,
// spawning that shim when this is the pod's first container.
func (m manager) Start(ctx context.Context, id string, opts shim.StartOpts) (_ shim.BootstrapParams, retErr error) {
	params := shim.BootstrapParams{Version: 3, Protocol: "ttrpc"}
	group, err := groupOf(id, "config.json")
	if err != nil {
		return params, err
	}
	address, err := shim.SocketAddress(ctx, opts.Address, group, false)
	if err != nil {
		return params, err
	}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return params, fmt.Errorf("create shim socket: %w", err)
		}
		if shim.CanConnect(address) {
			// The pod's shim is running: it serves this container too.
			params.Address = address
			return params, nil
		}
		if err := shim.RemoveSocket(address); err != nil {
			return params, fmt.Errorf("remove stale shim socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return params, fmt.Errorf("create shim socket: %w", err)
		}
	}
	defer func() {
		if retErr != nil {
			socket.Close()
			_ = shim.RemoveSocket(address)
		}
	}()
	f, err := socket.File()
	if err != nil {
		return params, err
	}
	defer f.Close()

	cmd, err := serveCommand(ctx, id, opts)
	if err != nil {
		return params, err
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	if err := cmd.Start(); err != nil {
		return params, fmt.Errorf("start shim: %w", err)
	}
	go cmd.Wait()
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		cmd.Process.Kill()
		return params, fmt.Errorf("adjust the shim's OOM score: %w", err)
	}
	params.Address = address
	return params, nil
}

func serveCommand(ctx context.Context, id string, opts shim.StartOpts) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cwd, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-id", id, "-address", opts.Address}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = cwd
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// groupOf reads the bundle's spec and returns the shim group of the
// container: its pod, or the container itself.
func groupOf(id, specPath string) (string, error) {
	data, err := os.ReadFile(specPath)
	if err != nil {
		return "", fmt.Errorf("read the bundle's OCI spec: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(data, &spec); err != nil {
		return "", fmt.Errorf("parse the bundle's OCI spec: %w", err)
	}
	for _, a := range groupAnnotations {
		if g := spec.Annotations[a]; g != "" {
			return g, nil
		}
	}
	return id, nil
}

// Stop is `shim delete`: containerd runs it in the bundle whenever it
// closes a task's connection: after the shim died or failed to start, and
// after a Delete the live shim answered. It removes what the shim made for
// the container and, for a pod's own sandbox container whose shim is
// gone, stops a VM the dead shim left running.
func (m manager) Stop(ctx context.Context, id string) (shim.StopStatus, error) {
	cwd, err := os.Getwd()
	if err != nil {
		return shim.StopStatus{}, err
	}
	bundle := filepath.Join(filepath.Dir(cwd), id)
	if err := mount.UnmountRecursive(filepath.Join(bundle, "rootfs"), 0); err != nil {
		log.G(ctx).WithError(err).Warn("unmount container rootfs")
	}
	st, err := task.ReadBundleState(bundle)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		log.G(ctx).WithError(err).Warn("read c8s bundle state")
	case st.ShimAlive():
		// The pod's shim runs on (containerd closed this task's
		// connection after its Delete): the pod, its VM and the other
		// containers are its to tear down. Only this container's own
		// disk goes.
		log.G(ctx).WithField("shim_pid", st.ShimPid).Info("the pod's shim still runs: leaving the pod to it")
		removeDisk(ctx, st.Disk)
	default:
		if st.Sandbox == id && st.StateDir != "" {
			killVM(ctx, st.StateDir)
			if st.NetNS != "" {
				if err := podnet.Cleanup(st.NetNS); err != nil {
					log.G(ctx).WithError(err).Warn("remove the pod VM's taps from the pod's network namespace")
				}
			}
			if err := sharedfs.Cleanup(task.FSDir(st.StateDir)); err != nil {
				log.G(ctx).WithError(err).Warn("clean up the pod's virtio-fs share")
			}
			// The pod's references on the layers its VM had, and its
			// namespace's dir once empty.
			if st.LayerCache != "" && st.LayerRef != "" {
				if c, err := layercache.Open(st.LayerCache); err == nil {
					if err := c.ReleaseAll(ctx, st.LayerRef); err != nil {
						log.G(ctx).WithError(err).Warn("drop the pod's references on cached layers")
					}
				}
			}
			os.Remove(filepath.Dir(task.FSDir(st.StateDir)))
			os.Remove(filepath.Dir(st.StateDir))
		}
		removeDisk(ctx, st.Disk)
	}
	return shim.StopStatus{ExitedAt: time.Now(), ExitStatus: 128 + int(syscall.SIGKILL)}, nil
}

// removeDisk removes a container's copied root disk, and the pod's disk
// dir and the namespace dirs above it once empty (Remove fails on a dir
// still in use, which is right).
func removeDisk(ctx context.Context, disk string) {
	if disk == "" {
		return
	}
	if err := os.Remove(disk); err != nil && !errors.Is(err, fs.ErrNotExist) {
		log.G(ctx).WithError(err).Warn("remove container root disk")
	}
	dir := filepath.Dir(disk)
	for i := 0; i < 3 && os.Remove(dir) == nil; i++ {
		dir = filepath.Dir(dir)
	}
}

// killVM kills the QEMU whose pid file is in the VM's state dir and
// removes the dir.
func killVM(ctx context.Context, stateDir string) {
	// A pod that migrated runs on another node now: stop it there.
	if moved, err := migrate.StopHandedOff(ctx, stateDir); err != nil {
		log.G(ctx).WithError(err).Warn("stop the migrated VM of a shim that is gone")
	} else if moved {
		log.G(ctx).Warn("stopped the migrated VM of a shim that is gone")
	}
	// Only the process whose arguments name this state dir: the pid of
	// a QEMU that died may be another pod's QEMU by now.
	if pid, _, ok := statedir.QEMU("/proc", stateDir); ok {
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			log.G(ctx).WithField("pid", pid).Warn("killed the QEMU of a shim that is gone")
		}
	}
	if err := os.RemoveAll(stateDir); err != nil {
		log.G(ctx).WithError(err).Warn("remove pod VM state dir")
	}
}

// Info describes the runtime to containerd (`shim -info`): name, version
// and, as the runc shim reports `runc features`, the OCI features of the
// containers' runtime (Features). c8s takes no runtime options, so those
// on optionsR are read and ignored.
func (m manager) Info(ctx context.Context, optionsR io.Reader) (*types.RuntimeInfo, error) {
	if _, err := io.Copy(io.Discard, optionsR); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	feat, err := typeurl.MarshalAnyToProto(Features())
	if err != nil {
		return nil, fmt.Errorf("marshal the OCI runtime features: %w", err)
	}
	return &types.RuntimeInfo{
		Name:     m.name,
		Version:  &types.RuntimeVersion{Version: Version, Revision: revision()},
		Features: feat,
	}, nil
}

// revision is the VCS revision the binary was built from, when the build
// recorded it (`make build` builds with -buildvcs=false: then "").
func revision() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return ""
}
