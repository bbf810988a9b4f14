package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/layerimage"
)

// TestImageFsInfoCountsTheLayerCache checks node hygiene against the real
// containerd 2.2 CRI, with no VM: the layer disks c8s caches count in
// CRI's ImageFsInfo (what kubelet reports as the image file system, via
// crictl imagefsinfo) as soon as they are built, `c8s-launcher env`
// counts them, pruning never takes a layer a pod holds nor its count,
// and the used bytes drop back once the layers are pruned, with no link
// of a layer disk left in containerd's snapshots.
func TestImageFsInfoCountsTheLayerCache(t *testing.T) {
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	launcherBin := filepath.Join(root, "bin", "c8s-launcher")
	if _, err := os.Stat(launcherBin); err != nil {
		containerdtest.SkipOrFail(t, "%s is missing: run make build", launcherBin)
	}
	d := containerdtest.Start(t, containerdtest.Options{
		CRI:       true,
		Namespace: "k8s.io",
		// CRI re-reads snapshot usage every second instead of 10.
		ExtraConfig: "[plugins.'io.containerd.cri.v1.images']\n  stats_collect_period = 1\n",
	})
	crictlBin := filepath.Join(d.ToolsBin, "crictl")
	if _, err := os.Stat(crictlBin); err != nil {
		containerdtest.SkipOrFail(t, "crictl not found in %s: run make tools", d.ToolsBin)
	}
	// The cache next to containerd's root: one file system, as on a
	// node with /var/lib/c8s and /var/lib/containerd on /var.
	cacheDir := filepath.Join(d.Dir, "c8s-layers")
	cfg := filepath.Join(d.Dir, "c8s.toml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("[runtime]\nlayer_cache_dir = %q\n", cacheDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	launcher := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(launcherBin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("c8s-launcher %s: %v\n%s\ncontainerd log:\n%s", strings.Join(args, " "), err, out, tail(d.Log(), 40))
		}
		return string(out)
	}
	usedBytes := func() uint64 {
		t.Helper()
		out, err := exec.Command(crictlBin, "--image-endpoint", "unix://"+d.Address, "--timeout", "30s", "imagefsinfo", "-o", "json").Output()
		if err != nil {
			t.Fatalf("crictl imagefsinfo: %v", err)
		}
		var r struct {
			Status struct {
				ImageFilesystems []struct {
					FsID      struct{ Mountpoint string } `json:"fsId"`
					UsedBytes struct{ Value string }      `json:"usedBytes"`
				} `json:"imageFilesystems"`
			} `json:"status"`
		}
		if err := json.Unmarshal(out, &r); err != nil || len(r.Status.ImageFilesystems) == 0 {
			t.Fatalf("crictl imagefsinfo: %v\n%s", err, out)
		}
		fs := r.Status.ImageFilesystems[0]
		if want := filepath.Join(d.Root, "io.containerd.snapshotter.v1.overlayfs"); fs.FsID.Mountpoint != want {
			t.Fatalf("image file system %s, want %s", fs.FsID.Mountpoint, want)
		}
		n, err := strconv.ParseUint(fs.UsedBytes.Value, 10, 64)
		if err != nil {
			t.Fatalf("crictl imagefsinfo: used bytes %q", fs.UsedBytes.Value)
		}
		return n
	}
	// settled waits until CRI's used bytes satisfy ok (it syncs every
	// second) and returns them.
	settled := func(what string, ok func(uint64) bool) uint64 {
		t.Helper()
		var n uint64
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
			if n = usedBytes(); ok(n) {
				return n
			}
		}
		t.Fatalf("%s: CRI ImageFsInfo used bytes stay %d", what, n)
		return 0
	}

	// An image of three layers above busybox's, one of 8 MiB.
	tarball := filepath.Join(d.Dir, "imagefs.tar")
	const name = "docker.io/c8s/imagefs:test"
	if _, err := layerimage.WriteFile(tarball, layerimage.Options{Name: name, ScratchDir: d.Dir, Layers: [][]layerimage.Entry{
		{{Name: "opt/big", Random: 8 << 20}},
		{{Name: "etc/c8s", Dir: true}, {Name: "etc/c8s/two", Data: []byte("two\n")}},
	}}); err != nil {
		t.Fatal(err)
	}
	d.Ctr(t, "images", "import", tarball)
	// The image's unpacked snapshots are what CRI counts so far, once its
	// syncer has seen them all: the sum of their usage (committed, so
	// fixed). Readings that merely agree are not enough: CRI re-reads
	// once a second, and a pass during the unpack leaves a partial sum
	// until the next (CI saw one without the last layer's 16 KiB).
	imported := snapshotsUsage(t, d)
	base := settled("after the import", func(n uint64) bool { return n == imported })

	out := launcher("layers", "convert", "--config", cfg, "--containerd-address", d.Address, name)
	if strings.Count(out, " built in ") != 3 {
		t.Fatalf("layers convert built %d layers, want 3:\n%s", strings.Count(out, " built in "), out)
	}
	var layers []cachedLayer
	if err := json.Unmarshal([]byte(launcher("layers", "list", "--config", cfg, "--json")), &layers); err != nil || len(layers) != 3 {
		t.Fatalf("layers list: %v, %d layers", err, len(layers))
	}
	var cached, big uint64
	var bigLayer cachedLayer
	for _, l := range layers {
		cached += uint64(l.Allocated)
		if uint64(l.Allocated) > big {
			big, bigLayer = uint64(l.Allocated), l
		}
		// One copy of the bytes: the cache's file is what containerd's
		// snapshot links.
		var st syscall.Stat_t
		if err := syscall.Stat(l.Path, &st); err != nil || st.Nlink != 2 {
			t.Errorf("layer %s: %d links, want 2 (the cache's and the counting snapshot's): %v", l.DiffID, st.Nlink, err)
		}
	}
	if big < 8<<20 {
		t.Fatalf("the biggest layer disk takes %d bytes, want the 8 MiB layer's", big)
	}
	// Each counting snapshot adds its directory's block to the disk.
	const slack = 3 * 64 << 10
	withCache := settled("after converting the layers", func(n uint64) bool { return n >= base+cached })
	if withCache > base+cached+slack {
		t.Fatalf("used bytes grew from %d by %d, want the cache's %d", base, withCache-base, cached)
	}
	t.Logf("CRI ImageFsInfo used bytes: %d before, %d with the cache's %d bytes in 3 layers", base, withCache, cached)
	if snaps := d.Ctr(t, "snapshots", "ls"); strings.Count(snaps, "c8s-layer-cache/") != 3 {
		t.Fatalf("containerd's snapshots:\n%s", snaps)
	}

	var env struct {
		Layers struct {
			Count     int   `json:"count"`
			Bytes     int64 `json:"bytes"`
			Allocated int64 `json:"allocated"`
		} `json:"layers"`
	}
	if err := json.Unmarshal([]byte(launcher("env", "--config", cfg, "--containerd-address", d.Address, "--json")), &env); err != nil {
		t.Fatal(err)
	}
	if env.Layers.Count != 3 || uint64(env.Layers.Allocated) != cached {
		t.Fatalf("c8s-launcher env: %+v, want 3 layers taking %d bytes", env.Layers, cached)
	}

	// A count lost behind c8s's back (its lease deleted) is restored by
	// `layers sync`, and only that one.
	var lease string
	for _, line := range strings.Split(d.Ctr(t, "leases", "ls"), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "c8s-layers-") && strings.Contains(line, bigLayer.DiffID) {
			lease = f[0]
		}
	}
	if lease == "" {
		t.Fatalf("no lease counts layer %s:\n%s", bigLayer.DiffID, d.Ctr(t, "leases", "ls"))
	}
	d.Ctr(t, "leases", "rm", "--sync", lease)
	settled("after its count was lost", func(n uint64) bool { return n <= withCache-big })
	if out := launcher("layers", "sync", "--config", cfg, "--containerd-address", d.Address); !strings.Contains(out, "1 layers counted, 0 counts") {
		t.Fatalf("layers sync:\n%s", out)
	}
	settled("after layers sync", func(n uint64) bool { return n == withCache })
	if out := launcher("layers", "sync", "--config", cfg, "--containerd-address", d.Address); !strings.Contains(out, "every cached layer is counted") {
		t.Fatalf("layers sync again:\n%s", out)
	}

	// A pod holds the big layer, as a shim does between acquiring and
	// releasing it (this process plays the shim: its reference is live).
	c, err := layercache.Open(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := layercache.PodRef("k8s.io", "imagefs-pod", "")
	if err != nil {
		t.Fatal(err)
	}
	held, err := digest.Parse(bigLayer.DiffID)
	if err != nil {
		t.Fatal(err)
	}
	notCached := func(context.Context, *os.File) (layercache.Meta, error) {
		return layercache.Meta{}, errors.New("the layer is not cached")
	}
	if _, built, err := c.Acquire(context.Background(), held, ref, notCached); err != nil || built {
		t.Fatalf("hold the cached layer: built %v, %v", built, err)
	}
	prune := func(args ...string) string {
		return launcher(append([]string{"layers", "prune", "--config", cfg, "--containerd-address", d.Address}, args...)...)
	}
	// The image keeps its layers.
	if out := prune(); !strings.Contains(out, "pruned 0 layers") {
		t.Fatalf("prune with the image present:\n%s", out)
	}
	// Ignoring the image, all but the held layer go, and their counts.
	if out := prune("--all-unused"); !strings.Contains(out, "pruned 2 layers") || strings.Contains(out, bigLayer.DiffID) {
		t.Fatalf("prune --all-unused with the big layer held:\n%s", out)
	}
	if _, err := os.Stat(bigLayer.Path); err != nil {
		t.Fatalf("prune removed the held layer: %v", err)
	}
	settled("after pruning all but the held layer", func(n uint64) bool { return n >= base+big && n <= base+big+slack })

	// Released, it goes too: CRI is back to the image's own snapshots,
	// and no disk is left linked in containerd's snapshots.
	if err := c.Release(context.Background(), held, ref.Name); err != nil {
		t.Fatal(err)
	}
	if out := prune("--all-unused"); !strings.Contains(out, "pruned 1 layers") {
		t.Fatalf("prune after the release:\n%s", out)
	}
	settled("after pruning everything", func(n uint64) bool { return n == base })
	filepath.Walk(d.Root, func(p string, info os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".disk") {
			t.Errorf("a layer disk is left in containerd's root: %s", p)
		}
		return nil
	})
	if snaps := d.Ctr(t, "snapshots", "ls"); strings.Contains(snaps, "c8s-layer-cache/") {
		t.Fatalf("counting snapshots left:\n%s", snaps)
	}
}

// snapshotsUsage sums the usage of every snapshot in the daemon's
// namespace, as CRI's ImageFsInfo does.
func snapshotsUsage(t *testing.T, d *containerdtest.Daemon) uint64 {
	t.Helper()
	out := d.Ctr(t, "snapshots", "usage", "-b")
	var sum uint64
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, line := range lines[1:] { // KEY SIZE INODES
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("ctr snapshots usage: line %q in:\n%s", line, out)
		}
		n, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatalf("ctr snapshots usage: size %q: %v", f[1], err)
		}
		sum += n
	}
	if len(lines) < 2 || sum == 0 {
		t.Fatalf("ctr snapshots usage: no snapshots after the import:\n%s", out)
	}
	return sum
}
