package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	verityapi "github.com/c8s-dev/c8s/guest/api/verity"
)

// The layer tests run the real agent with runc on the host (env_test.go)
// over layer disks in c8s's layer format, built with the standard tools
// (mkfs.ext4 -d, veritysetup format --no-superblock): a cross-check of the
// format. The host kernel has no device-mapper, so fakeLayerDevices stands
// in for dm-verity: it checks the whole disk against the root hash the
// agent opens it with, in userspace (veritysetup verify), and a disk that
// fails maps to a device whose reads fail, with its status corrupted, as
// dm-verity's would. The guest's own dm-verity is exercised by the
// malicious-host tests in a real VM (tests/e2e).

// layerDisk is a layer disk built for a test, attached to a loop device.
type layerDisk struct {
	digest string
	root   string
	blocks uint64
	image  string
	dev    string
	target uint32 // its SCSI target for fakeLayerDevices
}

func (l *layerDisk) req() *agentapi.Layer {
	return &agentapi.Layer{Scsi: &agentapi.ScsiDisk{Target: l.target}, Digest: l.digest, RootHash: l.root, DataBlocks: l.blocks}
}

// treeEntry is a file of a layer's tree: content, or a whiteout
// (overlayfs's char 0/0), or an opaque directory.
type treeEntry struct {
	content string
	mode    os.FileMode
	// whiteout and opaque are overlayfs's format of OCI's .wh. files.
	whiteout, opaque bool
	// link is a symlink's target.
	link string
}

// writeLayerTree writes a layer's tree.
func writeLayerTree(t *testing.T, dir string, files map[string]treeEntry) {
	t.Helper()
	for name, f := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch {
		case f.whiteout:
			err = unix.Mknod(p, unix.S_IFCHR, 0)
		case f.opaque:
			if err = os.MkdirAll(p, 0o755); err == nil {
				err = unix.Setxattr(p, "trusted.overlay.opaque", []byte("y"), 0)
			}
		case f.link != "":
			err = os.Symlink(f.link, p)
		default:
			mode := f.mode
			if mode == 0 {
				mode = 0o644
			}
			if err = os.WriteFile(p, []byte(f.content), mode); err == nil {
				err = os.Chmod(p, mode)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// buildLayer makes a layer disk of tree (ext4 of sizeMiB, then its
// unsalted dm-verity tree without superblock from block data_blocks on),
// attached read-only to a loop device.
func buildLayer(t *testing.T, name, tree string, sizeMiB int, target uint32) *layerDisk {
	t.Helper()
	dir := t.TempDir()
	img := filepath.Join(dir, name+".layer")
	blocks := uint64(sizeMiB) << 20 / verityapi.BlockSize
	run(t, dir, "mkfs.ext4", "-q", "-F", "-b", "4096", "-d", tree, img, strconv.Itoa(sizeMiB)+"M")
	out := run(t, dir, "veritysetup", "format", "--no-superblock", "--salt=-",
		"--data-blocks="+strconv.FormatUint(blocks, 10), "--hash-offset="+strconv.FormatUint(blocks*verityapi.BlockSize, 10), img, img)
	var root string
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "Root hash:"); ok {
			root = strings.TrimSpace(v)
		}
	}
	if len(root) != 64 {
		t.Fatalf("veritysetup printed no root hash:\n%s", out)
	}
	sum := sha256.Sum256([]byte("c8s test layer " + name))
	dev := strings.TrimSpace(run(t, dir, "losetup", "--find", "--show", "--read-only", img))
	t.Cleanup(func() { _, _ = testReaper.Run(exec.Command("losetup", "-d", dev)) })
	return &layerDisk{digest: "sha256:" + hex.EncodeToString(sum[:]), root: root, blocks: blocks, image: img, dev: dev, target: target}
}

// fakeLayerDevices stands in for the guest's disks and dm-verity.
type fakeLayerDevices struct {
	mu      sync.Mutex
	disks   map[uint32]string // SCSI target: loop device
	open    map[string]verityapi.Params
	opened  []verityapi.Params // every Open, in order
	closed  []string
	corrupt map[string]bool
	// corruptWhen, if set, decides Corrupted for a mapping that verified.
	corruptWhen func(name string) bool
	// statusErr, if set, fails Corrupted (a status that cannot be read).
	statusErr error
	// busy is how many Close calls fail with EBUSY first (a file system
	// on the mapping still lazily unmounting).
	busy int
}

func newFakeLayerDevices(disks ...*layerDisk) *fakeLayerDevices {
	f := &fakeLayerDevices{disks: map[uint32]string{}, open: map[string]verityapi.Params{}, corrupt: map[string]bool{}}
	for _, d := range disks {
		f.disks[d.target] = d.dev
	}
	return f
}

func (f *fakeLayerDevices) Find(_ context.Context, d *agentapi.ScsiDisk) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dev, ok := f.disks[d.GetTarget()]
	if !ok {
		return "", fmt.Errorf("no disk at scsi target %d", d.GetTarget())
	}
	return dev, nil
}

func (f *fakeLayerDevices) Open(name string, p verityapi.Params) (string, error) {
	if err := p.Validate(); err != nil {
		return "", err
	}
	f.mu.Lock()
	if _, dup := f.open[name]; dup {
		f.mu.Unlock()
		return "", fmt.Errorf("device-mapper: create %s: %w", name, unix.EBUSY)
	}
	f.open[name] = p
	f.opened = append(f.opened, p)
	f.mu.Unlock()
	// The table the agent loads, checked as dm-verity would check each
	// block, all at once.
	salt := p.Salt
	if salt == "" {
		salt = "-"
	}
	c := exec.Command("veritysetup", "verify", "--no-superblock", "--salt="+salt,
		"--data-blocks="+strconv.FormatUint(p.DataBlocks, 10), "--hash-offset="+strconv.FormatUint(p.HashStartBlock*verityapi.BlockSize, 10),
		p.Device, p.Device, p.RootHash)
	if status, err := testReaper.Run(c); err != nil || status != 0 {
		f.mu.Lock()
		f.corrupt[name] = true
		f.mu.Unlock()
		return "/dev/null", nil // reads fail: not a block device
	}
	return p.Device, nil
}

func (f *fakeLayerDevices) Close(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.busy > 0 {
		f.busy--
		return fmt.Errorf("device-mapper: remove %s: %w", name, unix.EBUSY)
	}
	if _, ok := f.open[name]; !ok {
		return fmt.Errorf("device-mapper: remove %s: %w", name, unix.ENXIO)
	}
	delete(f.open, name)
	delete(f.corrupt, name)
	f.closed = append(f.closed, name)
	return nil
}

func (f *fakeLayerDevices) Corrupted(name string) (bool, error) {
	f.mu.Lock()
	bad, when, serr := f.corrupt[name], f.corruptWhen, f.statusErr
	_, ok := f.open[name]
	f.mu.Unlock()
	if serr != nil {
		return false, serr
	}
	if !ok {
		return false, fmt.Errorf("device-mapper: status of %s: %w", name, unix.ENXIO)
	}
	return bad || when != nil && when(name), nil
}

func (f *fakeLayerDevices) openCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.open)
}

// layers makes the agent of e open layers with devs.
func (e *env) layers(devs *fakeLayerDevices) {
	e.svc.cfg.LayerDevices = devs
}

// layeredReq makes a create request's root the layers, bottom first.
func layeredReq(ls ...*layerDisk) func(*agentapi.CreateContainerRequest) {
	return func(r *agentapi.CreateContainerRequest) {
		r.Rootfs = &agentapi.Rootfs{Fstype: "ext4"}
		for _, l := range ls {
			r.Rootfs.Layers = append(r.Rootfs.Layers, l.req())
		}
	}
}

// busyboxLayer is the base layer: busybox and its applets.
func busyboxLayer(t *testing.T, target uint32, extra map[string]treeEntry) *layerDisk {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]treeEntry{"bin/busybox": {content: string(bb), mode: 0o755}}
	for _, a := range []string{"sh", "cat", "ls", "echo", "sleep", "true"} {
		files["bin/"+a] = treeEntry{link: "busybox"}
	}
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run"} {
		files[d+"/.keep"] = treeEntry{}
	}
	for k, v := range extra {
		files[k] = v
	}
	tree := t.TempDir()
	writeLayerTree(t, tree, files)
	return buildLayer(t, fmt.Sprintf("base-%d", target), tree, 16, target)
}

// layer is a small layer of files.
func smallLayer(t *testing.T, name string, target uint32, files map[string]treeEntry) *layerDisk {
	t.Helper()
	tree := t.TempDir()
	writeLayerTree(t, tree, files)
	return buildLayer(t, name, tree, 4, target)
}

// layerMounts lists the mounts below the agent's layers directory.
func (e *env) layerMounts(t *testing.T) []*mountinfo.Info {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(e.svc.layersDir()))
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// assertLayersClosed checks that no layer is mounted or mapped, and that
// the agent holds none.
func (e *env) assertLayersClosed(t *testing.T, devs *fakeLayerDevices) {
	t.Helper()
	for _, m := range e.layerMounts(t) {
		t.Errorf("layer mount left: %s", m.Mountpoint)
	}
	if n := devs.openCount(); n != 0 {
		t.Errorf("%d dm-verity mappings left", n)
	}
	e.svc.layers.mu.Lock()
	defer e.svc.layers.mu.Unlock()
	if len(e.svc.layers.layers) != 0 {
		t.Errorf("the agent still holds layers %v", e.svc.layers.layers)
	}
}

// assertRefusedGone checks that nothing of a refused container is left
// while others run: no mount below its bundle, no bundle.
func (e *env) assertRefusedGone(t *testing.T, id string) {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(filepath.Join(e.stateDir, id)))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		t.Errorf("mount of refused container %s left: %s", id, m.Mountpoint)
	}
	if fileExists(filepath.Join(e.stateDir, id)) {
		t.Errorf("bundle of refused container %s left", id)
	}
}

// A container of three layers runs: the upper layers' whiteouts hide the
// lower layers' files, an opaque directory hides their content, and the
// container's writes go to a tmpfs of the guest, though the guest names
// no TEE.
func TestLayeredRootWhiteouts(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, map[string]treeEntry{
		"etc/kept": {content: "base\n"}, "etc/deleted": {content: "base\n"}, "etc/replaced": {content: "base\n"},
		"data/old-1": {content: "x"}, "data/old-2": {content: "y"},
	})
	mid := smallLayer(t, "mid", 2, map[string]treeEntry{
		"etc/deleted": {whiteout: true}, "data": {opaque: true}, "data/new": {content: "mid\n"}, "etc/replaced": {content: "mid\n"},
	})
	top := smallLayer(t, "top", 3, map[string]treeEntry{"etc/replaced": {content: "top\n"}, "etc/added": {content: "top\n"}})
	devs := newFakeLayerDevices(base, mid, top)
	e.layers(devs)

	// mkfs.ext4 gives every layer an empty lost+found, as
	// measurements/layer's converter does: not the image's, so hidden.
	s := e.spec(t, "sh", "-c", "test -e /lost+found && echo lost+found visible; ls /etc /data; cat /etc/replaced; echo written >/etc/kept && cat /etc/kept")
	s.Root.Readonly = false
	e.create(t, "lw", s, pipes(), layeredReq(base, mid, top))
	root := mountAt(t, filepath.Join(e.stateDir, "lw", "rootfs"))
	if root == nil || root.FSType != "overlay" || !strings.Contains(","+root.Options+",", ",nodev,") {
		t.Fatalf("the container's root is %+v, want an overlay, nodev", root)
	}
	for _, l := range []*layerDisk{base, mid, top} {
		h := strings.TrimPrefix(l.digest, "sha256:")
		m := mountAt(t, filepath.Join(e.svc.layersDir(), h))
		if m == nil || m.FSType != "ext4" || !strings.Contains(","+m.Options+",", ",ro,") ||
			!strings.Contains(m.Options, "nodev") || !strings.Contains(m.Options, "nosuid") {
			t.Errorf("layer %s is mounted %+v, want ext4 ro,nodev,nosuid", l.digest, m)
		}
	}
	// The top layer first in the overlay's stack.
	want := filepath.Join(e.svc.layersDir(), strings.TrimPrefix(top.digest, "sha256:")) + ":" +
		filepath.Join(e.svc.layersDir(), strings.TrimPrefix(mid.digest, "sha256:")) + ":" +
		filepath.Join(e.svc.layersDir(), strings.TrimPrefix(base.digest, "sha256:"))
	if !strings.Contains(root.VFSOptions, "lowerdir="+want) && !strings.Contains(root.VFSOptions, "lowerdir+="+strings.ReplaceAll(want, ":", ",lowerdir+=")) {
		t.Errorf("the overlay's options %q do not stack %s", root.VFSOptions, want)
	}
	e.start(t, "lw")
	if st := e.wait(t, "lw", ""); st != 0 {
		t.Fatalf("exit %d: %s", st, e.readAll(t, "lw", "", true))
	}
	out := e.readAll(t, "lw", "", false)
	wantOut := "/data:\nnew\n\n/etc:\nadded\nkept\nreplaced\ntop\nwritten\n"
	if out != wantOut {
		t.Errorf("the container saw\n%s\nwant\n%s", out, wantOut)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Join(e.stateDir, "lw", scratchDir), &fs); err != nil || fs.Type != unix.TMPFS_MAGIC {
		t.Errorf("the writable layer is not a tmpfs (%#x, %v)", fs.Type, err)
	}
	if b, err := os.ReadFile(filepath.Join(e.stateDir, "lw", scratchDir, "upper", "etc", "kept")); err != nil || string(b) != "written\n" {
		t.Errorf("the write in the tmpfs: %q, %v", b, err)
	}
	e.remove(t, "lw")
	e.assertGone(t, "lw")
	e.assertLayersClosed(t, devs)
	if len(devs.opened) != 3 || len(devs.closed) != 3 {
		t.Errorf("%d layers opened, %d closed; want 3 and 3", len(devs.opened), len(devs.closed))
	}
}

// Two containers of one image share its layers: each opened and mounted
// once, kept until the last container using it goes.
func TestSharedLayerOpenedOnce(t *testing.T) {
	e := newEnv(t)
	e.startedAsTEE(t, "sim")
	base := busyboxLayer(t, 1, nil)
	a := smallLayer(t, "a", 2, map[string]treeEntry{"etc/who": {content: "a\n"}})
	b := smallLayer(t, "b", 3, map[string]treeEntry{"etc/who": {content: "b\n"}})
	devs := newFakeLayerDevices(base, a, b)
	e.layers(devs)

	e.create(t, "c-a", e.spec(t, "cat", "/etc/who"), pipes(), layeredReq(base, a))
	// c-b names the base layer at another address (the host attached it
	// again): the same digest and root, so the same content, and the
	// layer open already serves.
	again := *base
	again.target = 9
	devs.disks[9] = base.dev
	e.create(t, "c-b", e.spec(t, "cat", "/etc/who"), pipes(), layeredReq(&again, b))
	if n := len(e.layerMounts(t)); n != 3 {
		t.Errorf("%d layer mounts for 3 layers", n)
	}
	if len(devs.opened) != 3 {
		t.Errorf("%d dm-verity mappings made for 3 layers", len(devs.opened))
	}
	for id, want := range map[string]string{"c-a": "a\n", "c-b": "b\n"} {
		e.start(t, id)
		e.wait(t, id, "")
		if out := e.readAll(t, id, "", false); out != want {
			t.Errorf("%s printed %q, want %q", id, out, want)
		}
	}
	e.remove(t, "c-a")
	baseDir := filepath.Join(e.svc.layersDir(), strings.TrimPrefix(base.digest, "sha256:"))
	if mountAt(t, baseDir) == nil {
		t.Fatal("the shared layer was unmounted while c-b uses it")
	}
	if mountAt(t, filepath.Join(e.svc.layersDir(), strings.TrimPrefix(a.digest, "sha256:"))) != nil {
		t.Error("c-a's own layer is still mounted")
	}
	e.remove(t, "c-b")
	e.assertLayersClosed(t, devs)
}

// One digest is never opened with two roots: a container asking for the
// open layer with another root is refused, and the open one is kept.
func TestMaliciousHostOneDigestTwoRoots(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, nil)
	other := busyboxLayer(t, 2, map[string]treeEntry{"etc/evil": {content: "x"}})
	devs := newFakeLayerDevices(base, other)
	e.layers(devs)
	e.create(t, "good", e.spec(t, "true"), pipes(), layeredReq(base))
	evil := *other
	evil.digest = base.digest // the same digest, another disk with its own valid tree
	_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, e.spec(t, "true")),
		Rootfs: &agentapi.Rootfs{Layers: []*agentapi.Layer{evil.req()}}, Stdio: pipes()})
	assertCode(t, err, codes.FailedPrecondition)
	if err == nil || !strings.Contains(err.Error(), "never opened with two roots") || !strings.Contains(err.Error(), base.digest) {
		t.Errorf("the second root of %s: %v", base.digest, err)
	}
	e.assertRefusedGone(t, "evil")
	if len(devs.opened) != 1 || mountAt(t, filepath.Join(e.svc.layersDir(), strings.TrimPrefix(base.digest, "sha256:"))) == nil {
		t.Errorf("the open layer was disturbed (opened %d)", len(devs.opened))
	}
	e.remove(t, "good")
	e.assertLayersClosed(t, devs)
}

// A mapping still busy when its last container goes (a lazily unmounted
// file system on it) is removed once it is free, not left behind.
func TestLayerReleaseWaitsForBusyMapping(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, nil)
	devs := newFakeLayerDevices(base)
	e.layers(devs)
	e.create(t, "c", e.spec(t, "true"), pipes(), layeredReq(base))
	devs.busy = 5
	e.remove(t, "c")
	e.assertLayersClosed(t, devs)
}
