package agent

import (
	"fmt"
	"os"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/spec"
	"golang.org/x/sys/unix"
)

// A pod's containers join the namespaces of its sandbox container (network,
// IPC, UTS, and PID where the spec shares it). A pid names a process only
// until it is reaped: once the sandbox's init has exited, its pid can be
// given to any process of the VM, in the VM's own namespaces or another
// pod container's, and a container joining "/proc/<pid>/ns/net" would join
// those. So the agent opens each container's namespaces right after the
// runtime created it, while its init waits to be started (it cannot have
// exited and been reaped yet), keeps them open until the container is
// removed, and a container joins the sandbox's through those open files
// (/proc/<agent>/fd/N). A container that names an exited sandbox is
// refused (FailedPrecondition).

// heldNamespaces are the namespaces of a container that others may join
// (spec's sandboxShared).
var heldNamespaces = []specs.LinuxNamespaceType{
	specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.PIDNamespace,
}

// nsFiles are a container's open namespace files.
type nsFiles map[specs.LinuxNamespaceType]*os.File

func (n nsFiles) close() {
	for _, f := range n {
		f.Close()
	}
}

// holdNamespaces opens the namespaces of process pid, the init of a
// container the runtime has just created.
func holdNamespaces(procDir string, pid int) (nsFiles, error) {
	if procDir == "" {
		procDir = "/proc"
	}
	n := nsFiles{}
	for _, t := range heldNamespaces {
		f, err := os.Open(fmt.Sprintf("%s/%d/ns/%s", procDir, pid, spec.NSFile(t)))
		if err != nil {
			n.close()
			return nil, fmt.Errorf("open the %s namespace of the container's init (pid %d): %w", t, pid, err)
		}
		n[t] = f
	}
	return n, nil
}

// sandboxJoin is what a container being created joins of its sandbox.
type sandboxJoin struct {
	// paths are the sandbox's namespaces as the runtime opens them:
	// /proc/<agent>/fd/N of files owned by the join.
	paths map[specs.LinuxNamespaceType]string
	files []*os.File
}

// release closes the join's files, once the runtime has joined them.
func (j *sandboxJoin) release() {
	if j == nil {
		return
	}
	for _, f := range j.files {
		f.Close()
	}
}

// joinFrom returns the namespaces of sandbox sc for who (`container "x"`)
// to join:
// copies of sc's open files, so that removing the sandbox meanwhile cannot
// close them under the runtime (and their numbers name other files). The
// caller holds sc.mu. A sandbox whose init has exited is refused.
func joinFrom(sc *container, who string) (*sandboxJoin, error) {
	if sc.removing {
		return nil, fmt.Errorf("%s would join the namespaces of sandbox %q, which is being removed: %w", who, sc.id, errdefs.ErrFailedPrecondition)
	}
	if sc.init.exited() {
		return nil, fmt.Errorf("%s would join the namespaces of sandbox %q, whose init has exited (its pid may name another process of the VM now): %w", who, sc.id, errdefs.ErrFailedPrecondition)
	}
	if sc.ns == nil {
		return nil, fmt.Errorf("%s would join the namespaces of sandbox %q, which the agent does not hold: %w", who, sc.id, errdefs.ErrFailedPrecondition)
	}
	j := &sandboxJoin{paths: map[specs.LinuxNamespaceType]string{}}
	for t, f := range sc.ns {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			j.release()
			return nil, fmt.Errorf("%s: copy the %s namespace of sandbox %q: %w", who, t, sc.id, err)
		}
		j.files = append(j.files, os.NewFile(uintptr(fd), f.Name()))
		j.paths[t] = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd)
	}
	return j, nil
}

// namespaces returns the paths to join, nil without a sandbox.
func (j *sandboxJoin) namespaces() map[specs.LinuxNamespaceType]string {
	if j == nil {
		return nil
	}
	return j.paths
}
