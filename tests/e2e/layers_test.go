package e2e

// Layer disks for the malicious-host harness (maliciouslayers_test.go):
// image layers built as the node builds them (measurements/layer: ext4
// from the layer's tar, OCI whiteouts converted to overlayfs's, then its
// dm-verity tree), attached read-only to a pod VM, and named in
// CreateContainer's Rootfs.layers. (guest/agent's tests build layer disks
// with mkfs.ext4 and veritysetup instead: a cross-check of the format
// with the standard tools.)

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/measurements/layer"
	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

// hostLayer is a layer disk the harness built.
type hostLayer struct {
	name string
	// path is the disk; digest, root and blocks what a policy pins of it
	// (diff ID, dm-verity root hash, data blocks).
	path   string
	digest string
	root   string
	blocks uint64
}

// layerFile is one entry of a layer buildLayer writes: a file of content,
// the static busybox, a whiteout of the path below, or an opaque
// directory (hiding what the layers below hold in it).
type layerFile struct {
	content  string
	busybox  bool
	whiteout bool
	opaque   bool
}

// layerRef is a layer attached to a pod VM, as the host names it in
// Rootfs.layers.
type layerRef struct {
	addr   vm.DiskAddress
	digest string
	root   string
	blocks uint64
}

// layerTime is every entry's modification time.
var layerTime = time.Unix(0, 0)

// buildLayer builds layer name as the node does: its tar (with tree, the
// harness's busybox tree first; then files; then a filler file of
// fillerMiB MiB of zeros, /filler/<name>, which sizes the layer) converted
// by measurements/layer.
func (h *hostEnv) buildLayer(t *testing.T, name string, fillerMiB int, tree bool, files map[string]layerFile) *hostLayer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(hd *tar.Header, body []byte) {
		hd.ModTime, hd.Format = layerTime, tar.FormatPAX
		if err := tw.WriteHeader(hd); err != nil {
			t.Fatal(err)
		}
		if len(body) > 0 {
			if _, err := tw.Write(body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if tree {
		err := filepath.WalkDir(h.tree, func(p string, d fs.DirEntry, err error) error {
			if err != nil || p == h.tree {
				return err
			}
			rel, _ := filepath.Rel(h.tree, p)
			info, err := d.Info()
			if err != nil {
				return err
			}
			switch {
			case d.IsDir():
				hdr(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: int64(info.Mode().Perm())}, nil)
			case info.Mode()&fs.ModeSymlink != 0:
				target, err := os.Readlink(p)
				if err != nil {
					return err
				}
				hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: rel, Linkname: target, Mode: 0o777}, nil)
			default:
				data, err := os.ReadFile(p)
				if err != nil {
					return err
				}
				hdr(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: int64(info.Mode().Perm()), Size: int64(len(data))}, data)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		f := files[n]
		switch {
		case f.whiteout:
			hdr(&tar.Header{Typeflag: tar.TypeReg, Name: filepath.Join(filepath.Dir(n), ".wh."+filepath.Base(n)), Mode: 0o644}, nil)
		case f.opaque:
			hdr(&tar.Header{Typeflag: tar.TypeDir, Name: n + "/", Mode: 0o755}, nil)
			hdr(&tar.Header{Typeflag: tar.TypeReg, Name: n + "/.wh..wh..opq", Mode: 0o644}, nil)
		case f.busybox:
			bb, err := os.ReadFile(ociimage.DefaultBusybox)
			if err != nil {
				t.Fatal(err)
			}
			hdr(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o755, Size: int64(len(bb))}, bb)
		default:
			hdr(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(f.content))}, []byte(f.content))
		}
	}
	if fillerMiB > 0 {
		hdr(&tar.Header{Typeflag: tar.TypeReg, Name: "filler/" + name, Mode: 0o644, Size: int64(fillerMiB) << 20}, make([]byte, fillerMiB<<20))
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(h.root, "layers")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".disk")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	info, err := layer.Build(&buf, out)
	if err != nil {
		t.Fatalf("layer %s: %v", name, err)
	}
	return &hostLayer{name: name, path: path, digest: info.DiffID.String(), root: info.RootHash, blocks: info.DataBlocks}
}

// flippedCopy is a copy of l's disk with one byte flipped in the first
// data block of the file at path in the layer (debugfs finds the block).
func (h *hostEnv) flippedCopy(t *testing.T, l *hostLayer, path string) *hostLayer {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "bmap "+path+" 0", l.path).Output()
	if err != nil {
		t.Fatalf("debugfs bmap %s in %s: %v", path, l.path, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) == 0 {
		t.Fatalf("debugfs bmap %s: no block", path)
	}
	block, err := strconv.ParseInt(fields[len(fields)-1], 10, 64)
	if err != nil || block == 0 || uint64(block) >= l.blocks {
		t.Fatalf("debugfs bmap %s: %q", path, out)
	}
	data, err := os.ReadFile(l.path)
	if err != nil {
		t.Fatal(err)
	}
	data[block*layer.BlockSize+100] ^= 0xff
	c := *l
	c.name = l.name + "-flipped"
	c.path = filepath.Join(filepath.Dir(l.path), c.name+".disk")
	if err := os.WriteFile(c.path, data, 0o444); err != nil {
		t.Fatal(err)
	}
	return &c
}

// layerRule is the layers key of a [policy] rule pinning layers, bottom
// first.
func layerRule(layers ...*hostLayer) string {
	var b strings.Builder
	b.WriteString("layers = [\n")
	for _, l := range layers {
		fmt.Fprintf(&b, "  { digest = %q, verity = %q, blocks = %d },\n", l.digest, l.root, l.blocks)
	}
	b.WriteString("]\n")
	return b.String()
}

// attachLayer hot-plugs l's disk read-only into the pod VM (once: a disk
// attached already keeps its address).
func (p *hostPod) attachLayer(t *testing.T, ctx context.Context, l *hostLayer) layerRef {
	t.Helper()
	addr, err := p.sb.AttachDisk(ctx, vm.Disk{ID: "layer-" + l.name, Path: l.path, ReadOnly: true})
	if err != nil {
		t.Fatalf("attach layer %s: %v", l.name, err)
	}
	return layerRef{addr: addr, digest: l.digest, root: l.root, blocks: l.blocks}
}

// layeredRequest is a CreateContainerRequest for container id of pod
// sandboxID with spec s, its root stacked from layers (bottom first).
func layeredRequest(t *testing.T, id, sandboxID string, s *specs.Spec, layers ...layerRef) *agent.CreateContainerRequest {
	t.Helper()
	raw, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var ls []*agent.Layer
	for _, l := range layers {
		ls = append(ls, &agent.Layer{
			Scsi:       &agent.ScsiDisk{Target: uint32(l.addr.Target), Lun: uint32(l.addr.LUN)},
			Digest:     l.digest,
			RootHash:   l.root,
			DataBlocks: l.blocks,
		})
	}
	return &agent.CreateContainerRequest{
		ContainerId: id,
		SandboxId:   sandboxID,
		Spec:        raw,
		Rootfs:      &agent.Rootfs{Layers: ls, Fstype: "ext4"},
		Stdio:       &agent.Stdio{Stdout: true, Stderr: true},
	}
}
