package images

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/stage1"
	"github.com/c8s-dev/c8s/internal/newc"
	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/measurements/sim"
	"github.com/c8s-dev/c8s/measurements/snp"
)

// ramArchive splits a sealed initrd.img into its zstd archive of the first
// stage's modules and the uncompressed archive of what runs from memory
// (the agent as /init, the runtime tree) that follows it, 4-byte aligned
// (images/build.sh). It returns the offset of the second archive and its
// entries.
func ramArchive(t *testing.T, initrd []byte) (int, []newc.Entry) {
	t.Helper()
	if !bytes.HasPrefix(initrd, []byte{0x28, 0xb5, 0x2f, 0xfd}) {
		t.Fatalf("initrd.img does not start with a zstd frame")
	}
	for off := 4; off+6 <= len(initrd); off += 4 {
		if string(initrd[off:off+6]) != "070701" {
			continue
		}
		entries, err := newc.ReadAll(bytes.NewReader(initrd[off:]))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.Name == strings.TrimPrefix(stage1.Init, "/") {
				return off, entries
			}
		}
	}
	t.Fatalf("initrd.img has no uncompressed archive with %s after its first archive", stage1.Init)
	return 0, nil
}

// isProgram reports whether e is a regular file the kernel could execute:
// executable by someone, or an ELF executable or shared object whatever its
// mode (the modules are ELF too, but relocatable).
func isProgram(e newc.Entry) bool {
	const typeBits = 0o170000
	if e.Mode&typeBits != newc.ModeRegular {
		return false
	}
	const etExec, etDyn = 2, 3
	elf := len(e.Body) >= 18 && bytes.HasPrefix(e.Body, []byte("\x7fELF")) && e.Body[5] == 1 // little-endian
	return e.Mode&0o111 != 0 || elf && (e.Body[16] == etExec || e.Body[16] == etDyn)
}

// firstArchive decompresses the zstd archive at the start of a sealed
// initrd.img (zstd, make deps) and returns its entries. zst may end in the
// up to 3 zero bytes that align the next archive, which zstd(1) refuses.
func firstArchive(t *testing.T, zst []byte) []newc.Entry {
	t.Helper()
	var (
		out []byte
		err error
	)
	for pad := 0; pad <= 3 && pad < len(zst); pad++ {
		if pad > 0 && zst[len(zst)-pad] != 0 {
			break
		}
		cmd := exec.Command("zstd", "-q", "-dc")
		cmd.Stdin = bytes.NewReader(zst[:len(zst)-pad])
		if out, err = cmd.Output(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("zstd -d of initrd.img's first archive: %v (run make deps)", err)
	}
	entries, err := newc.ReadAll(bytes.NewReader(out))
	if err != nil {
		t.Fatalf("initrd.img's first archive: %v", err)
	}
	return entries
}

// extractRoot unpacks the erofs file system of rootfs.img into a temporary
// directory (fsck.erofs, erofs-utils: make deps).
func extractRoot(t *testing.T, rootfs string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "root")
	if out, err := exec.Command("fsck.erofs", "--extract="+dir, rootfs).CombinedOutput(); err != nil {
		t.Fatalf("fsck.erofs --extract %s: %v: %s (run make deps)", rootfs, err, out)
	}
	return dir
}

// TestWhatRunsFromMemory checks the layout the first stage relies on: the
// measured initrd.img carries the agent the manifest names, as /init, and
// the runtime tree (crun alone, static), and its first archive
// no program at all; the verified root has neither, only an empty mount
// point and a symlink into it for each runtime file, so that every byte the
// guest executes has one home, covered by the launch measurement or by
// dm-verity.
func TestWhatRunsFromMemory(t *testing.T) {
	dir := imageDir(t)
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	initrdPath, _ := m.Path(dir, manifest.RoleInitrd)
	rootfsPath, _ := m.Path(dir, manifest.RoleRootfs)
	initrd, err := os.ReadFile(initrdPath)
	if err != nil {
		t.Fatal(err)
	}
	off, entries := ramArchive(t, initrd)
	for _, e := range firstArchive(t, initrd[:off]) {
		if isProgram(e) {
			t.Errorf("the first archive of initrd.img has a program, %s (mode %o): the agent, /init, is the initramfs's only one", e.Name, e.Mode)
		}
	}

	var agent []byte
	runtime := map[string]newc.Entry{} // path in the root -> entry
	runtimePrefix := strings.TrimPrefix(stage1.RuntimeDir, "/") + "/"
	for _, e := range entries {
		switch {
		case e.Name == strings.TrimPrefix(stage1.Init, "/"):
			if e.Mode != newc.ModeRegular|0o755 {
				t.Errorf("%s in initrd.img has mode %o, want a regular file 0755", stage1.Init, e.Mode)
			}
			agent = e.Body
		case strings.HasPrefix(e.Name, runtimePrefix) && e.Mode&newc.ModeRegular == newc.ModeRegular && e.Mode&newc.ModeDir != newc.ModeDir:
			runtime["/"+strings.TrimPrefix(e.Name, runtimePrefix)] = e
		}
	}
	sum := sha256.Sum256(agent)
	if got := hex.EncodeToString(sum[:]); got != m.AgentSHA256 {
		t.Errorf("the agent in initrd.img has sha256 %s, the manifest says %s", got, m.AgentSHA256)
	}
	crun, ok := runtime["/usr/bin/crun"]
	if !ok {
		t.Fatalf("initrd.img's runtime tree has no /usr/bin/crun; it has %d files", len(runtime))
	}
	// crun is static (images/crun.sh): no dynamic loader, no libraries to
	// map at every create and start, and nothing else in the tree.
	bin, err := elf.NewFile(bytes.NewReader(crun.Body))
	if err != nil {
		t.Fatalf("initrd.img's crun is not an ELF file: %v", err)
	}
	for _, p := range bin.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("initrd.img's crun is dynamically linked (it has a PT_INTERP): build it with images/crun.sh")
		}
	}
	if len(runtime) != 1 {
		names := make([]string, 0, len(runtime))
		for p := range runtime {
			names = append(names, p)
		}
		t.Errorf("initrd.img's runtime tree has %v; want crun alone", names)
	}

	root := extractRoot(t, rootfsPath)
	if _, err := os.Lstat(filepath.Join(root, "init")); !os.IsNotExist(err) {
		t.Errorf("the verified root has /init (%v): the agent must live only in initrd.img", err)
	}
	mnt, err := os.ReadDir(filepath.Join(root, stage1.RuntimeMount))
	if err != nil {
		t.Fatalf("the verified root has no mount point %s for the runtime tree: %v", stage1.RuntimeMount, err)
	}
	if len(mnt) != 0 {
		t.Errorf("the runtime mount point %s in the verified root is not empty: %v", stage1.RuntimeMount, mnt)
	}
	for p := range runtime {
		target, err := os.Readlink(filepath.Join(root, p))
		if err != nil {
			t.Errorf("the verified root has no symlink at %s into the runtime tree: %v", p, err)
			continue
		}
		if want := stage1.RuntimeMount + p; target != want {
			t.Errorf("%s in the verified root links to %s, want %s", p, target, want)
		}
	}
	// One home: no regular file of the root has the agent's or a runtime
	// file's bytes.
	homes := map[[32]byte]string{sha256.Sum256(agent): stage1.Init}
	for p, e := range runtime {
		homes[sha256.Sum256(e.Body)] = stage1.RuntimeDir + p
	}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if what, ok := homes[sha256.Sum256(b)]; ok {
			t.Errorf("the verified root has a copy of initrd.img's %s at %s", what, strings.TrimPrefix(path, root))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAgentChangesLaunchDigest checks that the agent is covered by the
// launch measurement: the sim TEE's digest recomputed over initrd.img is
// the manifest's, and over a copy with one byte of the agent flipped it is
// not (SNP and TDX hash the same initrd bytes: snp.NewKernelHashes, the
// direct boot's RTMR).
func TestAgentChangesLaunchDigest(t *testing.T) {
	dir := imageDir(t)
	m, err := manifest.Verify(dir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.Sim()
	if err != nil {
		t.Fatal(err)
	}
	kernelPath, _ := m.Path(dir, manifest.RoleKernel)
	initrdPath, _ := m.Path(dir, manifest.RoleInitrd)
	kernel, err := os.ReadFile(kernelPath)
	if err != nil {
		t.Fatal(err)
	}
	initrd, err := os.ReadFile(initrdPath)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := os.ReadFile(d.Firmware.Path)
	if err != nil {
		t.Fatalf("the sim firmware the manifest names: %v", err)
	}
	sig, err := snp.VCPUTypeSig(d.VCPUType)
	if err != nil {
		t.Fatal(err)
	}
	digest := func(initrd []byte) string {
		got, err := sim.LaunchDigest(sim.Params{Firmware: fw, Kernel: snp.NewKernelHashes(kernel, initrd, d.Cmdline), VCPUSig: sig, Features: d.GuestFeatures}, 1)
		if err != nil {
			t.Fatal(err)
		}
		return got.String()
	}
	if got, want := digest(initrd), d.ByVCPUs["1"]; got != want {
		t.Fatalf("sim digest over initrd.img = %s, the manifest says %s", got, want)
	}
	off, entries := ramArchive(t, initrd)
	var agent []byte
	for _, e := range entries {
		if e.Name == strings.TrimPrefix(stage1.Init, "/") {
			agent = e.Body
		}
	}
	i := bytes.Index(initrd[off:], agent)
	if len(agent) == 0 || i < 0 {
		t.Fatal("cannot find the agent's bytes in initrd.img")
	}
	tampered := bytes.Clone(initrd)
	tampered[off+i+len(agent)/2] ^= 0x01
	if got := digest(tampered); got == d.ByVCPUs["1"] {
		t.Fatal("an initrd.img with a modified agent has the manifest's sim launch digest")
	}
}
