package e2e

// Layer mode end to end (issue 16): images from a registry run from their
// layers, each a read-only disk of the node's layer cache with a dm-verity
// tree, attached once per pod and checked by the guest against the roots
// the pod's measured policy pins.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/measurements/layer"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/layerimage"
)

// localRegistry is a local docker-registry (Debian's distribution) on
// 127.0.0.1, as the conformance run uses.
type localRegistry struct{ addr string }

func startRegistry(t *testing.T) *localRegistry {
	t.Helper()
	bin, err := exec.LookPath("docker-registry")
	if err != nil {
		containerdtest.SkipOrFail(t, "docker-registry not found: run make deps")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "registry.yml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("version: 0.1\nlog: {level: warn}\nstorage: {filesystem: {rootdirectory: %s}}\nhttp: {addr: %s}\n", filepath.Join(dir, "data"), addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	var logBuf bytes.Buffer
	cmd := exec.Command(bin, "serve", cfg)
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("registry log:\n%s", logBuf.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			return &localRegistry{addr: addr}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the registry did not start on %s: %v\n%s", addr, err, logBuf.String())
		}
	}
}

// publish imports an image tarball into a seed namespace of the daemon,
// pushes it to the registry as path and returns its reference there.
func (r *localRegistry) publish(t *testing.T, e *env, tarball, local, path string) string {
	t.Helper()
	seed := func(args ...string) {
		t.Helper()
		full := append([]string{"--address", e.d.Address, "--namespace", "seed"}, args...)
		if out, err := exec.Command(filepath.Join(e.d.ToolsBin, "ctr"), full...).CombinedOutput(); err != nil {
			t.Fatalf("ctr -n seed %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ref := r.addr + "/" + path
	seed("images", "import", tarball)
	seed("images", "push", "--plain-http", ref, local)
	seed("images", "rm", local)
	return ref
}

// measuredLayers is what `c8s-measure image` prints and a policy pins:
// each layer's diff ID, dm-verity root and data blocks, here computed by
// measurements/layer from the layer tars the image was written from.
func measuredLayers(t *testing.T, img layerimage.Image) []layer.Info {
	t.Helper()
	var out []layer.Info
	for i, l := range img.Layers {
		f, err := os.CreateTemp(t.TempDir(), "layer")
		if err != nil {
			t.Fatal(err)
		}
		info, err := layer.Build(bytes.NewReader(l.Tar), f)
		f.Close()
		if err != nil || info.DiffID != l.DiffID {
			t.Fatalf("layer %d: %+v, %v", i, info, err)
		}
		out = append(out, info)
	}
	return out
}

// pinRule is a [policy] rule pinning the image ref by name and layers;
// its execs may have stdin, which ctr always gives them.
func pinRule(id, ref string, args []string, exec [][]string, layers []layer.Info) string {
	var ls, ex []string
	for _, l := range layers {
		ls = append(ls, fmt.Sprintf("  { digest = %q, verity = %q, blocks = %d },", l.DiffID, l.RootHash, l.DataBlocks))
	}
	for _, e := range exec {
		ex = append(ex, tomlStrings(e...))
	}
	return fmt.Sprintf(`
[policy.containers.%s]
image = %q
args = %s
env = %s
working_dir = "/"
uid = 0
gid = 0
logs = true
exec = [%s]
exec_stdin = true
mounts = [{ destination = "/run", kind = "tmpfs" }]
layers = [
%s
]
`, id, ref, tomlStrings(args...), tomlStrings(imagePath), strings.Join(ex, ", "), strings.Join(ls, "\n"))
}

// cacheState is the node's layer cache as `c8s-launcher layers list`
// reports it.
type cachedLayer struct {
	DiffID     string   `json:"diff_id"`
	Size       int64    `json:"size"`
	Allocated  int64    `json:"allocated"`
	RootHash   string   `json:"root_hash"`
	DataBlocks uint64   `json:"data_blocks"`
	Path       string   `json:"path"`
	Pods       []string `json:"pods"`
	StalePods  []string `json:"stale_pods"`
}

func (e *env) launcher(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(e.root, "bin", "c8s-launcher"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("c8s-launcher %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (e *env) cachedLayers(t *testing.T) map[string]cachedLayer {
	t.Helper()
	var ls []cachedLayer
	out := e.launcher(t, "layers", "list", "--config", e.config, "--json")
	if err := json.Unmarshal([]byte(out), &ls); err != nil {
		t.Fatalf("layers list --json: %v\n%s", err, out)
	}
	m := map[string]cachedLayer{}
	for _, l := range ls {
		m[l.DiffID] = l
	}
	return m
}

// copiedRoots lists the per-container root disks of the copy mode in the
// state dir.
func (e *env) copiedRoots() []string {
	var found []string
	filepath.Walk(e.stateDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".img") {
			found = append(found, p)
		}
		return nil
	})
	return found
}

// TestImageLayers runs a three-layer image pulled from a local registry
// under a measured policy that pins its layers (the sim TEE: the guest's
// code path is snp's and tdx's, and runtime.allow_host_rootfs is not
// set), in four pod VMs:
//
//   - pod l1, two containers of the image: the files of every layer, a
//     whiteout of the top layer applied, each layer attached once;
//   - pod l2 of the same image beside it: one cached copy of each layer
//     on the host, referenced by both pods; pruning removes nothing;
//   - pod l3 claims the pinned image but runs another: refused by the
//     policy, naming the layers;
//   - pod l4 after a byte of the top layer's cached disk was flipped on
//     the host: fails with dm-verity's error naming the layer, and
//     leaves nothing behind.
//
// Then the cache's garbage collection: a layer no image and no pod uses
// goes, one an image still has stays.
func TestImageLayers(t *testing.T) {
	e := setup(t)
	reg := startRegistry(t)
	// The image: busybox (the busybox test image's layer), a layer with
	// files, and one that deletes one of them and adds another.
	layered := filepath.Join(e.d.Dir, "layered.tar")
	img, err := layerimage.WriteFile(layered, layerimage.Options{Name: "docker.io/c8s/layered:test", Layers: [][]layerimage.Entry{
		{{Name: "etc/c8s", Dir: true}, {Name: "etc/c8s/two", Data: []byte("layer two\n")}, {Name: "etc/c8s/gone", Data: []byte("deleted above\n")}},
		{{Name: "etc/c8s/gone", Whiteout: true}, {Name: "etc/c8s/three", Data: []byte("layer three\n")}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(e.d.Dir, "other.tar")
	otherImg, err := layerimage.WriteFile(other, layerimage.Options{Name: "docker.io/c8s/other:test", Layers: [][]layerimage.Entry{
		{{Name: "etc/c8s", Dir: true}, {Name: "etc/c8s/two", Data: []byte("not the pinned layer\n")}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.publish(t, e, layered, "docker.io/c8s/layered:test", "c8s/layered:test")
	otherRef := reg.publish(t, e, other, "docker.io/c8s/other:test", "c8s/other:test")
	for _, r := range []string{ref, otherRef} {
		e.d.Ctr(t, "images", "pull", "--plain-http", r)
	}
	want := measuredLayers(t, img)

	script := "cat /etc/c8s/two /etc/c8s/three; test -e /etc/c8s/gone && echo gone-is-visible; ls /sys/block | grep -c ^sd"
	check := []string{"sh", "-c", script}
	sleep := []string{"sleep", "600"}
	doc := `version = "0.1"
[policy]
` + pinRule("l1", ref, sleep, [][]string{check}, want) +
		pinRule("l1b", ref, sleep, [][]string{check}, want) +
		pinRule("l2", ref, sleep, [][]string{check}, want) +
		pinRule("l3", ref, []string{"cat", "/etc/c8s/two"}, nil, want) +
		pinRule("l4", ref, []string{"cat", "/etc/c8s/three"}, nil, want)
	if _, err := initdata.Parse([]byte(doc)); err != nil {
		t.Fatalf("init data: %v\n%s", err, doc)
	}
	initData := "io.c8s.initdata=" + base64.StdEncoding.EncodeToString([]byte(doc))
	// ctr writes no CRI annotations: the image is passed as CRI passes it.
	claims := func(r string) string { return policy.AnnotationImageName + "=" + r }
	c := ctx(t)
	run := func(args ...string) (string, string, int) {
		return result(t, e.run(c, e.config, args...))
	}

	// Pod l1: two containers of the image.
	if _, stderr, code := run("-d", "--annotation", initData, "--annotation", claims(ref), ref, "l1", "sleep", "600"); code != 0 {
		t.Fatalf("l1: exit %d: %s\n%s", code, stderr, e.d.Log())
	}
	if _, stderr, code := run("-d", "--annotation", initData, "--annotation", claims(ref), "--annotation", "io.kubernetes.cri.sandbox-id=l1", ref, "l1b", "sleep", "600"); code != 0 {
		t.Fatalf("l1b: exit %d: %s\n%s", code, stderr, e.d.Log())
	}
	for _, id := range []string{"l1", "l1b"} {
		stdout, stderr, code := result(t, e.d.CtrCommand(c, "task", "exec", "--exec-id", "check", id, "sh", "-c", script))
		// Three layer disks in the VM for two containers of them.
		if code != 0 || stdout != "layer two\nlayer three\n3\n" {
			t.Fatalf("%s: exec: exit %d, stdout %q, stderr %s", id, code, stdout, stderr)
		}
	}
	if n := len(e.qemus(t)); n != 1 {
		t.Fatalf("QEMU processes of pod l1: %d, want 1", n)
	}

	// Pod l2 beside it: one cached copy of each layer, used by both.
	if _, stderr, code := run("-d", "--annotation", initData, "--annotation", claims(ref), ref, "l2", "sleep", "600"); code != 0 {
		t.Fatalf("l2: exit %d: %s\n%s", code, stderr, e.d.Log())
	}
	cached := e.cachedLayers(t)
	if len(cached) != len(want) {
		t.Fatalf("%d layers cached, want %d: %v", len(cached), len(want), cached)
	}
	var disks, bytesUsed int64
	for _, w := range want {
		l, ok := cached[w.DiffID.String()]
		if !ok || l.RootHash != w.RootHash || l.DataBlocks != w.DataBlocks || l.Size != w.Size {
			t.Fatalf("cached layer %s: %+v, want the root and size measurements/layer computes: %+v", w.DiffID, l, w)
		}
		if len(l.Pods) != 2 {
			t.Errorf("layer %s is used by %v, want pods l1 and l2", w.DiffID, l.Pods)
		}
		disks++
		bytesUsed += l.Allocated
	}
	cacheDisks, _ := filepath.Glob(filepath.Join(e.stateDir, "cache", "layers", "*.disk"))
	if int64(len(cacheDisks)) != disks {
		t.Fatalf("cache files %v, want one per layer", cacheDisks)
	}
	if roots := e.copiedRoots(); len(roots) != 0 {
		t.Fatalf("root disks copied per container: %v", roots)
	}
	t.Logf("2 pods, 3 containers of a %d-layer image: %d layer disks, %d KiB on the host", len(want), disks, bytesUsed>>10)
	// Nothing a running pod uses is pruned, even ignoring the images.
	if out := e.launcher(t, "layers", "prune", "--config", e.config, "--all-unused"); !strings.Contains(out, "pruned 0 layers") {
		t.Fatalf("prune while pods run:\n%s", out)
	}

	// Pod l3 claims the pinned image and runs another.
	_, stderr, code := run("--rm", "--annotation", initData, "--annotation", claims(ref), otherRef, "l3", "cat", "/etc/c8s/two")
	if code == 0 || !strings.Contains(stderr, "policy.containers.l3.layers") || !strings.Contains(stderr, otherImg.Layers[1].DiffID.String()) {
		t.Fatalf("l3 (another image than the policy pins): exit %d, stderr:\n%s", code, stderr)
	}

	for _, id := range []string{"l1b", "l1", "l2"} {
		e.d.Ctr(t, "task", "kill", "-s", "KILL", id)
		waitStopped(t, e, id)
		e.d.Ctr(t, "task", "delete", id)
		e.d.Ctr(t, "container", "delete", id)
	}
	e.assertNothingLeft(t)
	assertNoRefs(t, e)

	// Pod l4 after the host flipped a byte of the top layer's disk.
	top := want[len(want)-1].DiffID
	disk := cached[top.String()].Path
	flipByte(t, disk, 100)
	_, stderr, code = run("--rm", "--annotation", initData, "--annotation", claims(ref), ref, "l4", "cat", "/etc/c8s/three")
	if code == 0 || !strings.Contains(stderr, top.Encoded()) || !strings.Contains(strings.ToLower(stderr), "verity") {
		t.Fatalf("l4 (a flipped byte in layer %s): exit %d, stderr:\n%s", top, code, stderr)
	}
	e.assertNothingLeft(t)
	assertNoRefs(t, e)
	flipByte(t, disk, 100)

	// Garbage collection: every layer stays while its images do; the
	// other image's own layer goes with it; --all-unused takes the rest.
	prune := func(args ...string) string {
		return e.launcher(t, append([]string{"layers", "prune", "--config", e.config, "--containerd-address", e.d.Address}, args...)...)
	}
	if out := prune(); !strings.Contains(out, "pruned 0 layers") {
		t.Fatalf("prune with the images present:\n%s", out)
	}
	e.d.Ctr(t, "images", "rm", ref)
	e.d.Ctr(t, "images", "rm", otherRef)
	out := prune()
	// busybox's layer stays: the busybox test image has it.
	for _, d := range []string{want[1].DiffID.String(), want[2].DiffID.String(), otherImg.Layers[1].DiffID.String()} {
		if !strings.Contains(out, "removed "+d) {
			t.Errorf("prune after removing the images did not remove %s", d)
		}
	}
	if !strings.Contains(out, "pruned 3 layers") || strings.Contains(out, want[0].DiffID.String()) {
		t.Fatalf("prune after removing the images:\n%s", out)
	}
	if out := prune("--all-unused"); !strings.Contains(out, "pruned 1 layers") {
		t.Fatalf("prune --all-unused:\n%s", out)
	}
}

// flipByte inverts one byte of a file.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// assertNoRefs checks that no pod references a cached layer.
func assertNoRefs(t *testing.T, e *env) {
	t.Helper()
	for d, l := range e.cachedLayers(t) {
		if len(l.Pods)+len(l.StalePods) != 0 {
			t.Errorf("layer %s still referenced by %v %v", d, l.Pods, l.StalePods)
		}
	}
	if refs, _ := filepath.Glob(filepath.Join(e.stateDir, "cache", "layers", "refs", "*")); len(refs) != 0 {
		t.Errorf("reference directories left: %v", refs)
	}
}
