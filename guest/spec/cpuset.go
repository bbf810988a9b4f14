package spec

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Cpusets. The host writes linux.resources.cpu.cpus and mems (the kubelet's
// CPU manager, NRI plugins) in its own numbering, but the container runs on
// the pod VM's vCPUs, numbered from 0. A set the guest has is kept; a set
// naming CPUs or memory nodes the guest does not have is refused with what
// was asked, what the VM has and what to do, rather than mapped: which
// vCPU would stand for host CPU 5 is a guess, and a container silently
// spread over other CPUs than asked for is worse than a clear failure.
// Cpusets cannot reach anything the pod keeps from the host; this is
// about clear errors, not security.

// Online CPUs and memory nodes of the guest, where the agent reads them.
const (
	OnlineCPUsFile = "devices/system/cpu/online"  // under /sys
	OnlineMemsFile = "devices/system/node/online" // under /sys
)

// ReadOnline reads the online CPUs and memory nodes from sysDir (the
// guest's /sys). A kernel without NUMA has no node list: its memory is
// node 0.
func ReadOnline(sysDir string) (cpus, mems string, err error) {
	b, err := os.ReadFile(sysDir + "/" + OnlineCPUsFile)
	if err != nil {
		return "", "", fmt.Errorf("read the guest's online CPUs: %w", err)
	}
	cpus = strings.TrimSpace(string(b))
	mems = "0"
	if b, err := os.ReadFile(sysDir + "/" + OnlineMemsFile); err == nil {
		mems = strings.TrimSpace(string(b))
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("read the guest's online memory nodes: %w", err)
	}
	return cpus, mems, nil
}

// maxListMember bounds a cpuset list's members: Linux's NR_CPUS is at most
// 8192, and memory nodes are far fewer.
const maxListMember = 8191

// ParseList parses a cpuset list such as "0-3,6" (empty: none) into its
// sorted members. Members above maxListMember are refused, so a hostile
// list costs the agent (PID 1) at most a small bitmap, whatever its ranges.
func ParseList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	if len(s) > 4096 {
		return nil, errors.New("the list is too long")
	}
	var set [maxListMember/64 + 1]uint64
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		b := a
		if err == nil && isRange {
			b, err = strconv.ParseUint(hi, 10, 16)
		}
		if err != nil || b < a {
			return nil, fmt.Errorf("%q is not a number or a range", part)
		}
		if b > maxListMember {
			return nil, fmt.Errorf("%q names CPU or node %d, beyond any Linux system's %d", part, b, maxListMember)
		}
		for i := a; i <= b; i++ {
			set[i/64] |= 1 << (i % 64)
		}
	}
	var out []int
	for i := range maxListMember + 1 {
		if set[i/64]&(1<<(i%64)) != 0 {
			out = append(out, i)
		}
	}
	return out, nil
}

// CheckCPUSet checks that a cpuset (cpus, mems) asks only for CPUs and
// memory nodes the guest has online (onlineCPUs, onlineMems; an empty
// online list is not checked). The error names what was asked, what the
// pod VM has and what to do.
func CheckCPUSet(cpus, mems, onlineCPUs, onlineMems string) error {
	for _, c := range []struct{ field, asked, online, what, unit, fix string }{
		{"cpus", cpus, onlineCPUs, "CPUs", "vCPU", "give the pod VM more vCPUs (hypervisor.default_vcpus, or the pod annotation io.katacontainers.config.hypervisor.default_vcpus where enable_annotations allows it) or ask for CPUs it has (the pod VM numbers its vCPUs from 0, whatever the node's numbers)"},
		{"mems", mems, onlineMems, "memory nodes", "memory node", "ask for memory nodes it has"},
	} {
		if c.asked == "" || c.online == "" {
			continue
		}
		asked, err := ParseList(c.asked)
		if err != nil {
			return fmt.Errorf("linux.resources.cpu.%s %q: %w", c.field, c.asked, err)
		}
		have, err := ParseList(c.online)
		if err != nil {
			return fmt.Errorf("the guest's online %s %q: %w", c.what, c.online, err)
		}
		var missing []int
		for _, n := range asked {
			if !slices.Contains(have, n) {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 {
			continue
		}
		unit := c.unit
		if len(have) != 1 {
			unit += "s"
		}
		return fmt.Errorf("the container's cpuset asks for %s %s (linux.resources.cpu.%s, set by the kubelet's CPU manager or an NRI plugin), but the pod VM has only %s %s (%d %s): %s %s do not exist there; %s",
			c.what, c.asked, c.field, c.what, c.online, len(have), unit, c.what, formatList(missing), c.fix)
	}
	return nil
}

// formatList writes sorted numbers as a cpuset list.
func formatList(ns []int) string {
	var parts []string
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, strconv.Itoa(ns[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ns[i], ns[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// checkResourcesCPUSet checks the cpuset of a spec's resources.
func checkResourcesCPUSet(r *specs.LinuxResources, o Options) error {
	if r == nil || r.CPU == nil {
		return nil
	}
	return CheckCPUSet(r.CPU.Cpus, r.CPU.Mems, o.OnlineCPUs, o.OnlineMems)
}
