package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// layeredRule is a [policy] rule for containers named "layered" whose
// image is ls, bottom first.
func layeredRule(ls ...*layerDisk) string {
	var b strings.Builder
	b.WriteString(shRule("layered", ""))
	for _, l := range ls {
		fmt.Fprintf(&b, "[[policy.containers.layered.layers]]\ndigest = %q\nverity = %q\nblocks = %d\n", l.digest, l.root, l.blocks)
	}
	return b.String()
}

// createLayered asks for container id named name of layers ls, as mod
// changes the request, and returns the agent's answer as the host sees it.
func (e *env) createLayered(t *testing.T, id, name, script string, mod func(*agentapi.CreateContainerRequest), ls ...*layerDisk) error {
	t.Helper()
	req := &agentapi.CreateContainerRequest{ContainerId: id, Spec: mustJSON(t, e.podSpec(t, name, script)), Stdio: pipes()}
	layeredReq(ls...)(req)
	if mod != nil {
		mod(req)
	}
	_, err := e.agent.CreateContainer(ctxT(t), req)
	return errgrpc.ToNative(err)
}

// Under a rule that pins the image's layers, the pinned image runs; a
// layer not in the policy, a layer whose root the host changed, and a
// root disk the host built are refused by name, and nothing of them is
// opened.
func TestMaliciousHostLayersUnderPolicy(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, nil)
	app := smallLayer(t, "app", 2, map[string]treeEntry{"etc/app": {content: "pinned\n"}})
	evil := smallLayer(t, "evil", 3, map[string]treeEntry{"etc/app": {content: "the host's\n"}})
	devs := newFakeLayerDevices(base, app, evil)
	e.layers(devs)
	e.enforce(t, policyDoc(t, layeredRule(base, app)))

	for name, tc := range map[string]struct {
		mod   func(*agentapi.CreateContainerRequest)
		layer []*layerDisk
		names []string
	}{
		"LayerNotInPolicy": {nil, []*layerDisk{base, app, evil}, []string{"layers[2].digest", `"` + evil.digest + `"`, "policy.containers.layered.layers"}},
		"LayerSwapped":     {nil, []*layerDisk{base, evil}, []string{"layers[1].digest", `"` + evil.digest + `"`, `(allowed: "` + app.digest + `")`}},
		"LayerRootFromHost": {func(r *agentapi.CreateContainerRequest) { r.Rootfs.Layers[1].RootHash = evil.root }, []*layerDisk{base, app},
			[]string{"layers[1].root_hash", evil.root, "policy.containers.layered.layers[1].verity", app.root}},
		"HostRootfsUnderPinnedLayers": {func(r *agentapi.CreateContainerRequest) { r.Rootfs = rootfsReq() }, nil,
			[]string{"rootfs.source", "policy.containers.layered.layers", "image substitution"}},
	} {
		t.Run(name, func(t *testing.T) {
			err := e.createLayered(t, "evil", "layered", "cat /etc/app", tc.mod, tc.layer...)
			if !errdefs.IsPermissionDenied(err) {
				t.Fatalf("CreateContainer = %v, want permission denied", err)
			}
			for _, n := range tc.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("the denial does not name %q: %v", n, err)
				}
			}
			e.assertRefusedGone(t, "evil")
			e.assertLayersClosed(t, devs)
		})
	}

	// The control: the image the policy pins runs.
	if err := e.createLayered(t, "ok", "layered", "cat /etc/app", nil, base, app); err != nil {
		t.Fatal(err)
	}
	e.start(t, "ok")
	e.wait(t, "ok", "")
	if out := e.readAll(t, "ok", "", false); out != "pinned\n" {
		t.Errorf("the pinned image printed %q", out)
	}
	e.remove(t, "ok")
	e.assertLayersClosed(t, devs)
}

// In audit mode the host's layers are let through, but a layer the rule
// pins is still opened with the rule's root, never the host's: here the
// host's root is another disk's, and the layer opens and verifies with
// the policy's.
func TestPinnedLayerOpensWithThePolicysRoot(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, nil)
	other := smallLayer(t, "other", 2, nil)
	devs := newFakeLayerDevices(base, other)
	e.layers(devs)
	e.enforce(t, policyDoc(t, "audit = true\n"+layeredRule(base)))
	err := e.createLayered(t, "c", "layered", "true", func(r *agentapi.CreateContainerRequest) {
		r.Rootfs.Layers[0].RootHash, r.Rootfs.Layers[0].DataBlocks = other.root, other.blocks
	}, base)
	if err != nil {
		t.Fatalf("audit mode refused: %v", err)
	}
	if len(devs.opened) != 1 || devs.opened[0].RootHash != base.root || devs.opened[0].DataBlocks != base.blocks || devs.opened[0].HashStartBlock != base.blocks {
		t.Fatalf("the layer was opened with %+v, want the policy's root %s and %d blocks", devs.opened, base.root, base.blocks)
	}
	e.remove(t, "c")
	e.assertLayersClosed(t, devs)
}

// Without a rule that pins them, layers open with the host's roots: a
// layer whose disk does not verify against its root fails the create, by
// the layer's digest, and nothing is left.
func TestMaliciousHostLayerDoesNotVerify(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, nil)
	other := smallLayer(t, "other", 2, map[string]treeEntry{"etc/x": {content: "x"}})
	devs := newFakeLayerDevices(base, other)
	e.layers(devs)
	// The host names base's digest and root, and attaches other's disk,
	// with its own valid tree, at base's address.
	devs.disks[1] = other.dev
	_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "c", Spec: mustJSON(t, e.spec(t, "true")), Stdio: pipes(),
		Rootfs: &agentapi.Rootfs{Layers: []*agentapi.Layer{base.req()}}})
	assertCode(t, err, codes.DataLoss)
	if err == nil || !strings.Contains(err.Error(), "layer "+base.digest+" failed dm-verity verification") {
		t.Fatalf("CreateContainer = %v, want a failure naming layer %s", err, base.digest)
	}
	e.assertGone(t, "c")
	e.assertLayersClosed(t, devs)
}

// A block of a layer that fails to verify when the container's process
// reads it (its program, at exec) fails the start, naming the layer; the
// layer then refuses every container of the pod that uses it, and exec.
func TestMaliciousHostLayerCorruptedAtStart(t *testing.T) {
	e := newEnv(t)
	e.startedAsTEE(t, "sim")
	base := busyboxLayer(t, 1, nil)
	poisoned := smallLayer(t, "poisoned", 2, map[string]treeEntry{"bin/app": {content: "\x7fELF corrupted", mode: 0o755}})
	devs := newFakeLayerDevices(base, poisoned)
	e.layers(devs)
	// A sibling container using the base layer, running.
	e.create(t, "sibling", e.spec(t, "sleep", "1000"), pipes(), layeredReq(base))
	e.start(t, "sibling")

	// dm-verity's view: the poisoned layer's block fails once the
	// container's process reads it, which only its exec does.
	var appPid int
	poisonedDM := "c8s-layer-" + strings.TrimPrefix(poisoned.digest, "sha256:")
	devs.corruptWhen = func(name string) bool {
		return name == poisonedDM && appPid != 0 && !processAlive(appPid)
	}
	appPid = int(e.create(t, "app", e.spec(t, "/bin/app"), pipes(), layeredReq(base, poisoned)))
	_, err := e.agent.StartContainer(ctxT(t), &agentapi.StartContainerRequest{ContainerId: "app"})
	assertCode(t, err, codes.DataLoss)
	if err == nil || !strings.Contains(err.Error(), "layer "+poisoned.digest+" failed dm-verity verification") || strings.Contains(err.Error(), base.digest) {
		t.Fatalf("StartContainer = %v, want a failure naming layer %s alone", err, poisoned.digest)
	}
	// A restart of the container, or another of the layer, is refused.
	err = e.createLayered(t, "app-2", "app", "true", nil, base, poisoned)
	if !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), poisoned.digest) {
		t.Errorf("a new container of the corrupted layer: %v", err)
	}
	e.assertRefusedGone(t, "app-2")
	// The sibling does not use it, and keeps running and exec'ing.
	if _, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "sibling", ExecId: "x", Process: e.process("true"), Stdio: pipes()}); err != nil {
		t.Errorf("exec in the sibling: %v", err)
	}
	e.remove(t, "app")
	e.remove(t, "sibling")
	e.assertLayersClosed(t, devs)
}

// processAlive reports whether pid is a process that has not exited.
func processAlive(pid int) bool {
	b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "stat"))
	if err != nil {
		return false
	}
	// pid (comm) STATE ...
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z" && f[0] != "X"
}

// Malformed layers are refused before anything of them is used: no
// policy decides on them, nothing is mounted, and no digest reaches a
// path or a mount option unchecked.
func TestMaliciousHostMalformedLayers(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, nil)
	devs := newFakeLayerDevices(base)
	e.layers(devs)
	good := base.req()
	many := make([]*agentapi.Layer, MaxLayers+1)
	for i := range many {
		many[i] = good
	}
	for name, tc := range map[string]struct {
		rootfs *agentapi.Rootfs
		want   string
	}{
		"digest with a path":     {&agentapi.Rootfs{Layers: []*agentapi.Layer{{Scsi: good.Scsi, Digest: "sha256:../../secrets", RootHash: good.RootHash, DataBlocks: 1}}}, "is not a diff ID"},
		"digest with options":    {&agentapi.Rootfs{Layers: []*agentapi.Layer{{Scsi: good.Scsi, Digest: good.Digest[:60] + ",upperdir=/", RootHash: good.RootHash, DataBlocks: 1}}}, "is not a diff ID"},
		"upper-case digest":      {&agentapi.Rootfs{Layers: []*agentapi.Layer{{Scsi: good.Scsi, Digest: strings.ToUpper(good.Digest), RootHash: good.RootHash, DataBlocks: 1}}}, "is not a diff ID"},
		"sha512 digest":          {&agentapi.Rootfs{Layers: []*agentapi.Layer{{Scsi: good.Scsi, Digest: "sha512:" + good.Digest[7:], RootHash: good.RootHash, DataBlocks: 1}}}, "is not a diff ID"},
		"root hash not hex":      {&agentapi.Rootfs{Layers: []*agentapi.Layer{{Scsi: good.Scsi, Digest: good.Digest, RootHash: "- 0 0 sha256", DataBlocks: 1}}}, "root_hash"},
		"no data blocks":         {&agentapi.Rootfs{Layers: []*agentapi.Layer{{Scsi: good.Scsi, Digest: good.Digest, RootHash: good.RootHash}}}, "data_blocks 0"},
		"no disk":                {&agentapi.Rootfs{Layers: []*agentapi.Layer{{Digest: good.Digest, RootHash: good.RootHash, DataBlocks: 1}}}, "names no disk"},
		"disk and layers":        {&agentapi.Rootfs{Source: rootfsReq().Source, Fstype: "ext4", Layers: []*agentapi.Layer{good}}, "both a disk and layers"},
		"another file system":    {&agentapi.Rootfs{Fstype: "erofs", Layers: []*agentapi.Layer{good}}, `file system type "erofs"`},
		"a data option":          {&agentapi.Rootfs{Options: []string{"errors=continue"}, Layers: []*agentapi.Layer{good}}, `option "errors=continue"`},
		"too many layers":        {&agentapi.Rootfs{Layers: many}, fmt.Sprintf("%d layers: at most %d", MaxLayers+1, MaxLayers)},
		"neither disk nor layer": {&agentapi.Rootfs{Fstype: "ext4"}, "neither a disk nor layers"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, e.spec(t, "true")), Rootfs: tc.rootfs, Stdio: pipes()})
			assertCode(t, err, codes.InvalidArgument)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CreateContainer = %v, want it to say %q", err, tc.want)
			}
			e.assertGone(t, "evil")
			if len(devs.opened) != 0 {
				t.Fatalf("a malformed request opened %d layers", len(devs.opened))
			}
		})
	}
	// Many layers within the limit: one image may name a layer twice
	// (identical layers), held and stacked once.
	e.create(t, "twice", e.spec(t, "true"), pipes(), layeredReq(base, base))
	if len(devs.opened) != 1 {
		t.Errorf("a layer named twice was opened %d times", len(devs.opened))
	}
	e.remove(t, "twice")
	e.assertLayersClosed(t, devs)
}

// TestMaliciousHostCorruptsLayerAfterStart: the host changes a block of a
// running container's layer that the container reads only later (a
// config, a marker file): dm-verity fails that read with EIO, which the
// program may take for a missing file. The agent kills the container as
// soon as it sees the corruption, and refuses new containers of it.
func TestMaliciousHostCorruptsLayerAfterStart(t *testing.T) {
	old := layerWatchInterval
	layerWatchInterval = 20 * time.Millisecond
	t.Cleanup(func() { layerWatchInterval = old })
	e := newEnv(t)
	e.startedAsTEE(t, "sim")
	base := busyboxLayer(t, 1, nil)
	devs := newFakeLayerDevices(base)
	e.layers(devs)
	e.create(t, "app", e.spec(t, "sleep", "60"), pipes(), layeredReq(base))
	e.start(t, "app")
	devs.mu.Lock()
	devs.corruptWhen = func(string) bool { return true }
	devs.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctxT(t), 5*time.Second)
	defer cancel()
	w, err := e.agent.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "app"})
	if err != nil {
		t.Fatalf("the container of a corrupted layer still runs: %v", err)
	}
	if w.GetExitStatus() != 128+uint32(unix.SIGKILL) {
		t.Errorf("exit status %d, want %d (killed)", w.GetExitStatus(), 128+uint32(unix.SIGKILL))
	}
	// A new container of the layer is refused.
	if err := e.createLayered(t, "app-2", "app", "true", nil, base); !errdefs.IsDataLoss(err) || !strings.Contains(err.Error(), base.digest) {
		t.Errorf("a new container of the corrupted layer: %v", err)
	}
	e.assertRefusedGone(t, "app-2")
	e.remove(t, "app")
	e.assertLayersClosed(t, devs)
}

// A layer whose dm-verity status cannot be read is not taken as sound:
// the start of its container fails, naming the layer.
func TestLayerStatusUnreadableFailsClosed(t *testing.T) {
	e := newEnv(t)
	base := busyboxLayer(t, 1, nil)
	devs := newFakeLayerDevices(base)
	e.layers(devs)
	e.create(t, "app", e.spec(t, "true"), pipes(), layeredReq(base))
	devs.mu.Lock()
	devs.statusErr = unix.EIO
	devs.mu.Unlock()
	_, err := e.agent.StartContainer(ctxT(t), &agentapi.StartContainerRequest{ContainerId: "app"})
	if err == nil || !strings.Contains(err.Error(), "read its dm-verity status") || !strings.Contains(err.Error(), base.digest) {
		t.Errorf("StartContainer with an unreadable layer status = %v, want a failure naming the layer", err)
	}
	devs.mu.Lock()
	devs.statusErr = nil
	devs.mu.Unlock()
	e.remove(t, "app")
	e.assertLayersClosed(t, devs)
}
