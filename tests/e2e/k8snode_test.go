package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

// startK8sNode brings up what the Kubernetes tests share: a private
// containerd with the packaged c8s handlers (installHandlers) and the
// test and pause images imported, the control plane and a kubelet on its
// CRI socket, and the kubelet's Node registered. prefix names the temp
// dir (removed at the end); needs are more files the test needs (a
// missing one skips it, or fails it under C8S_E2E_REQUIRED).
func startK8sNode(t *testing.T, prefix string, needs ...string) (e *env, c *cluster, dir string) {
	t.Helper()
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e = &env{root: root, imageDir: filepath.Join(root, "_output", "image")}
	for _, f := range append([]string{filepath.Join(root, "bin", "containerd-shim-c8s-v2"), filepath.Join(root, "bin", "c8s-launcher"), filepath.Join(e.imageDir, "initrd.img")}, needs...) {
		if _, err := os.Stat(f); err != nil {
			containerdtest.SkipOrFail(t, "%s is missing: run make build image", f)
		}
	}
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e.stateDir = filepath.Join(dir, "c8s")
	dropIn := installHandlers(t, dir, e)
	e.d = containerdtest.Start(t, containerdtest.Options{
		PathPrefix:  []string{filepath.Join(root, "bin")},
		CRI:         true,
		Namespace:   "k8s.io",
		ExtraConfig: dropIn + fmt.Sprintf("\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = %q\n", pauseImage),
	})
	for _, img := range []ociimage.Options{{Name: image}, {Name: pauseImage, Cmd: pauseCmd}} {
		tarball := filepath.Join(e.d.Dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.Name)+".tar")
		if err := ociimage.WriteFile(tarball, img); err != nil {
			t.Fatal(err)
		}
		e.d.Ctr(t, "images", "import", tarball)
	}
	c = startCluster(t, dir, e.d.Address)
	c.wait(t, "the kubelet registers its Node", 2*time.Minute, func(ctx context.Context) (bool, error) {
		_, err := c.cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		return err == nil, err
	}, func() string { return "kubelet log:\n" + c.logTail("kubelet", 40) })
	return e, c, dir
}
