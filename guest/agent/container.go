package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	"github.com/containerd/typeurl/v2"
	"google.golang.org/protobuf/types/known/anypb"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
	"github.com/c8s-dev/c8s/guest/cgroupstats"
	"github.com/c8s-dev/c8s/guest/ociruntime"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/spec"
)

// container is one container of the OCI runtime and its processes.
type container struct {
	id        string
	bundle    string
	rootfs    string
	sandboxID string
	cgroup    string

	mu    sync.Mutex
	init  *process // nil while being created
	execs map[string]*process
	// grant is what the pod's policy decided at create: the rule later
	// requests on the container are checked against (policy.go).
	grant *policy.Container
	// ns are its init's namespaces, held open from its create to its
	// removal for the containers that join them (sandboxns.go).
	ns nsFiles
	// layers are the image layers its root is stacked from, held from
	// its create to its removal (layers.go).
	layers []*layer
	// removing is set once RemoveContainer has it. The container keeps
	// its id (no new container takes it) until the runtime deleted it.
	removing bool

	// idMu and removed: see byID.
	idMu    sync.RWMutex
	removed bool
}

// byID runs f, which names the container by its id to the OCI runtime or
// the kernel (its runtime calls, its cgroup), unless RemoveContainer has
// it: once the runtime has deleted it, the id may name a new container,
// and a request the policy decided for this one must not reach that one.
// RemoveContainer waits for the calls of f already running (retire)
// before the runtime deletes the container.
func (c *container) byID(f func() error) error {
	c.idMu.RLock()
	defer c.idMu.RUnlock()
	if c.removed {
		return fmt.Errorf("container %q: %w", c.id, errRemoved)
	}
	return f()
}

// errRemoved is byID's refusal.
var errRemoved = fmt.Errorf("it is being removed: %w", errdefs.ErrNotFound)

// retire makes byID refuse, once the calls of it already running have
// returned.
func (c *container) retire() {
	c.idMu.Lock()
	c.removed = true
	c.idMu.Unlock()
}

// freeID frees c's id once what the runtime and the agent held of c is
// gone.
func (s *Service) freeID(c *container) {
	s.mu.Lock()
	if s.containers[c.id] == c {
		delete(s.containers, c.id)
	}
	s.mu.Unlock()
}

func (c *container) process(execID string) (*process, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if execID == "" {
		if c.init == nil {
			return nil, fmt.Errorf("container %q is still being created: %w", c.id, errdefs.ErrUnavailable)
		}
		return c.init, nil
	}
	p, ok := c.execs[execID]
	if !ok {
		return nil, fmt.Errorf("exec %q in container %q: %w", execID, c.id, errdefs.ErrNotFound)
	}
	if p == nil {
		return nil, fmt.Errorf("exec %q in container %q is still being started: %w", execID, c.id, errdefs.ErrUnavailable)
	}
	return p, nil
}

// validID rejects ids that could escape the state directory, be read as
// an option by the OCI runtime (a leading "-"), or write lines of the
// host's into the guest's log (control characters). Container ids are
// held to containerd's identifier rule (letters and digits, joined by
// single ".", "_" or "-", at most 76 characters), which containerd
// enforces on its side too.
func validID(kind, id string) error {
	bad := id == "" || id == "." || id == ".." || len(id) > 1024 || id[0] == '-' ||
		strings.ContainsFunc(id, func(r rune) bool { return r == '/' || r < 0x20 || r == 0x7f })
	if !bad && kind == "container id" {
		bad = len(id) > 76 || !containerdID.MatchString(id)
	}
	if bad {
		return fmt.Errorf("invalid %s %q: %w", kind, id, errdefs.ErrInvalidArgument)
	}
	return nil
}

// containerdID is containerd's identifier rule (pkg/identifiers).
var containerdID = regexp.MustCompile(`^[A-Za-z0-9]+(?:[._-][A-Za-z0-9]+)*$`)

// CreateContainer mounts the rootfs, writes the adapted bundle and runs
// the OCI runtime's create.
func (s *Service) CreateContainer(ctx context.Context, req *agentapi.CreateContainerRequest) (*agentapi.CreateContainerResponse, error) {
	id := req.GetContainerId()
	if err := validID("container id", id); err != nil {
		return nil, err
	}
	if req.GetRootfs() == nil {
		return nil, fmt.Errorf("container %q: no rootfs given: %w", id, errdefs.ErrInvalidArgument)
	}
	steps := newStepTimer()
	defer steps.log(ctx, id, "container create steps")
	if err := s.requirePolicy(ctx, fmt.Sprintf("container %q", id)); err != nil {
		return nil, err
	}
	steps.mark("require_policy")
	if !filepath.IsAbs(s.cfg.StateDir) {
		// Bundles below a relative path would land in the working
		// directory (a test's: the source tree).
		return nil, fmt.Errorf("container %q: the agent's state dir %q is not an absolute path: %w", id, s.cfg.StateDir, errdefs.ErrFailedPrecondition)
	}
	c := &container{
		id:        id,
		bundle:    filepath.Join(s.cfg.StateDir, id),
		sandboxID: req.GetSandboxId(),
		execs:     map[string]*process{},
	}
	c.rootfs = filepath.Join(c.bundle, "rootfs")

	s.mu.Lock()
	if _, ok := s.containers[id]; ok {
		s.mu.Unlock()
		return nil, fmt.Errorf("container %q: %w", id, errdefs.ErrAlreadyExists)
	}
	var joined *policy.Container // the sandbox, as the policy saw it
	var join *sandboxJoin        // its namespaces (sandboxns.go)
	if sb := c.sandboxID; sb != "" && sb != id {
		if sc, ok := s.containers[sb]; ok {
			sc.mu.Lock()
			var err error
			if sc.init != nil {
				join, err = joinFrom(sc, fmt.Sprintf("container %q", id))
				joined = sc.grant
			}
			sc.mu.Unlock()
			if err != nil {
				s.mu.Unlock()
				return nil, err
			}
		}
	}
	s.containers[id] = c
	s.mu.Unlock()

	p, err := s.create(ctx, c, req, join, joined, steps)
	join.release() // the runtime has joined them, or failed
	if err != nil {
		// The id stays taken until what the create left is gone.
		c.mu.Lock()
		c.removing = true
		c.mu.Unlock()
		c.retire()
		defer s.freeID(c)
		s.stopMesh(id)
		s.evaluator().ReleaseSandbox(c.policy())
		if cerr := s.cleanup(ctx, id, c.bundle); cerr != nil {
			log.G(ctx).WithError(cerr).Warnf("clean up after failed create of container %s", id)
		}
		s.releaseLayers(ctx, id, c.heldLayers())
		return nil, err
	}
	c.mu.Lock()
	c.init = p
	c.mu.Unlock()
	log.G(ctx).WithField("container", id).WithField("pid", p.pid).Info("container created")
	return &agentapi.CreateContainerResponse{Pid: uint32(p.pid)}, nil
}

func (s *Service) create(ctx context.Context, c *container, req *agentapi.CreateContainerRequest, join *sandboxJoin, joined *policy.Container, steps *stepTimer) (*process, error) {
	if _, err := os.Stat(c.bundle); err == nil {
		return nil, fmt.Errorf("bundle %s of container %q already exists (left over from an earlier container?): %w", c.bundle, c.id, errdefs.ErrAlreadyExists)
	}
	if err := os.MkdirAll(c.rootfs, 0o711); err != nil {
		return nil, err
	}
	root, _, err := rootOf(c.id, req.GetRootfs())
	if err != nil {
		return nil, err
	}
	steps.mark("bundle_dir")

	files := make([]spec.File, 0, len(req.GetFiles()))
	for _, f := range req.GetFiles() {
		files = append(files, spec.File{Source: f.GetSource(), Content: f.GetContent(), Mode: f.GetMode()})
	}
	shared, err := s.sharedMounts(req, c.bundle)
	if err != nil {
		return nil, err
	}
	if testHookSharesStaged != nil {
		testHookSharesStaged()
	}
	stdio := stdioOf(req.GetStdio())
	guest, err := s.guestResources(ctx)
	if err != nil {
		return nil, err
	}
	own := s.ownDirs()
	plan, err := spec.Adapt(req.GetSpec(), spec.Options{
		ContainerID:   c.id,
		Rootfs:        c.rootfs,
		CgroupsParent: s.cfg.CgroupsParent,
		FilesDir:      filepath.Join(c.bundle, "files"),
		Files:         files,
		SandboxNS:     join.namespaces(),
		Terminal:      stdio.Terminal,
		Exists:        func(p string) bool { return guestBindSourceExists(p, own) },
		Warn:          func(msg string) { log.G(ctx).WithField("container", c.id).Warn(msg) },
		OCIVersion:    s.cfg.Runtime.SpecVersion,
		Shared:        shared,
		Devices:       guest.devices,
		DriverMajors:  guest.driverMajors,
		OnlineCPUs:    guest.cpus,
		OnlineMems:    guest.mems,
		EmptyDirs:     s.emptyDirRoot(),
	})
	if forbidden := (*spec.ForbiddenError)(nil); errors.As(err, &forbidden) {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrPermissionDenied)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	steps.mark("adapt")
	// The pod's policy judges the spec the guest will run, before any of
	// it is carried out (policy.go).
	creq := &policy.CreateContainer{
		ID: c.id, Spec: plan.Spec, MountKinds: mountKinds(plan.Spec.Mounts, plan.Origins), Joined: joined,
		SecretPaths: s.secretPaths(), Root: root, Files: fileContents(plan.Files),
		Terminal: stdio.Terminal, MeshDir: meshapi.Dir, MeshInto: s.meshContainers(),
	}
	grant, err := s.evaluator().CreateContainer(creq)
	if err != nil {
		return nil, err
	}
	if err := s.checkNetwork(grant, req.GetNetwork()); err != nil {
		return nil, err
	}
	if s.evaluator().Governs() {
		flattenShared(plan.Spec.Mounts, plan.Origins)
	}
	c.mu.Lock()
	c.grant = grant
	c.mu.Unlock()
	steps.mark("policy")
	// A layered root marks its layers' steps (layers.go); "rootfs" is
	// the rest: the writable layer and the overlay, or a disk's mount.
	if err := s.mountRoot(withSteps(ctx, steps), c, req.GetRootfs(), plan.Spec); err != nil {
		return nil, fmt.Errorf("mount the rootfs of container %q: %w", c.id, err)
	}
	steps.mark("rootfs")
	// The destinations as the root resolves them, its image's symlinks
	// followed, as crun will mount them.
	if err := s.evaluator().ResolvedShares(grant, creq, func(p string) string { return resolveInRoot(c.rootfs, p) }); err != nil {
		return nil, err
	}
	if err := s.makeEmptyDirs(plan.EmptyDirs); err != nil {
		return nil, fmt.Errorf("container %q: the pod's emptyDir volumes: %w", c.id, err)
	}
	for _, f := range plan.Files {
		if err := os.MkdirAll(filepath.Dir(f.Path), 0o711); err != nil {
			return nil, err
		}
		if err := os.WriteFile(f.Path, f.Content, os.FileMode(f.Mode&0o7777)); err != nil {
			return nil, fmt.Errorf("write guest copy of a host file: %w", err)
		}
		// WriteFile's mode is filtered by the umask.
		if err := os.Chmod(f.Path, os.FileMode(f.Mode&0o7777)); err != nil {
			return nil, err
		}
	}
	plan.Spec.Mounts = append(plan.Spec.Mounts, s.secretMounts(grant)...)
	plan.Spec.Mounts = append(plan.Spec.Mounts, s.meshMounts(ctx, grant)...)
	c.mu.Lock()
	c.cgroup = plan.Spec.Linux.CgroupsPath
	c.mu.Unlock()
	config, err := json.Marshal(plan.Spec)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.bundle, "config.json"), config, 0o600); err != nil {
		return nil, err
	}
	steps.mark("bundle")
	user := plan.Spec.Process.User
	rp, err := s.cfg.Runtime.Create(ctx, c.id, c.bundle, stdio, int(user.UID), int(user.GID))
	if err != nil {
		return nil, s.layerFailure(ctx, c, err)
	}
	steps.mark("runtime_create")
	if err := s.configureNetwork(ctx, c.id, req.GetNetwork(), rp.Pid); err != nil {
		return nil, err
	}
	s.evaluator().PodWired(grant, plan.Spec.Hostname, podNetworkOf(req.GetNetwork()))
	if err := s.startMesh(ctx, c.id, req.GetNetwork(), rp.Pid); err != nil {
		return nil, err
	}
	// Its init waits to be started: its pid is still its own.
	ns, err := holdNamespaces("/proc", rp.Pid)
	if err != nil {
		return nil, fmt.Errorf("container %q: %w", c.id, err)
	}
	c.mu.Lock()
	c.ns = ns
	c.mu.Unlock()
	steps.mark("network")
	if c.sandboxID == "" || c.sandboxID == c.id {
		// The pod network is up: pull the images the policy names, in
		// its namespace (pull.go).
		go s.startPulls(ctx, c)
	}
	p := newProcess(c.id, "", rp, stdio, grant.OutputAllowed())
	go s.killLeftovers(c, p)
	if len(c.heldLayers()) > 0 {
		go s.watchLayers(c, p)
	}
	return p, nil
}

// leftoverKillTimeout bounds the fallback of killCgroup where the kernel
// has no cgroup.kill.
const leftoverKillTimeout = 2 * time.Second

// killLeftovers kills what is left of a container once its init process
// has exited, as runc's shim does: children that inherited its stdout
// (`sh -c 'sleep 1000 & sleep 1000'`) would otherwise keep the output
// streams open, and containerd waits for them to close before it finishes
// handling the exit. A container in its own PID namespace loses them to the
// kernel anyway; one in the pod's (or the VM's) namespace does not.
func (s *Service) killLeftovers(c *container, init *process) {
	<-init.done
	// A container removed meanwhile was killed whole by the runtime's
	// delete; its cgroup path may already name a new container of the same
	// id, which must not be touched.
	s.mu.Lock()
	current := s.containers[c.id] == c
	s.mu.Unlock()
	if !current {
		return
	}
	if err := c.byID(func() error { return killCgroup(c.cgroupPath(), leftoverKillTimeout) }); err != nil && !errors.Is(err, errRemoved) {
		log.L.WithError(err).WithField("container", c.id).Warn("kill the processes left after the container's init exited")
	}
}

func stdioOf(s *agentapi.Stdio) ociruntime.Stdio {
	return ociruntime.Stdio{
		Terminal: s.GetTerminal(),
		Stdin:    s.GetStdin(),
		Stdout:   s.GetStdout(),
		Stderr:   s.GetStderr(),
	}
}

// StartContainer starts the init process.
func (s *Service) StartContainer(ctx context.Context, req *agentapi.StartContainerRequest) (*agentapi.StartContainerResponse, error) {
	c, p, err := s.process(req.GetContainerId(), "")
	if err != nil {
		return nil, err
	}
	if p.exited() {
		return nil, fmt.Errorf("container %q has already exited: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if err := s.layersCorrupted(ctx, c.heldLayers()); err != nil {
		return nil, fmt.Errorf("container %q not started: %w", c.id, err)
	}
	var exe string // the OCI runtime's, until the process execs its program
	if len(c.heldLayers()) > 0 {
		exe = exeOf(p.pid)
	}
	steps := newStepTimer()
	defer steps.log(ctx, c.id, "container start steps")
	if err := c.byID(func() error { return s.cfg.Runtime.Start(ctx, c.id, c.bundle) }); err != nil {
		return nil, s.layerFailure(ctx, c, err)
	}
	steps.mark("runtime_start")
	if err := s.awaitLayeredStart(ctx, c, p, exe); err != nil {
		return nil, err
	}
	steps.mark("exec_checked")
	return &agentapi.StartContainerResponse{Pid: uint32(p.pid)}, nil
}

// RemoveContainer force-deletes the container and everything the agent
// holds for it. Removing an unknown container cleans up leftovers and
// succeeds.
func (s *Service) RemoveContainer(ctx context.Context, req *agentapi.RemoveContainerRequest) (*agentapi.Empty, error) {
	id := req.GetContainerId()
	if err := validID("container id", id); err != nil {
		return nil, err
	}
	s.mu.Lock()
	c, ok := s.containers[id]
	creating, removing := false, false
	if ok {
		c.mu.Lock()
		creating, removing = c.init == nil && !c.removing, c.removing
		c.removing = !creating
		c.mu.Unlock()
	} else {
		// Only leftovers to clean up (the runtime's state, a bundle): a
		// create of the id meanwhile would have them cleaned up under it.
		c = &container{id: id, execs: map[string]*process{}, removing: true}
		s.containers[id] = c
	}
	s.mu.Unlock()
	switch {
	case creating:
		return nil, fmt.Errorf("container %q is still being created: %w", id, errdefs.ErrUnavailable)
	case removing:
		return nil, fmt.Errorf("container %q is being removed: %w", id, errdefs.ErrUnavailable)
	}
	// The id stays taken until the runtime has deleted the container,
	// and what names it by its id has returned (byID).
	defer s.freeID(c)
	if ok {
		c.retire()
		c.mu.Lock()
		procs := []*process{c.init}
		for _, p := range c.execs {
			if p != nil { // nil: an exec still being started
				procs = append(procs, p)
			}
		}
		c.execs = map[string]*process{}
		c.ns.close()
		c.ns = nil
		c.mu.Unlock()
		defer func() {
			for _, p := range procs {
				p.release()
			}
		}()
	}
	s.stopMesh(id)
	err := s.cleanup(ctx, id, filepath.Join(s.cfg.StateDir, id))
	if ok {
		// Even if the bundle could not be cleaned: a layer still busy
		// stays mounted, unused, and is taken again as it is.
		s.releaseLayers(ctx, id, c.heldLayers())
	}
	if err != nil {
		return nil, err
	}
	log.G(ctx).WithField("container", id).Info("container removed")
	return &agentapi.Empty{}, nil
}

// cleanup deletes the OCI runtime's container, unmounts what the bundle
// holds (the rootfs; with confidential writes the disk, the writable
// layer's tmpfs and the overlay; the staged shares) and removes the
// bundle; each step tolerates what is already gone.
func (s *Service) cleanup(ctx context.Context, id, bundle string) error {
	if s.cfg.Runtime.Exists(ctx, id) {
		if err := s.cfg.Runtime.Delete(ctx, id, bundle); err != nil {
			return err
		}
	}
	// Never RemoveAll through a mount: that would delete the disk's or a
	// host share's content. unmountAll fails if anything stays mounted.
	if err := unmountAll(bundle); err != nil {
		return fmt.Errorf("container %q: %w", id, err)
	}
	if err := os.RemoveAll(bundle); err != nil {
		return fmt.Errorf("remove bundle of container %q: %w", id, err)
	}
	return nil
}

// ListPids lists the container's processes (guest pids), when policy.stats
// allows.
func (s *Service) ListPids(ctx context.Context, req *agentapi.ListPidsRequest) (*agentapi.ListPidsResponse, error) {
	c, err := s.lookup(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if err := s.evaluator().ListPids(c.policy()); err != nil {
		return nil, err
	}
	// The container's cgroup lists its processes whatever state it is in;
	// `crun ps` crashes on a container that was created but not started.
	var pids []int
	if err := c.byID(func() (err error) {
		pids, err = cgroupPids(c.cgroupPath())
		return err
	}); err != nil {
		return nil, err
	}
	execByPid := map[int]string{}
	c.mu.Lock()
	for id, p := range c.execs {
		if p != nil {
			execByPid[p.pid] = id
		}
	}
	c.mu.Unlock()
	resp := &agentapi.ListPidsResponse{}
	for _, pid := range pids {
		resp.Processes = append(resp.Processes, &agentapi.ProcessInfo{Pid: uint32(pid), ExecId: execByPid[pid]})
	}
	return resp, nil
}

// Stats returns the cgroup metrics of the container: containerd's cgroup v2
// Metrics, read from the container's own cgroup only.
func (s *Service) Stats(ctx context.Context, req *agentapi.StatsRequest) (*agentapi.StatsResponse, error) {
	c, err := s.lookup(req.GetContainerId())
	if err != nil {
		return nil, err
	}
	if err := s.evaluator().Stats(c.policy()); err != nil {
		return nil, err
	}
	dir, err := statsDir(c)
	if err != nil {
		return nil, err
	}
	var metrics *stats.Metrics
	err = c.byID(func() (err error) {
		metrics, err = cgroupstats.Read(dir)
		return err
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("stats of container %q: its cgroup %s is gone (the container was deleted meanwhile): %w", c.id, dir, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("stats of container %q: %w", c.id, err)
	}
	a, err := typeurl.MarshalAny(metrics)
	if err != nil {
		return nil, err
	}
	return &agentapi.StatsResponse{Stats: &anypb.Any{TypeUrl: a.GetTypeUrl(), Value: a.GetValue()}}, nil
}

// statsDir returns the directory of c's cgroup for Stats. Until create has
// set the container's cgroup there is none to read: an empty path would
// name the VM's root cgroup, every container's and the agent's figures.
// The guest mounts a unified hierarchy only; on a v1 one (a test host)
// there are no cgroup v2 files to read.
func statsDir(c *container) (string, error) {
	cg := c.cgroupPath()
	dir := filepath.Join(cgroupRoot, filepath.Clean("/"+cg))
	if cg == "" || dir == filepath.Clean(cgroupRoot) {
		return "", fmt.Errorf("stats of container %q: it is still being created and has no cgroup yet; ask again once it is created: %w", c.id, errdefs.ErrUnavailable)
	}
	unified, err := cgroupstats.Unified(cgroupRoot)
	if err != nil {
		return "", fmt.Errorf("stats of container %q: %w", c.id, err)
	}
	if !unified {
		return "", fmt.Errorf("stats of container %q: %s is not a cgroup v2 (unified) hierarchy: the agent reads cgroup v2 only, which the guest mounts: %w", c.id, cgroupRoot, errdefs.ErrFailedPrecondition)
	}
	return dir, nil
}

// cgroupPath returns the container's cgroup path, "" until create has set
// it.
func (c *container) cgroupPath() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cgroup
}
