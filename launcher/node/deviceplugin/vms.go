package deviceplugin

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"

	"github.com/c8s-dev/c8s/launcher/config/statedir"
)

// maxStateDepth is how deep pod VM state directories lie under the state
// root (launcher/config/statedir lays it out).
const maxStateDepth = statedir.MaxDepth

// TEE kinds of a pod VM as ScanVMs tells them from QEMU's command line.
const (
	VMSNP = "snp"
	VMTDX = "tdx"
	VMSim = "sim" // any other c8s pod VM: it holds a sim slot
)

// VM is a pod VM state directory found under the state root.
type VM struct {
	// StateDir is the VM's state directory.
	StateDir string `json:"stateDir"`
	// PID is QEMU's pid from statedir.PidFile.
	PID int `json:"pid"`
	// Alive is true when a process with PID runs and its command line
	// names StateDir: the QEMU of this VM, not a recycled pid.
	Alive bool `json:"alive"`
	// TEE is VMSNP, VMTDX or VMSim, from the live QEMU's command line.
	TEE string `json:"tee,omitempty"`
	// Namespace and ID name the pod in full, from the state dir's index
	// (statedir.IndexFile), whose name may be shortened.
	Namespace string `json:"namespace,omitempty"`
	ID        string `json:"id,omitempty"`
}

// ScanVMs finds the pod VMs under stateRoot (runtime.state_dir): every
// state directory holding statedir.PidFile, whether its QEMU still runs (looked up
// in procRoot, normally /proc, which must show the host's processes) and
// which TEE it runs. A VM stays in the list until its state directory is
// gone, so a VM whose pod Kubernetes has forgotten but whose QEMU still
// runs (a leaked or slowly terminating VM) is found. A missing stateRoot
// means no VMs. The result is sorted by StateDir.
func ScanVMs(stateRoot, procRoot string) ([]VM, error) {
	var vms []VM
	err := filepath.WalkDir(stateRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if path == stateRoot && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			if path == stateRoot {
				return err
			}
			return nil // a directory removed or unreadable meanwhile
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(stateRoot, path)
		if depth := len(strings.Split(rel, string(filepath.Separator))); rel != "." && depth > maxStateDepth {
			return fs.SkipDir
		}
		pid, args, alive := statedir.QEMU(procRoot, path)
		if pid == 0 {
			return nil // no pid file (or no pid in it): not a VM's state dir
		}
		vm := VM{StateDir: path, PID: pid}
		if ix, err := statedir.ReadIndex(path); err == nil {
			vm.Namespace, vm.ID = ix.Namespace, ix.ID
		}
		if alive {
			vm.Alive, vm.TEE = true, teeOf(args)
		}
		vms = append(vms, vm)
		return fs.SkipDir
	})
	if err != nil {
		return nil, fmt.Errorf("deviceplugin: scanning pod VM state under %s: %w", stateRoot, err)
	}
	sort.Slice(vms, func(i, j int) bool { return vms[i].StateDir < vms[j].StateDir })
	return vms, nil
}

// teeOf tells a live pod VM's TEE from its QEMU's arguments.
func teeOf(args []string) string {
	tee := VMSim
	for _, s := range args {
		switch {
		case strings.Contains(s, "sev-snp-guest"):
			tee = VMSNP
		case strings.Contains(s, "tdx-guest"):
			tee = VMTDX
		}
	}
	return tee
}

// CountLive counts the live VMs per TEE.
func CountLive(vms []VM) map[string]int64 {
	n := map[string]int64{}
	for _, v := range vms {
		if v.Alive {
			n[v.TEE]++
		}
	}
	return n
}

// Usage is one resource's accounting.
type Usage struct {
	// Devices is how many devices the resource has.
	Devices int64 `json:"devices"`
	// HostUsed is the host-wide usage (misc.current: every VM's ASIDs or
	// keys, c8s's or not), -1 when unknown.
	HostUsed int64 `json:"hostUsed"`
	// LiveVMs are c8s pod VMs of this kind whose QEMU runs.
	LiveVMs int64 `json:"liveVMs"`
	// Counted is what the scheduler counts against the node for its pods
	// (RuntimeClass overhead and container requests of pods not yet
	// terminated).
	Counted int64 `json:"counted"`
	// Held are the devices the kubelet has allocated to containers.
	Held int64 `json:"held"`
	// Reserved is how many devices were marked unhealthy: units in use
	// that the scheduler does not count.
	Reserved int64 `json:"reserved"`
}

// InUse is the number of units taken on the node: the larger of the
// host-wide usage and the live pod VMs.
func (u Usage) InUse() int64 { return max(u.HostUsed, u.LiveVMs) }

// ReserveUncounted marks devices unhealthy for units that are in use but
// not counted by the scheduler, so the kubelet offers only what is really
// free: VMs outside Kubernetes, and pod VMs that outlive their pod
// (leaked, or still stopping after the pod object is gone). u says how
// many units are in use and counted; held devices (allocated to
// containers) are never marked, the others from the end of the list. It
// returns a new slice and u with Devices and Reserved filled in.
func ReserveUncounted(devs []Device, held map[string]Holder, u Usage) ([]Device, Usage) {
	out := make([]Device, len(devs))
	copy(out, devs)
	u.Devices = int64(len(devs))
	u.Held = int64(len(held))
	u.Reserved = 0
	uncounted := u.InUse() - u.Counted
	for i := len(out) - 1; i >= 0 && u.Reserved < uncounted; i-- {
		if _, isHeld := held[out[i].ID]; isHeld {
			continue
		}
		out[i].Healthy = false
		u.Reserved++
	}
	return out, u
}
