// Package cgroupstats reads a cgroup v2 group's interface files into
// containerd's cgroup v2 Metrics, the type containerd's task Metrics API
// and the CRI's container stats carry.
//
// The guest mounts cgroup2 only, so the agent needs no cgroup v1 reader and
// no cgroup manager: a container's statistics are a handful of text files.
// containerd's cgroup managers would link an eBPF loader, ELF and DWARF
// parsers, the Go parser and a D-Bus client into the guest's trusted agent,
// and run their package initialisation at every pod boot. The fields and
// their sources are those of containerd's cgroup2.Manager.Stat, so a
// consumer of its Metrics reads the same numbers.
package cgroupstats

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"golang.org/x/sys/unix"
)

// ErrNotUnified is returned by Read for a directory on another file
// system than cgroup2: a cgroup v1 hierarchy, or not a cgroup at all.
var ErrNotUnified = errors.New("not a cgroup v2 (unified) group")

// Unified reports whether dir is on a cgroup2 file system.
func Unified(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Type == unix.CGROUP2_SUPER_MAGIC, nil
}

// Read returns the statistics of the cgroup v2 group at dir. An interface
// file the kernel does not have (a controller not enabled, an older
// kernel) leaves its fields zero, as containerd does. A file that exists
// but does not parse is an error naming it.
func Read(dir string) (*stats.Metrics, error) {
	ok, err := Unified(dir)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("%s: %w", dir, ErrNotUnified)
	}
	return readFiles(dir)
}

// readFiles reads the interface files below dir, whatever file system
// holds them (the tests' fixtures).
func readFiles(dir string) (*stats.Metrics, error) {
	r := reader{dir: dir}
	m := &stats.Metrics{
		Pids: &stats.PidsStat{Current: r.single("pids.current"), Limit: r.single("pids.max")},
	}
	cpu := r.keyed("cpu.stat")
	m.CPU = &stats.CPUStat{
		UsageUsec:     cpu["usage_usec"],
		UserUsec:      cpu["user_usec"],
		SystemUsec:    cpu["system_usec"],
		NrPeriods:     cpu["nr_periods"],
		NrThrottled:   cpu["nr_throttled"],
		ThrottledUsec: cpu["throttled_usec"],
		NrBursts:      cpu["nr_bursts"],
		BurstUsec:     cpu["burst_usec"],
		PSI:           r.pressure("cpu.pressure"),
	}
	mem := r.keyed("memory.stat")
	m.Memory = &stats.MemoryStat{
		Anon:                  mem["anon"],
		File:                  mem["file"],
		KernelStack:           mem["kernel_stack"],
		Slab:                  mem["slab"],
		Sock:                  mem["sock"],
		Shmem:                 mem["shmem"],
		FileMapped:            mem["file_mapped"],
		FileDirty:             mem["file_dirty"],
		FileWriteback:         mem["file_writeback"],
		AnonThp:               mem["anon_thp"],
		InactiveAnon:          mem["inactive_anon"],
		ActiveAnon:            mem["active_anon"],
		InactiveFile:          mem["inactive_file"],
		ActiveFile:            mem["active_file"],
		Unevictable:           mem["unevictable"],
		SlabReclaimable:       mem["slab_reclaimable"],
		SlabUnreclaimable:     mem["slab_unreclaimable"],
		Pgfault:               mem["pgfault"],
		Pgmajfault:            mem["pgmajfault"],
		WorkingsetRefault:     mem["workingset_refault"],
		WorkingsetActivate:    mem["workingset_activate"],
		WorkingsetNodereclaim: mem["workingset_nodereclaim"],
		Pgrefill:              mem["pgrefill"],
		Pgscan:                mem["pgscan"],
		Pgsteal:               mem["pgsteal"],
		Pgactivate:            mem["pgactivate"],
		Pgdeactivate:          mem["pgdeactivate"],
		Pglazyfree:            mem["pglazyfree"],
		Pglazyfreed:           mem["pglazyfreed"],
		ThpFaultAlloc:         mem["thp_fault_alloc"],
		ThpCollapseAlloc:      mem["thp_collapse_alloc"],
		Usage:                 r.single("memory.current"),
		UsageLimit:            r.single("memory.max"),
		MaxUsage:              r.single("memory.peak"),
		SwapUsage:             r.single("memory.swap.current"),
		SwapLimit:             r.single("memory.swap.max"),
		SwapMaxUsage:          r.single("memory.swap.peak"),
		PSI:                   r.pressure("memory.pressure"),
	}
	if ev, found := r.keyedFound("memory.events"); found && len(ev) > 0 {
		m.MemoryEvents = &stats.MemoryEvents{Low: ev["low"], High: ev["high"], Max: ev["max"], Oom: ev["oom"], OomKill: ev["oom_kill"]}
	}
	m.Io = &stats.IOStat{Usage: r.io(), PSI: r.pressure("io.pressure")}
	m.Rdma = &stats.RdmaStat{Current: r.rdma("rdma.current"), Limit: r.rdma("rdma.max")}
	m.Hugetlb = r.hugetlb()
	if r.err != nil {
		return nil, r.err
	}
	return m, nil
}

// reader reads one group's files, keeping the first parse error.
type reader struct {
	dir string
	err error
}

// file returns a file's content; false when it does not exist. Other read
// errors are kept.
func (r *reader) file(name string) ([]byte, bool) {
	b, err := os.ReadFile(filepath.Join(r.dir, name))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EOPNOTSUPP) {
			r.fail(name, err)
		}
		return nil, false
	}
	return b, true
}

func (r *reader) fail(name string, err error) {
	if r.err == nil {
		r.err = fmt.Errorf("cgroup file %s: %w (a kernel format this reader does not know: report it with the guest kernel's version)", filepath.Join(r.dir, name), err)
	}
}

// value parses one number; "max" (no limit) is the largest uint64.
func value(s string) (uint64, error) {
	if s == "max" {
		return math.MaxUint64, nil
	}
	return strconv.ParseUint(s, 10, 64)
}

// lines returns the fields of each non-empty line of a file; false when it
// does not exist.
func (r *reader) lines(name string) ([][]string, bool) {
	b, ok := r.file(name)
	if !ok {
		return nil, false
	}
	var out [][]string
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			out = append(out, f)
		}
	}
	return out, true
}

// single reads a file holding one number or "max"; 0 when absent.
func (r *reader) single(name string) uint64 {
	b, ok := r.file(name)
	if !ok {
		return 0
	}
	v, err := value(string(bytes.TrimSpace(b)))
	if err != nil {
		r.fail(name, err)
	}
	return v
}

// keyed reads a flat keyed file ("key value" per line).
func (r *reader) keyed(name string) map[string]uint64 {
	m, _ := r.keyedFound(name)
	return m
}

func (r *reader) keyedFound(name string) (map[string]uint64, bool) {
	m := map[string]uint64{}
	lines, ok := r.lines(name)
	for _, f := range lines {
		if len(f) != 2 {
			r.fail(name, fmt.Errorf("line %q is not \"key value\"", strings.Join(f, " ")))
			continue
		}
		v, err := value(f[1])
		if err != nil {
			r.fail(name, fmt.Errorf("key %s: %w", f[0], err))
			continue
		}
		m[f[0]] = v
	}
	return m, ok
}

// pressure reads a PSI file ("some|full avg10=… avg60=… avg300=… total=…");
// nil when the kernel has no PSI.
func (r *reader) pressure(name string) *stats.PSIStats {
	lines, ok := r.lines(name)
	if !ok {
		return nil
	}
	psi := &stats.PSIStats{}
	for _, f := range lines {
		d := &stats.PSIData{}
		switch f[0] {
		case "some":
			psi.Some = d
		case "full":
			psi.Full = d
		default:
			continue
		}
		for _, kv := range f[1:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				r.fail(name, fmt.Errorf("field %q is not key=value", kv))
				return nil
			}
			var err error
			switch k {
			case "avg10":
				d.Avg10, err = strconv.ParseFloat(v, 64)
			case "avg60":
				d.Avg60, err = strconv.ParseFloat(v, 64)
			case "avg300":
				d.Avg300, err = strconv.ParseFloat(v, 64)
			case "total":
				d.Total, err = strconv.ParseUint(v, 10, 64)
			}
			if err != nil {
				r.fail(name, fmt.Errorf("field %q: %w", kv, err))
				return nil
			}
		}
	}
	return psi
}

// io reads io.stat: one line per device, "MAJ:MIN key=value …". Only the
// keys the Metrics have fields for are parsed; others (dbytes, dios, and
// the debug keys some kernels add, signed or not) are left alone.
func (r *reader) io() []*stats.IOEntry {
	lines, _ := r.lines("io.stat")
	var out []*stats.IOEntry
	for _, f := range lines {
		maj, min, ok := strings.Cut(f[0], ":")
		e := &stats.IOEntry{}
		var err1, err2 error
		e.Major, err1 = strconv.ParseUint(maj, 10, 64)
		e.Minor, err2 = strconv.ParseUint(min, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			r.fail("io.stat", fmt.Errorf("device %q is not MAJOR:MINOR", f[0]))
			return nil
		}
		for _, kv := range f[1:] {
			k, s, _ := strings.Cut(kv, "=")
			var field *uint64
			switch k {
			case "rbytes":
				field = &e.Rbytes
			case "wbytes":
				field = &e.Wbytes
			case "rios":
				field = &e.Rios
			case "wios":
				field = &e.Wios
			default:
				continue
			}
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				r.fail("io.stat", fmt.Errorf("field %q: %w", kv, err))
				return nil
			}
			*field = v
		}
		out = append(out, e)
	}
	return out
}

// rdma reads rdma.current or rdma.max: "DEVICE hca_handle=N hca_object=N",
// "max" being the largest uint32 (the field's width).
func (r *reader) rdma(name string) []*stats.RdmaEntry {
	lines, _ := r.lines(name)
	var out []*stats.RdmaEntry
	for _, f := range lines {
		e := &stats.RdmaEntry{Device: f[0]}
		for _, kv := range f[1:] {
			k, s, _ := strings.Cut(kv, "=")
			v := uint64(math.MaxUint32)
			if s != "max" {
				var err error
				if v, err = strconv.ParseUint(s, 10, 32); err != nil {
					r.fail(name, fmt.Errorf("field %q: %w", kv, err))
					return nil
				}
			}
			switch k {
			case "hca_handle":
				e.HcaHandles = uint32(v)
			case "hca_object":
				e.HcaObjects = uint32(v)
			}
		}
		out = append(out, e)
	}
	return out
}

// hugetlb reads hugetlb.<size>.current, .max and the "max" count of
// .events (its failcnt) for each huge page size the group has files for.
// The names are matched as strings, never as patterns: the directory's
// name is the container's, and a child group a container made inside its
// own cgroup (a directory) is not a page size.
func (r *reader) hugetlb() []*stats.HugeTlbStat {
	entries, err := os.ReadDir(r.dir)
	if err != nil {
		return nil
	}
	var out []*stats.HugeTlbStat
	for _, de := range entries {
		n := de.Name()
		if de.IsDir() || !strings.HasPrefix(n, "hugetlb.") || !strings.HasSuffix(n, ".current") {
			continue
		}
		size := strings.TrimSuffix(strings.TrimPrefix(n, "hugetlb."), ".current")
		if size == "" || strings.Contains(size, ".") { // hugetlb.<size>.rsvd.current
			continue
		}
		p := "hugetlb." + size
		out = append(out, &stats.HugeTlbStat{
			Pagesize: size,
			Current:  r.single(p + ".current"),
			Max:      r.single(p + ".max"),
			Failcnt:  r.keyed(p + ".events")["max"],
		})
	}
	return out
}
