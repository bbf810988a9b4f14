package cgroupstats

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containerd/cgroups/v3/cgroup2"
	"github.com/containerd/cgroups/v3/cgroup2/stats"
	"google.golang.org/protobuf/proto"
)

// guestFixture is a busybox container's cgroup in a c8s sim pod VM with a
// 64 MiB memory limit (testdata/README.md).
const guestFixture = "testdata/guest-64m"

func TestReadGuestFixture(t *testing.T) {
	m, err := readFiles(guestFixture)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"pids.current", m.GetPids().GetCurrent(), 2},
		{"pids.max", m.GetPids().GetLimit(), math.MaxUint64},
		{"cpu usage_usec", m.GetCPU().GetUsageUsec(), 203240},
		{"cpu user_usec", m.GetCPU().GetUserUsec(), 63230},
		{"cpu system_usec", m.GetCPU().GetSystemUsec(), 140010},
		{"cpu.pressure some total", m.GetCPU().GetPSI().GetSome().GetTotal(), 64953},
		{"memory.current", m.GetMemory().GetUsage(), 2273280},
		{"memory.max", m.GetMemory().GetUsageLimit(), 64 << 20},
		{"memory.peak", m.GetMemory().GetMaxUsage(), 2379776},
		{"memory.swap.max", m.GetMemory().GetSwapLimit(), math.MaxUint64},
		{"memory.stat file", m.GetMemory().GetFile(), 1753088},
		{"memory.stat inactive_file", m.GetMemory().GetInactiveFile(), 36864},
		{"memory.stat pgmajfault", m.GetMemory().GetPgmajfault(), 17},
		{"io.stat devices", uint64(len(m.GetIo().GetUsage())), 2},
		{"io.pressure full total", m.GetIo().GetPSI().GetFull().GetTotal(), 50173},
		{"hugetlb sizes", uint64(len(m.GetHugetlb())), 1},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if e := m.GetIo().GetUsage()[1]; e.GetMajor() != 253 || e.GetMinor() != 1 || e.GetRbytes() != 1753088 || e.GetRios() != 24 {
		t.Errorf("io.stat second device = %v, want 253:1 rbytes=1753088 rios=24", e)
	}
	if h := m.GetHugetlb()[0]; h.GetPagesize() != "2MB" || h.GetMax() != math.MaxUint64 || h.GetCurrent() != 0 {
		t.Errorf("hugetlb = %v, want 2MB, max unlimited, current 0", h)
	}
	if m.GetMemoryEvents() == nil {
		t.Error("memory.events exists but MemoryEvents is nil")
	}
	if len(m.GetRdma().GetCurrent()) != 0 {
		t.Errorf("rdma = %v without rdma files", m.GetRdma())
	}
}

// TestSameAsContainerd reads the fixture with containerd's cgroup v2
// manager too: the Metrics must be the same, but for hugetlb, which
// containerd takes from the host's page sizes and whose failcnt it reads
// from hugetlb.<size>.events as a single number ("max 0" does not parse,
// so it reports 0 always).
func TestSameAsContainerd(t *testing.T) {
	sameAsContainerd(t, guestFixture)
}

// sameAsContainerd compares readFiles(dir) with containerd's cgroup v2
// manager's Stat of dir, hugetlb aside (see TestSameAsContainerd).
func sameAsContainerd(t *testing.T, dir string) {
	t.Helper()
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := cgroup2.Load("/", cgroup2.WithMountpoint(abs))
	if err != nil {
		t.Fatal(err)
	}
	want, err := mgr.Stat()
	if err != nil {
		t.Fatal(err)
	}
	got, err := readFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	want.Hugetlb, got.Hugetlb = nil, nil
	if !proto.Equal(got, want) {
		t.Errorf("Metrics differ from containerd's:\n got %v\nwant %v", got, want)
	}
}

func TestSameAsContainerdOnDistinctValues(t *testing.T) {
	dir := t.TempDir()
	n := uint64(1000)
	next := func() uint64 { n += 7; return n }
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"cpu.stat", "memory.stat", "memory.events"} {
		b, err := os.ReadFile(filepath.Join(guestFixture, name))
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			key, _, _ := strings.Cut(line, " ")
			fmt.Fprintf(&out, "%s %d\n", key, next())
		}
		write(name, out.String())
	}
	for _, name := range []string{"pids.current", "pids.max", "memory.current", "memory.max", "memory.peak",
		"memory.swap.current", "memory.swap.max", "memory.swap.peak"} {
		write(name, fmt.Sprintf("%d\n", next()))
	}
	for _, name := range []string{"cpu.pressure", "memory.pressure", "io.pressure"} {
		write(name, fmt.Sprintf("some avg10=%d.25 avg60=%d.50 avg300=%d.75 total=%d\nfull avg10=%d.25 avg60=%d.50 avg300=%d.75 total=%d\n",
			next(), next(), next(), next(), next(), next(), next(), next()))
	}
	write("io.stat", fmt.Sprintf("8:0 rbytes=%d wbytes=%d rios=%d wios=%d dbytes=%d dios=%d\n253:7 rbytes=%d wbytes=%d rios=%d wios=%d dbytes=0 dios=0\n",
		next(), next(), next(), next(), next(), next(), next(), next(), next(), next()))
	write("rdma.current", fmt.Sprintf("mlx4_0 hca_handle=%d hca_object=%d\nmlx4_1 hca_handle=%d hca_object=%d\n", next(), next(), next(), next()))
	write("rdma.max", fmt.Sprintf("mlx4_0 hca_handle=%d hca_object=max\n", next()))

	sameAsContainerd(t, dir)
}

// Hugetlb sizes are the group's hugetlb.<size>.current files, matched as
// strings in a directory whose name may hold pattern characters (the
// container's id); a child group a container made with such a name, and
// the reservation files, are no page size. Failcnt is the events file's
// "max" count.
func TestHugetlb(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c[*?")
	for name, content := range map[string]string{
		"hugetlb.2MB.current": "4194304\n", "hugetlb.2MB.max": "8388608\n", "hugetlb.2MB.events": "max 3\n",
		"hugetlb.1GB.current": "0\n", "hugetlb.1GB.max": "max\n",
		"hugetlb.2MB.rsvd.current": "0\n",
	} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "hugetlb.x.current"), 0o755); err != nil { // a child cgroup
		t.Fatal(err)
	}
	m, err := readFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*stats.HugeTlbStat{}
	for _, h := range m.GetHugetlb() {
		got[h.GetPagesize()] = h
	}
	if len(got) != 2 {
		t.Fatalf("hugetlb sizes %v, want 1GB and 2MB", got)
	}
	if h := got["2MB"]; h.GetCurrent() != 4<<20 || h.GetMax() != 8<<20 || h.GetFailcnt() != 3 {
		t.Errorf("2MB = %v, want current 4 MiB, max 8 MiB, failcnt 3", h)
	}
	if h := got["1GB"]; h.GetMax() != math.MaxUint64 || h.GetFailcnt() != 0 {
		t.Errorf("1GB = %v, want max unlimited, failcnt 0 (no events file)", h)
	}
}

// io.stat keys the Metrics have no field for are not parsed: some kernels
// add debug keys with signed values.
func TestIOStatSkipsOtherKeys(t *testing.T) {
	dir := t.TempDir()
	line := "8:16 rbytes=10 wbytes=20 rios=3 wios=4 dbytes=0 dios=0 use_delay=-1 cost.vrate=100.00\n"
	if err := os.WriteFile(filepath.Join(dir, "io.stat"), []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := readFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u := m.GetIo().GetUsage(); len(u) != 1 || u[0].GetMinor() != 16 || u[0].GetRbytes() != 10 || u[0].GetWbytes() != 20 || u[0].GetRios() != 3 || u[0].GetWios() != 4 {
		t.Errorf("io.stat usage = %v, want 8:16 10/20 bytes, 3/4 ios", u)
	}
}

// A file that cannot be read for another reason than its absence fails
// the read, naming it, rather than reading as zero.
func TestReadErrorIsNotZero(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "memory.current"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := readFiles(dir); err == nil || !strings.Contains(err.Error(), "memory.current") {
		t.Fatalf("err = %v, want the read error of memory.current", err)
	}
}

func TestReadWithoutFiles(t *testing.T) {
	m, err := readFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if m.GetPids().GetCurrent() != 0 || m.GetMemory().GetUsage() != 0 || m.GetCPU().GetPSI() != nil {
		t.Errorf("absent files gave %v, want zeros", m)
	}
	if m.GetMemoryEvents() != nil || len(m.GetHugetlb()) != 0 || len(m.GetIo().GetUsage()) != 0 {
		t.Errorf("absent files gave %v, want no events, hugetlb or io entries", m)
	}
}

func TestReadNamesTheMalformedFile(t *testing.T) {
	for name, content := range map[string]string{
		"pids.current":    "two\n",
		"memory.max":      "-1\n",
		"memory.stat":     "anon 1 2\n",
		"cpu.stat":        "usage_usec many\n",
		"cpu.pressure":    "some avg10=x avg60=0.00 avg300=0.00 total=1\n",
		"io.pressure":     "full total\n",
		"io.stat":         "8-0 rbytes=1\n",
		"memory.events":   "oom\n",
		"rdma.current":    "mlx4_0 hca_handle=1 hca_object=-3\n",
		"hugetlb.2MB.max": "lots\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if strings.HasPrefix(name, "hugetlb.") {
				if err := os.WriteFile(filepath.Join(dir, "hugetlb.2MB.current"), []byte("0\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := readFiles(dir)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, name)) {
				t.Fatalf("err = %v, want an error naming %s", err, name)
			}
		})
	}
}

func TestReadRefusesWhatIsNotCgroup2(t *testing.T) {
	_, err := Read(t.TempDir())
	if !errors.Is(err, ErrNotUnified) {
		t.Fatalf("Read(a temporary directory) = %v, want ErrNotUnified", err)
	}
	// A group removed meanwhile (its container deleted): the agent tells
	// it by fs.ErrNotExist.
	if _, err := Read(filepath.Join(t.TempDir(), "gone")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Read(a missing directory) = %v, want fs.ErrNotExist", err)
	}
}
