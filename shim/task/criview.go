package task

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// What containerd's CRI sees of a pod from the host: the pids it reports
// and the hostname of a host-network pod.

// ContainerTypeAnnotation is set by containerd's CRI on each container it
// creates: "sandbox" for the pod's sandbox (pause) container, "container"
// for the others.
const ContainerTypeAnnotation = "io.kubernetes.cri.container-type"

// criHostPid is the pid reported for every process of a container with
// spec, given QEMU's pid: QEMU's for a container CRI made, 0 (report guest
// pids) for any other.
//
// A process in the pod VM has no host pid. CRI publishes a task's pid as
// the pod's and the containers' pid (PodSandboxStatus and ContainerStatus
// info "pid", NRI), and whoever reads it does so in the node's pid
// namespace: a node agent opens /proc/<pid>, an admin kills it. A guest pid
// there names an unrelated host process, if any. QEMU's pid, as Kata
// reports its hypervisor's for every container, is a live host process
// that stands for the whole pod: /proc/<pid> is the pod VM, and killing it
// ends the pod (every container exits with 137). containerd itself only
// reports the pids and writes /proc/<pid>/ns/... paths from them into the
// pod's specs, which the guest replaces with its sandbox container's
// namespaces. Execs of such a container report it too; Pids (`ctr task
// ps`, `crictl` stats) still lists the guest's pids.
//
// Containers outside CRI (ctr, containerd's Go client) keep their guest
// pids: there a task's pid is also what Pids lists, as containerd's
// clients expect.
//
// The pid is QEMU's when the container is created: after a live migration
// it names the source node's QEMU, which has exited.
func criHostPid(spec *specs.Spec, qemuPid int) uint32 {
	if spec.Annotations[ContainerTypeAnnotation] == "" || qemuPid <= 0 {
		return 0
	}
	return uint32(qemuPid)
}

// withNodeUTS is nodeUTS for container id of pod, named as this node.
func (s *service) withNodeUTS(id string, pod *podState, raw []byte, spec *specs.Spec) ([]byte, error) {
	join := ""
	if id != pod.id {
		s.mu.Lock()
		sc := s.conts[pod.id]
		s.mu.Unlock()
		if sc != nil {
			_, pid, _, _ := sc.init.state()
			join = fmt.Sprintf("/proc/%d/ns/uts", pid)
		}
	}
	return nodeUTS(id, raw, spec, join, os.Hostname)
}

// nodeUTS adapts the spec (raw, parsed as spec) of a container that shares
// the node's UTS namespace, which CRI asks for in host-network pods: the
// spec lists no "uts" namespace. With runc such a container sees the
// node's hostname. The node's UTS namespace is out of the VM's reach, and
// sharing the guest's would show the guest's own name, so the pod gets a
// UTS namespace named as the node: a new one with the node's hostname, or,
// when join is set (the /proc/<pid>/ns/uts path of the pod's sandbox
// container, as containerd writes for the pod's other namespaces), the
// sandbox container's, which the guest joins. $HOSTNAME and /etc/hostname
// already carry the node's name: CRI writes them so.
//
// A hostname or domain name in such a spec is refused, as runc refuses it
// ("unable to set hostname without a private UTS namespace"), so that a
// host-network pod with a hostname fails at RunPodSandbox as it does with
// runc.
//
// The node's name is host data that nothing measures: in snp and tdx pods
// the host picks the name the containers see, as it picks any pod's
// hostname. It is only a name.
func nodeUTS(id string, raw []byte, spec *specs.Spec, join string, nodeName func() (string, error)) ([]byte, error) {
	if spec.Linux == nil || slices.ContainsFunc(spec.Linux.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.UTSNamespace }) {
		return raw, nil
	}
	for _, f := range []struct{ what, value string }{{"hostname", spec.Hostname}, {"domainname", spec.Domainname}} {
		if f.value != "" {
			return nil, fmt.Errorf("container %q shares the node's UTS namespace (a host-network pod) and asks for %s %q: unable to set %s without a private UTS namespace, as runc refuses too; leave the hostname of a hostNetwork pod empty (the kubelet does): the pod gets the node's: %w",
				id, f.what, f.value, f.what, errdefs.ErrInvalidArgument)
		}
	}
	ns := specs.LinuxNamespace{Type: specs.UTSNamespace, Path: join}
	name := ""
	if join == "" {
		n, err := nodeName()
		if err != nil {
			return nil, fmt.Errorf("read the node's hostname for container %q, which shares the node's UTS namespace: %w", id, err)
		}
		name = n
	}
	// Edit the document as JSON, so that fields this shim's runtime-spec
	// does not know reach the guest as they are.
	var doc, linux map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return nil, fmt.Errorf("parse the OCI spec of container %q: %w: %w", id, err, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(doc["linux"], &linux); err != nil {
		return nil, fmt.Errorf("parse linux in the OCI spec of container %q: %w: %w", id, err, errdefs.ErrInvalidArgument)
	}
	var nss []json.RawMessage
	if v, ok := linux["namespaces"]; ok && string(v) != "null" {
		if err := json.Unmarshal(v, &nss); err != nil {
			return nil, fmt.Errorf("parse linux.namespaces in the OCI spec of container %q: %w: %w", id, err, errdefs.ErrInvalidArgument)
		}
	}
	entry, err := json.Marshal(ns)
	if err != nil {
		return nil, err
	}
	if linux["namespaces"], err = json.Marshal(append(nss, entry)); err != nil {
		return nil, err
	}
	if doc["linux"], err = json.Marshal(linux); err != nil {
		return nil, err
	}
	if name != "" {
		if doc["hostname"], err = json.Marshal(name); err != nil {
			return nil, err
		}
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	spec.Linux.Namespaces = append(spec.Linux.Namespaces, ns)
	spec.Hostname = name
	return out, nil
}
