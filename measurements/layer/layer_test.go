package layer

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/internal/golden"
)

// buildFile builds the layer disk of tarBytes into a file.
func buildFile(t testing.TB, tarBytes []byte) (Info, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "layer.img")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	info, err := Build(bytes.NewReader(tarBytes), f)
	if err != nil {
		t.Fatal(err)
	}
	return info, path
}

// referenceTar is the committed reference layer, which referenceEntries
// generates (go test -update rewrites it).
func referenceTar(t *testing.T) []byte {
	t.Helper()
	golden.Check(t, "reference.tar", tarOf(t, referenceEntries()...))
	data, err := os.ReadFile(filepath.Join("testdata", "golden", "reference.tar"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The reference vector: the committed tar's diff ID, root hash, data
// blocks and size are the golden ones. A change here is a change of the
// layer format: every policy's pinned roots change with it.
func TestReferenceVector(t *testing.T) {
	data := referenceTar(t)
	info, path := buildFile(t, data)
	if want := digest.FromBytes(data); info.DiffID != want {
		t.Errorf("DiffID %s, want the tar's sha256 %s", info.DiffID, want)
	}
	disk, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(disk)) != info.Size {
		t.Errorf("the disk is %d bytes, Info.Size %d", len(disk), info.Size)
	}
	got, err := json.MarshalIndent(map[string]any{
		"diff_id":     info.DiffID,
		"root_hash":   info.RootHash,
		"data_blocks": info.DataBlocks,
		"size":        info.Size,
		"disk_sha256": fmt.Sprintf("%x", sha256.Sum256(disk)),
	}, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "reference.json", append(got, '\n'))
}

// veritysetup verify accepts a built disk with Info's root, data blocks
// and hash offset, and refuses it with one byte of a file flipped.
func TestBuildVeritysetup(t *testing.T) {
	info, path := buildFile(t, referenceTar(t))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	args := append(append([]string{"verify"}, veritysetupArgs(info.DataBlocks)...), path, path, info.RootHash)
	if out, err := veritysetup(t, args...); err != nil {
		t.Fatalf("veritysetup verify: %v\n%s", err, out)
	}
	root, err := ParseRootHash(info.RootHash)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(f, info.DataBlocks, root); err != nil {
		t.Fatal(err)
	}
	// The first byte of /etc/passwd's data block.
	blk := dataBlock(t, path, "/etc/passwd")
	flip(t, f, int64(blk)*BlockSize)
	if out, err := veritysetup(t, args...); err == nil {
		t.Errorf("veritysetup verify accepts the disk with /etc/passwd changed:\n%s", out)
	}
	var ve *VerifyError
	if err := Verify(f, info.DataBlocks, root); !errors.As(err, &ve) || ve.Level != -1 || ve.Block != blk {
		t.Errorf("Verify = %v, want data block %d", err, blk)
	}
}

// debugfs runs a debugfs request against the file system of img.
func debugfs(t *testing.T, img, req string) string {
	t.Helper()
	path, err := exec.LookPath("debugfs")
	if err != nil {
		path = "/usr/sbin/debugfs"
	}
	out, err := exec.Command(path, "-R", req, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs -R %q: %v\n%s", req, err, out)
	}
	return string(out)
}

// dataBlock is the first block of the file at p.
func dataBlock(t *testing.T, img, p string) uint64 {
	t.Helper()
	out := debugfs(t, img, "blocks "+p)
	var b uint64
	if _, err := fmt.Sscan(strings.TrimSpace(out[strings.LastIndex(out, ")")+1:]), &b); err != nil {
		t.Fatalf("blocks %s: %q", p, out)
	}
	return b
}

// The disk's file system holds the layer's files as overlayfs reads a
// lower layer, checked with e2fsprogs (not the converter's own reader).
func TestBuildContents(t *testing.T) {
	_, img := buildFile(t, referenceTar(t))
	fsck, err := exec.Command("e2fsck", "-fn", img).CombinedOutput()
	// tar2ext4 leaves the inode bitmap's padding bits clear, which
	// e2fsck 1.47 reports (exit 4) and the kernel does not read; anything
	// else is an error.
	problems := regexp.MustCompile(`(?m)^.*(Fix\? no|[Ee]rror).*$`).FindAllString(string(fsck), -1)
	for _, p := range problems {
		if !strings.Contains(p, "Padding at end of inode bitmap is not set") && !strings.Contains(p, "Filesystem still has errors") {
			t.Errorf("e2fsck -fn: %s (%v)\n%s", p, err, fsck)
		}
	}
	if !bytes.Contains(fsck, []byte("Pass 5")) {
		t.Fatalf("e2fsck did not check the file system: %v\n%s", err, fsck)
	}
	stat := func(p string) string { return debugfs(t, img, "stat "+p) }
	for _, c := range []struct {
		path string
		want []string
	}{
		// A whiteout: a 0/0 character device of the name it hides.
		{"/etc/shadow", []string{"Type: character special", "Device major/minor number: 00:00"}},
		// The opaque directory, its xattr; the file kept.
		{"/var/cache", []string{"Type: directory", `trusted.overlay.opaque (1) = "y"`}},
		{"/var/cache/fresh", []string{"Type: regular", "Mode:  0600", "Size: 3"}},
		{"/bin/app", []string{"Mode:  04755", "Links: 2", "security.capability (20) = 01 00 00 02"}},
		{"/bin/sh", []string{"Type: symlink", `Fast link dest: "/bin/busybox"`}},
		{"/home/app", []string{"Mode:  0750", "User: 100000   Group: 100001", "user.note (4) = \"kept\"", "mtime: 0x6553f100:1d6f3454"}},
		{"/home/app/data", []string{"Size: 12305", "User: 100000", "mtime: 0x00000000:00000000"}},
		{"/dev/null", []string{"Type: character special", "Device major/minor number: 01:03"}},
		{"/dev/sda", []string{"Type: block special", "Device major/minor number: 08:00"}},
		{"/run/fifo", []string{"Type: FIFO"}},
	} {
		out := stat(c.path)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("stat %s: no %q in\n%s", c.path, w, out)
			}
		}
	}
	// The hard link is the same inode.
	ino := func(p string) string { return regexp.MustCompile(`Inode: (\d+)`).FindStringSubmatch(stat(p))[1] }
	if ino("/bin/app") != ino("/bin/app-hardlink") {
		t.Error("/bin/app-hardlink is not a hard link of /bin/app")
	}
	if got := debugfs(t, img, "cat /etc/passwd"); !strings.Contains(got, "app:x:100000:100001::/home/app:/bin/sh\n") {
		t.Errorf("/etc/passwd: %q", got)
	}
	want := referenceEntries()[13].data
	dump := filepath.Join(t.TempDir(), "data")
	debugfs(t, img, "dump /home/app/data "+dump)
	if got, _ := os.ReadFile(dump); !bytes.Equal(got, want) {
		t.Error("/home/app/data's content differs from the tar's")
	}
	ls := debugfs(t, img, "ls /")
	for _, skipped := range []string{".wh..wh.plnk", "pax_global_header", ".wh.shadow", ".wh..wh..opq"} {
		if strings.Contains(ls, skipped) || strings.Contains(debugfs(t, img, "ls /var/cache"), skipped) || strings.Contains(debugfs(t, img, "ls /etc"), skipped) {
			t.Errorf("%s is in the file system", skipped)
		}
	}
	if !strings.Contains(debugfs(t, img, "ls /usr/share"), "long-name-long-name") {
		t.Error("the long name is missing")
	}
	// The superblock names no UUID and no time: nothing of the build.
	sb, err := exec.Command("dumpe2fs", "-h", img).CombinedOutput()
	if err != nil {
		t.Fatalf("dumpe2fs: %v\n%s", err, sb)
	}
	for _, w := range []string{"Filesystem UUID:          <none>", "read-only", "Last write time:          Thu Jan  1 00:00:00 1970"} {
		if !bytes.Contains(sb, []byte(w)) {
			t.Errorf("dumpe2fs: no %q", w)
		}
	}
}

// manyFiles is a layer of n files in 40 directories, in an order that is
// neither sorted nor the order a map would give.
func manyFiles(t testing.TB, n int) []byte {
	var es []entry
	for d := range 40 {
		es = append(es, dir(fmt.Sprintf("d%02d/", (d*7)%40), 0o755))
	}
	for i := range n {
		es = append(es, file(fmt.Sprintf("d%02d/f%05d", (i*13)%40, (i*7919)%n), 0o644, strings.Repeat("x", i%5000)))
	}
	return tarOf(t, es...)
}

// The same tar gives the same disk, byte for byte: twice in this
// process and once in another (map iteration and anything else that
// varies per run or process).
func TestDeterministic(t *testing.T) {
	inputs := map[string][]byte{"reference": referenceTar(t), "many": manyFiles(t, 3000)}
	for name, data := range inputs {
		t.Run(name, func(t *testing.T) {
			tarPath := filepath.Join(t.TempDir(), "layer.tar")
			if err := os.WriteFile(tarPath, data, 0o644); err != nil {
				t.Fatal(err)
			}
			var sums []string
			for range 2 {
				_, img := buildFile(t, data)
				sums = append(sums, fileSum(t, img))
			}
			out := filepath.Join(t.TempDir(), "helper.img")
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperBuild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "C8S_LAYER_HELPER_TAR="+tarPath, "C8S_LAYER_HELPER_OUT="+out)
			if msg, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("helper process: %v\n%s", err, msg)
			}
			sums = append(sums, fileSum(t, out))
			if sums[0] != sums[1] || sums[0] != sums[2] {
				t.Errorf("disks differ: %v (this process twice, then another process)", sums)
			}
		})
	}
}

// TestHelperBuild is TestDeterministic's other process.
func TestHelperBuild(t *testing.T) {
	in, out := os.Getenv("C8S_LAYER_HELPER_TAR"), os.Getenv("C8S_LAYER_HELPER_OUT")
	if in == "" {
		return // run by TestDeterministic only
	}
	data, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := Build(bytes.NewReader(data), f); err != nil {
		t.Fatal(err)
	}
}

func fileSum(t *testing.T, p string) string {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Build refuses, naming the entry, what a layer may not hold, and a tar
// that is not one.
func TestBuildRefuses(t *testing.T) {
	ok := file("a", 0o644, "x")
	for name, c := range map[string]struct {
		tar  []byte
		want string
	}{
		"not a tar":      {[]byte(strings.Repeat("not a tar ", 100)), "layer tar"},
		"truncated":      {tarOf(t, ok, file("b", 0o644, strings.Repeat("y", 5000)))[:2048], "unexpected EOF"},
		"empty symlink":  {tarOf(t, entry{hdr: tar.Header{Name: "l", Typeflag: tar.TypeSymlink}}), `entry "l": a symbolic link with an empty target`},
		"root file":      {tarOf(t, file(".", 0o644, "")), "the layer's root is not a directory"},
		"big major":      {tarOf(t, entry{hdr: tar.Header{Name: "d", Typeflag: tar.TypeChar, Devmajor: 5000}}), "not a Linux device number"},
		"unknown type":   {tarOf(t, entry{hdr: tar.Header{Name: "v", Typeflag: 'V'}}), `type 'V' is not a file a layer may hold`},
		"file over dir":  {tarOf(t, dir("a/", 0o755), ok), `converting to ext4: a: cannot replace a directory with a file`},
		"link to absent": {tarOf(t, entry{hdr: tar.Header{Name: "h", Typeflag: tar.TypeLink, Linkname: "missing"}}), "missing"},
		"empty whiteout": {tarOf(t, file("etc/.wh.", 0o644, "")), "a whiteout names no file"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Build(bytes.NewReader(c.tar), &memDisk{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Build = %v, want %q", err, c.want)
			}
		})
	}
	// Content past the limit is refused before it is written.
	big := tarOf(t, file("a", 0o644, strings.Repeat("z", 3000)), file("b", 0o644, strings.Repeat("z", 3000)))
	if _, err := build(bytes.NewReader(big), &memDisk{}, 4000); err == nil || !strings.Contains(err.Error(), `entry "b": the layer's files exceed`) {
		t.Errorf("over the limit: %v", err)
	}
	// The output must be empty.
	if _, err := Build(bytes.NewReader(tarOf(t, ok)), &memDisk{b: []byte("old")}); err == nil || !strings.Contains(err.Error(), "already holds 3 bytes") {
		t.Errorf("a non-empty output: %v", err)
	}
}

// errAtEnd is a reader whose end is an error, as a digest verifier's.
type errAtEnd struct{ r io.Reader }

var errDigest = errors.New("the blob does not have its digest")

func (e errAtEnd) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		return n, errDigest
	}
	return n, err
}

// The input is read to its end, past the tar's end-of-archive blocks: the
// diff ID covers every byte and an error at the end fails Build.
func TestBuildReadsToTheEnd(t *testing.T) {
	data := append(tarOf(t, file("a", 0o644, "x")), make([]byte, 8192)...) // more padding, as tar(1) writes
	info, err := Build(bytes.NewReader(data), &memDisk{})
	if err != nil {
		t.Fatal(err)
	}
	if info.DiffID != digest.FromBytes(data) {
		t.Error("the diff ID does not cover the padding")
	}
	if _, err := Build(errAtEnd{bytes.NewReader(data)}, &memDisk{}); !errors.Is(err, errDigest) {
		t.Errorf("an error at the input's end: %v", err)
	}
}

func TestParseRootHash(t *testing.T) {
	good := strings.Repeat("ab", 32)
	if r, err := ParseRootHash(good); err != nil || hex.EncodeToString(r[:]) != good {
		t.Errorf("ParseRootHash(%s) = %x, %v", good, r, err)
	}
	for _, bad := range []string{"", strings.Repeat("AB", 32), strings.Repeat("ab", 31), "sha256:" + good} {
		if _, err := ParseRootHash(bad); err == nil {
			t.Errorf("ParseRootHash(%q) accepted", bad)
		}
	}
}
