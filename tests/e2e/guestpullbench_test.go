package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/tests/internal/layerimage"
)

// pullBenchMiB, set by hack/bench-pull.sh (C8S_PULL_BENCH_MIB), makes
// TestGuestPull also time the guest pull of an image with a layer of that
// many MiB of incompressible content against the same image's start from
// the node's layer disks, in the same run.
var pullBenchMiB = envIntOr("C8S_PULL_BENCH_MIB", 0)

func envIntOr(name string, def int) int {
	if v := envInt(name, -1); v > 0 {
		return v
	}
	return def
}

// benchGuestPull prints "pull bench:" lines: for one pod each, the time
// from the pod sandbox's start to its container started, (1) the guest
// pulling the image (its pull starts with the pod network), (2) the node
// converting its layers into layer disks (cold cache), (3) the node
// attaching its cached layer disks (warm cache).
func benchGuestPull(t *testing.T, e *env, reg *pullRegistry) {
	img, ref := reg.pushImage(t, e, "pullbench", [][]layerimage.Entry{
		{{Name: "data", Dir: true}, {Name: "data/blob", Random: int64(pullBenchMiB) << 20}},
	})
	var blobs int64
	for _, l := range img.Layers {
		blobs += l.Size
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	check := []string{"stat", "-c", "%s", "/data/blob"}
	// The same bytes fetched by busybox wget in the pod: what the guest's
	// network costs under this accelerator, without digests or unpacking.
	top := img.Layers[len(img.Layers)-1]
	wget := []string{"busybox", "wget", "-q", "-O", "/dev/null", fmt.Sprintf("http://%s:%d/v2/c8s/pullbench/blobs/%s", pullGateway, reg.port, top.Blob)}
	guestDoc := pullSandboxRule() + pullRule("app", "pullbench", reg.guestRef("pullbench", img), check, wget)
	hostDoc := pullSandboxRule() + strings.Replace(pullRule("app", "pullbench", reg.guestRef("pullbench", img), check, wget), "\npull = ", "\n# pull = ", 1)
	hostDoc = strings.Replace(hostDoc, "\npull_plain_http = true", "", 1)
	var raw time.Duration // the top layer's blob by wget in the pod
	timed := func(name, doc string) time.Duration {
		t.Helper()
		p := runPullPod(ctx, t, e, name, doc)
		t0 := time.Now()
		id, progress, err := startRetrying(ctx, p, pullCtrConfig("app", ref))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		d := time.Since(t0)
		res, err := p.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: check, Timeout: 60})
		if err != nil || strings.TrimSpace(string(res.Stdout)) != fmt.Sprint(int64(pullBenchMiB)<<20) {
			t.Fatalf("%s: the image's blob: %v %+v", name, err, res)
		}
		t.Logf("pull bench: %s: %d progress reports, last %q", name, len(progress), last(progress))
		if name == "guestpull" {
			t1 := time.Now()
			if res, err := p.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: wget, Timeout: 600}); err != nil || res.ExitCode != 0 {
				t.Fatalf("wget in the pod: %v %+v", err, res)
			}
			raw = time.Since(t1)
		}
		p.remove(t, id)
		return d
	}
	guest := timed("guestpull", guestDoc)
	cold := timed("hostcold", hostDoc)
	warm := timed("hostwarm", hostDoc)
	gib := float64(blobs) / (1 << 30)
	t.Logf("pull bench: image of %d MiB of layer blobs (%d layers; %d MiB incompressible)", blobs>>20, len(img.Layers), pullBenchMiB)
	t.Logf("pull bench: sandbox ready to container started: guest pull %.1f s (%.1f s per GiB), node's layer disks cold (conversion) %.1f s (%.1f s per GiB), warm %.1f s",
		guest.Seconds(), guest.Seconds()/gib, cold.Seconds(), cold.Seconds()/gib, warm.Seconds())
	t.Logf("pull bench: the %d MiB blob by busybox wget in the pod (network only, no digest, no unpacking): %.1f s (%.1f s per GiB)", top.Size>>20, raw.Seconds(), raw.Seconds()/(float64(top.Size)/(1<<30)))
	t.Logf("pull bench: ratio guest pull/host cold = %.2f, guest pull/host warm = %.2f", guest.Seconds()/cold.Seconds(), guest.Seconds()/warm.Seconds())
}

func last(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[len(s)-1]
}
