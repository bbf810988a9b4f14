package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

const pauseImage = "docker.io/c8s/pause:test"

// pauseCmd is the pause image's command: a stand-in for the real pause
// that, like many real images' entry points, forks and traps SIGTERM, so
// that every CRI test stops a sandbox whose init has a child.
var pauseCmd = []string{"sh", "-c", `trap "exit 0" TERM INT; sleep 2147483647 & wait`}

// TestCRIPodRunsInOneVM drives containerd's CRI the way the kubelet does: a
// pod sandbox with runtime handler "c8s" (registered as the packaged
// drop-in does) and an app container in it. Both run in one pod VM, the app
// container sees the guest kernel, and removing the pod leaks nothing.
func TestCRIPodRunsInOneVM(t *testing.T) {
	e := setupCRI(t)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	podCfg := hostNetworkPod("web")
	podCfg.Annotations = map[string]string{"io.katacontainers.config.hypervisor.default_vcpus": "2"}
	pod := runCRIPod(ctx, t, e, podCfg)
	qemus := e.qemus(t)
	if len(qemus) != 1 {
		t.Fatalf("QEMU processes for the pod: %v, want 1", qemus)
	}

	ctr := pod.start(t, &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: "app"},
		Image:    &cri.ImageSpec{Image: image},
		Command:  []string{"sleep", "600"},
		LogPath:  "app.log",
	})
	if now := e.qemus(t); len(now) != 1 || now[0] != qemus[0] {
		t.Fatalf("QEMU processes with the app container: %v, want just the pod's %v", now, qemus)
	}
	res, err := pod.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: ctr, Cmd: []string{"sh", "-c", "uname -r; nproc"}, Timeout: 60})
	if err != nil {
		t.Fatalf("ExecSync: %v", err)
	}
	out := strings.Fields(string(res.Stdout))
	if res.ExitCode != 0 || len(out) != 2 || out[0] != kernelRelease(t, e.imageDir) {
		t.Fatalf("ExecSync: exit %d stdout %q stderr %q; want the guest kernel %s", res.ExitCode, res.Stdout, res.Stderr, kernelRelease(t, e.imageDir))
	}
	if out[1] != "1" {
		// default_vcpus is not allowlisted in this config: the annotation
		// must be ignored.
		t.Fatalf("nproc = %s: a pod annotation that is not allowlisted changed the VM", out[1])
	}

	pod.remove(t, ctr)
}

// setupCRI starts a private containerd with CRI and the handler "c8s"
// registered as the packaged drop-in does, and imports the test image and
// the pause image (the busybox test image sleeping) into namespace k8s.io.
func setupCRI(t *testing.T) *env {
	t.Helper()
	return setupCRIWith(t, "")
}

// setupCRIWith is setupCRI with more containerd configuration (tables).
func setupCRIWith(t *testing.T, extraConfig string) *env {
	t.Helper()
	return setupCRIOptions(t, extraConfig, false)
}

// setupCRIOptions is setupCRIWith, with containerd's NRI enabled when nri
// is set (its socket: e.d.NRISocket).
func setupCRIOptions(t *testing.T, extraConfig string, nri bool) *env {
	t.Helper()
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, imageDir: filepath.Join(root, "_output", "image")}
	if _, err := os.Stat(filepath.Join(e.imageDir, "initrd.img")); err != nil {
		containerdtest.SkipOrFail(t, "no guest image: run make image")
	}
	// A short directory: the pod VM's sockets live below it.
	cfgDir, err := os.MkdirTemp("", "c8s-cri-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(cfgDir) })
	e.stateDir = filepath.Join(cfgDir, "c8s")
	e.config = filepath.Join(cfgDir, "c8s.toml")
	if err := os.WriteFile(e.config, []byte(fmt.Sprintf("[hypervisor]\nkernel = %q\ninitrd = %q\n[runtime]\nstate_dir = %q\n",
		filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(e.imageDir, "initrd.img"), e.stateDir)), 0o644); err != nil {
		t.Fatal(err)
	}
	e.d = containerdtest.Start(t, containerdtest.Options{
		PathPrefix: []string{filepath.Join(root, "bin")},
		CRI:        true,
		NRI:        nri,
		Namespace:  "k8s.io",
		ExtraConfig: fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s]
  runtime_type = 'io.containerd.c8s.v2'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s.options]
    ConfigPath = %q
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s-sim]
  runtime_type = 'io.containerd.c8s.v2'
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.c8s-sim.options]
    ConfigPath = %q
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q
`, e.config, e.config, pauseImage) + extraConfig,
	})
	for _, img := range []ociimage.Options{{Name: image}, {Name: pauseImage, Cmd: pauseCmd}} {
		tarball := filepath.Join(e.d.Dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.Name)+".tar")
		if err := ociimage.WriteFile(tarball, img); err != nil {
			t.Fatal(err)
		}
		e.d.Ctr(t, "images", "import", tarball)
	}
	waitCRIImages(t, e, image, pauseImage)
	return e
}

// waitCRIImages waits until containerd's CRI knows the images: `ctr images
// import` returns once the image is stored, and CRI's image cache learns
// of it from an event a moment later. A pod run before then would have CRI
// pull the sandbox image from the network.
func waitCRIImages(t *testing.T, e *env, names ...string) {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+e.d.Address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	images := cri.NewImageServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for _, name := range names {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			st, err := images.ImageStatus(ctx, &cri.ImageStatusRequest{Image: &cri.ImageSpec{Image: name}})
			cancel()
			if err == nil && st.GetImage() != nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CRI does not know image %s 30 s after its import: %v", name, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
