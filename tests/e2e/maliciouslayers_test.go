package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/stage1"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/shim/rootfs"
)

// layeredArgs is what container "layered" runs: a program of its top
// layer (busybox, under a path of its own) printing a file of that layer.
var layeredArgs = []string{"/opt/bin/busybox", "cat", "/etc/app"}

// layeredMessage is /etc/app of the layer the policy pins.
const layeredMessage = "from the pinned app layer\n"

// policyPodLayers are the layers of the policy pod: the image of
// container "layered" (base, app), and a valid layer of the host's own
// (evil) of the same size as app.
type policyPodLayers struct {
	base, app, evil *hostLayer
}

func (h *hostEnv) policyPodLayers(t *testing.T) policyPodLayers {
	t.Helper()
	return policyPodLayers{
		base: h.buildLayer(t, "base", 0, true, nil),
		app: h.buildLayer(t, "app", 0, false, map[string]layerFile{
			"opt/bin/busybox": {busybox: true}, "etc/app": {content: layeredMessage},
		}),
		// A MiB of filler more than app: its disk holds app's data
		// blocks and tree, so that it maps with app's root and then fails
		// to verify.
		evil: h.buildLayer(t, "evil", 1, false, map[string]layerFile{
			"opt/bin/busybox": {busybox: true}, "etc/app": {content: "from the host's layer\n"},
		}),
	}
}

// layeredRuleDoc is the rule of container "layered": its image pinned
// by the layers base and app.
func layeredRuleDoc(base, app *hostLayer) string {
	return `
[policy.containers.layered]
image = "` + image + `"
args = ` + tomlStrings(layeredArgs...) + `
env = ` + tomlStrings(imagePath) + `
working_dir = "/"
uid = 0
gid = 0
logs = true
` + layerRule(base, app)
}

// testPinnedLayers plays the host against container "layered" of the
// policy pod, whose rule pins its image's layers: each way to give it
// other files is refused by name, and the image the policy pins runs.
// The guest opens the layers through dm-verity with the policy's roots.
func testPinnedLayers(t *testing.T, c context.Context, h *hostEnv, p *hostPod, ls policyPodLayers) {
	ag := p.sb.Agent
	base, app, evil := p.attachLayer(t, c, ls.base), p.attachLayer(t, c, ls.app), p.attachLayer(t, c, ls.evil)
	spec := func() *specs.Spec { return containerSpec("layered", true, layeredArgs...) }
	create := func(id string, layers ...layerRef) error {
		_, err := ag.CreateContainer(c, layeredRequest(t, id, "sandbox", spec(), layers...))
		return err
	}
	// attack asks for container id of layers, which the guest must refuse
	// as want, naming names.
	attack := func(t *testing.T, id string, want error, layers []layerRef, names ...string) {
		t.Helper()
		err := create(id, layers...)
		if err == nil {
			if _, rerr := ag.RemoveContainer(c, &agent.RemoveContainerRequest{ContainerId: id}); rerr != nil {
				t.Errorf("remove container %s, which the guest should have refused: %v", id, errgrpc.ToNative(rerr))
			}
		}
		refused(t, err, want, names...)
	}
	rule := "policy.containers.layered.layers"

	t.Run("LayerNotInPolicy", func(t *testing.T) {
		// A layer of the host's on top: its files over the image's.
		attack(t, "attack-extra-layer", errdefs.ErrPermissionDenied, []layerRef{base, app, evil},
			`layers[2].digest "`+ls.evil.digest+`"`, rule, "(allowed: 2 layers)")
	})

	t.Run("LayerRootFromHost", func(t *testing.T) {
		// The pinned digest, with the root of the disk the host attached
		// (a valid tree of its own).
		swapped := layerRef{addr: evil.addr, digest: ls.app.digest, root: ls.evil.root, blocks: ls.evil.blocks}
		attack(t, "attack-host-root", errdefs.ErrPermissionDenied, []layerRef{base, swapped},
			`layers[1].root_hash "`+ls.evil.root+`"`, rule+"[1].verity", `"`+ls.app.root+`"`)
	})

	t.Run("HostRootfsUnderPinnedLayers", func(t *testing.T) {
		// A root disk the host built: any file system of its choosing.
		p.createRefused(t, c, "attack-host-rootfs", "sandbox", spec(), "app", errdefs.ErrPermissionDenied,
			"rootfs.source", rule, "image substitution")
	})

	t.Run("LayerSwappedWithValidTree", func(t *testing.T) {
		// Another valid layer disk, with its own valid hash tree, under
		// the pinned digest and root: it passes the policy, and does not
		// open with the pinned root.
		swapped := layerRef{addr: evil.addr, digest: ls.app.digest, root: ls.app.root, blocks: ls.app.blocks}
		attack(t, "attack-swapped-layer", errdefs.ErrDataLoss, []layerRef{base, swapped},
			"layer "+ls.app.digest+" failed dm-verity verification")
	})

	t.Run("LayerBlockFlipped", func(t *testing.T) {
		// The pinned layer's cached disk with one byte flipped in its
		// program's first block: the create reads none of it, the start
		// execs it, and fails naming the layer.
		flipped := p.attachLayer(t, c, h.flippedCopy(t, ls.app, "/opt/bin/busybox"))
		ref := layerRef{addr: flipped.addr, digest: ls.app.digest, root: ls.app.root, blocks: ls.app.blocks}
		if err := create("attack-flipped", base, ref); err != nil {
			t.Fatalf("create: %v (want it created: nothing of the flipped block is read yet)", errgrpc.ToNative(err))
		}
		defer func() {
			if _, err := ag.RemoveContainer(c, &agent.RemoveContainerRequest{ContainerId: "attack-flipped"}); err != nil {
				t.Errorf("remove: %v", errgrpc.ToNative(err))
			}
		}()
		_, err := ag.StartContainer(c, &agent.StartContainerRequest{ContainerId: "attack-flipped"})
		refused(t, err, errdefs.ErrDataLoss, "layer "+ls.app.digest+" failed dm-verity verification", `container "attack-flipped" failed to start`)
		// The kubelet's restart: refused, naming the layer.
		attack(t, "attack-flipped-restart", errdefs.ErrDataLoss, []layerRef{base, ref}, "layer "+ls.app.digest+" failed dm-verity verification")
	})

	t.Run("PinnedLayersRun", func(t *testing.T) {
		// The control, after the attacks (the corrupted layer was closed
		// with its last container): the pinned image runs, from the
		// pinned layers.
		t0 := time.Now()
		if err := create("layered", base, app); err != nil {
			t.Fatalf("create the pinned image: %v", errgrpc.ToNative(err))
		}
		created := time.Since(t0)
		if _, err := ag.StartContainer(c, &agent.StartContainerRequest{ContainerId: "layered"}); err != nil {
			t.Fatalf("start: %v", errgrpc.ToNative(err))
		}
		out, err := readOutput(c, p.sb.IO, "layered", "", layeredMessage)
		if err != nil || out != layeredMessage {
			t.Fatalf("the pinned image printed %q (%v), want %q", out, err, layeredMessage)
		}
		if w, err := ag.WaitProcess(c, &agent.ProcessRequest{ContainerId: "layered"}); err != nil || w.ExitStatus != 0 {
			t.Fatalf("the pinned image: %v, %v", w, errgrpc.ToNative(err))
		}
		t.Logf("pinned 2-layer image: CreateContainer %v", created.Round(time.Millisecond))
		if _, err := ag.RemoveContainer(c, &agent.RemoveContainerRequest{ContainerId: "layered"}); err != nil {
			t.Fatal(errgrpc.ToNative(err))
		}
	})
}

// testLayeredImage runs, in a pod without a [policy] (nothing pins its
// layers: the guest opens them with the host's roots), a three-layer image
// whose upper layers delete a file (whiteout) and hide a directory's
// content (opaque), as two containers that share its layers: each layer
// is mounted once in the guest. It logs what a container costs from
// layers against one from a disk the host builds (the shim's way before
// layers).
func testLayeredImage(t *testing.T, c context.Context, h *hostEnv, p *hostPod) {
	ag := p.sb.Agent
	base := h.buildLayer(t, "ap-base", 0, true, map[string]layerFile{"etc/kept": {content: "base\n"}, "data/old": {content: "old\n"}})
	mid := h.buildLayer(t, "ap-mid", 0, false, map[string]layerFile{"etc/hostname": {whiteout: true}, "data": {opaque: true}, "data/new": {content: "mid\n"}})
	top := h.buildLayer(t, "ap-top", 0, false, map[string]layerFile{"etc/top": {content: "top\n"}})
	layers := []layerRef{p.attachLayer(t, c, base), p.attachLayer(t, c, mid), p.attachLayer(t, c, top)}

	run := func(id string, s *specs.Spec) {
		t.Helper()
		if _, err := ag.CreateContainer(c, layeredRequest(t, id, "sandbox", s, layers...)); err != nil {
			t.Fatalf("create %s: %v", id, errgrpc.ToNative(err))
		}
		if _, err := ag.StartContainer(c, &agent.StartContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("start %s: %v", id, errgrpc.ToNative(err))
		}
	}
	remove := func(id string) {
		t.Helper()
		if _, err := ag.RemoveContainer(c, &agent.RemoveContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("remove %s: %v", id, errgrpc.ToNative(err))
		}
	}
	run("layered-a", containerSpec("layered-a", true, "sleep", "3600"))
	s := containerSpec("layered-b", true, "sh", "-c", `ls /etc /data; grep -c " /run/c8s/layers/" /guest-mountinfo`)
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/guest-mountinfo", Type: "bind", Source: "/proc/1/mountinfo", Options: []string{"rbind", "ro"}})
	run("layered-b", s)
	// Three layers, each mounted once for both containers.
	want := "/data:\nnew\n\n/etc:\nkept\ntop\n3\n"
	out, err := readOutput(c, p.sb.IO, "layered-b", "", want)
	if err != nil || out != want {
		t.Fatalf("layered-b printed %q (%v), want %q: the whiteout, the opaque directory, and one mount per layer", out, err, want)
	}
	remove("layered-b")
	remove("layered-a")

	// What a container's create and start cost (median of 3): from the
	// three layers, opened for it or open already for another container,
	// and from the same tree as a disk the host builds and attaches for
	// it (shim/rootfs, the way before layers).
	const rounds = 3
	var first, shared, disk []time.Duration
	timed := func(f func()) time.Duration {
		t0 := time.Now()
		f()
		return time.Since(t0)
	}
	for i := range rounds {
		id := fmt.Sprintf("t-first-%d", i)
		first = append(first, timed(func() { run(id, containerSpec(id, true, "sleep", "3600")) }))
		remove(id)
	}
	run("t-holder", containerSpec("t-holder", true, "sleep", "3600"))
	for i := range rounds {
		id := fmt.Sprintf("t-shared-%d", i)
		shared = append(shared, timed(func() { run(id, containerSpec(id, true, "sleep", "3600")) }))
		remove(id)
	}
	remove("t-holder")
	for i := range rounds {
		id := fmt.Sprintf("t-disk-%d", i)
		disk = append(disk, timed(func() {
			path := filepath.Join(h.diskDir, "agent-policy-pod", id+".img")
			if err := rootfs.Build(c, nil, h.tree, path, rootfs.Options{}); err != nil {
				t.Fatal(err)
			}
			addr, err := p.sb.AttachDisk(c, vm.Disk{ID: id, Path: path})
			if err != nil {
				t.Fatal(err)
			}
			p.disks[id] = addr
			p.run(t, c, id, "sandbox", containerSpec(id, true, "sleep", "3600"), id)
		}))
		remove(id)
		if err := p.sb.DetachDisk(c, id); err != nil {
			t.Fatal(err)
		}
	}
	mf, ms, md := median(first), median(shared), median(disk)
	t.Logf("create+start, median of %d: 3 layers opened %v, 3 layers open already %v, host-built disk (build, attach) %v: %.2f× and %.2f× of the disk's",
		rounds, mf.Round(time.Millisecond), ms.Round(time.Millisecond), md.Round(time.Millisecond), float64(mf)/float64(md), float64(ms)/float64(md))

	// Nothing of the layers is left in the guest once no container uses
	// them: no mount, no device-mapper device but the guest's own root
	// (seen by a container of a host-built disk, with the guest's mount
	// table and block devices).
	check := containerSpec("layers-gone", true, "sh", "-c", `cat /guest-block/dm-*/dm/name; grep -c " /run/c8s/layers/" /guest-mountinfo`)
	check.Mounts = append(check.Mounts,
		specs.Mount{Destination: "/guest-mountinfo", Type: "bind", Source: "/proc/1/mountinfo", Options: []string{"rbind", "ro"}},
		specs.Mount{Destination: "/guest-block", Type: "bind", Source: "/sys/devices/virtual/block", Options: []string{"rbind", "ro"}})
	path := filepath.Join(h.diskDir, "agent-policy-pod", "layers-gone.img")
	if err := rootfs.Build(c, nil, h.tree, path, rootfs.Options{}); err != nil {
		t.Fatal(err)
	}
	addr, err := p.sb.AttachDisk(c, vm.Disk{ID: "layers-gone", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	p.disks["layers-gone"] = addr
	p.run(t, c, "layers-gone", "sandbox", check, "layers-gone")
	if out, err := readOutput(c, p.sb.IO, "layers-gone", "", "\n0\n"); err != nil || out != stage1.MapperName+"\n0\n" {
		t.Errorf("with no container of the layers left, the guest shows %q (%v): want the device-mapper device of its root (%s) alone, and no layer mounted", out, err, stage1.MapperName)
	}
	remove("layers-gone")
}

// median is the median of ds.
func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
