package layer

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
)

// The level sizes are cryptsetup's: no tree for one block, one hash block
// up to 128, then a level per factor of 128.
func TestHashLevels(t *testing.T) {
	for _, c := range []struct {
		data uint64
		want []uint64
	}{
		{1, nil},
		{2, []uint64{1}},
		{128, []uint64{1}},
		{129, []uint64{2, 1}},
		{128 * 128, []uint64{128, 1}},
		{128*128 + 1, []uint64{129, 2, 1}},
		{1 << 40, []uint64{1 << 33, 1 << 26, 1 << 19, 1 << 12, 1 << 5, 1}},
	} {
		if got := hashLevels(c.data); !slices.Equal(got, c.want) {
			t.Errorf("hashLevels(%d) = %v, want %v", c.data, got, c.want)
		}
		var sum uint64
		for _, b := range c.want {
			sum += b
		}
		if got := HashTreeBlocks(c.data); got != sum {
			t.Errorf("HashTreeBlocks(%d) = %d, want %d", c.data, got, sum)
		}
	}
}

// randomDisk writes n random blocks to a new file.
func randomDisk(t *testing.T, n uint64, seed uint64) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8)})
	buf := make([]byte, BlockSize)
	for range n {
		_, _ = r.Read(buf)
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

var rootRE = regexp.MustCompile(`Root hash:\s+([0-9a-f]{64})`)

// veritysetupArgs are the options that open a layer disk of n data blocks.
func veritysetupArgs(n uint64) []string {
	return []string{"--no-superblock", "--salt=-", "--hash=sha256", "--format=1",
		"--data-block-size=4096", "--hash-block-size=4096",
		"--data-blocks=" + strconv.FormatUint(n, 10), "--hash-offset=" + strconv.FormatUint(n*BlockSize, 10)}
}

func veritysetup(t *testing.T, args ...string) (string, error) {
	t.Helper()
	path, err := exec.LookPath("veritysetup")
	if err != nil {
		t.Fatalf("veritysetup (cryptsetup-bin) is needed: run make deps: %v", err)
	}
	out, err := exec.Command(path, args...).CombinedOutput()
	return string(out), err
}

// WriteHashTree writes, byte for byte, the tree veritysetup format writes
// for the same data, and veritysetup verify accepts the disk with the root
// WriteHashTree returns, and refuses it with a byte flipped in a data
// block or in the tree.
func TestHashTreeVeritysetup(t *testing.T) {
	for i, n := range []uint64{1, 2, 127, 128, 129, 300, 128 * 128, 128*128 + 1} {
		t.Run(strconv.FormatUint(n, 10), func(t *testing.T) {
			f := randomDisk(t, n, uint64(i))
			root, err := WriteHashTree(f, n)
			if err != nil {
				t.Fatal(err)
			}
			ours, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			if want := (n + HashTreeBlocks(n)) * BlockSize; uint64(len(ours)) != want {
				t.Fatalf("disk is %d bytes, want %d", len(ours), want)
			}
			// veritysetup format, on a copy of the data alone.
			ref := filepath.Join(t.TempDir(), "ref.img")
			if err := os.WriteFile(ref, ours[:n*BlockSize], 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := veritysetup(t, append(append([]string{"format"}, veritysetupArgs(n)...), ref, ref)...)
			if err != nil {
				t.Fatalf("veritysetup format: %v\n%s", err, out)
			}
			m := rootRE.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("veritysetup format printed no root hash:\n%s", out)
			}
			if m[1] != hex.EncodeToString(root[:]) {
				t.Errorf("root %x, veritysetup's %s", root, m[1])
			}
			theirs, err := os.ReadFile(ref)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(ours, theirs) {
				t.Errorf("the disk differs from veritysetup's (%d and %d bytes)", len(ours), len(theirs))
			}
			verify := func() (string, error) {
				return veritysetup(t, append(append([]string{"verify"}, veritysetupArgs(n)...), f.Name(), f.Name(), hex.EncodeToString(root[:]))...)
			}
			if out, err := verify(); err != nil {
				t.Fatalf("veritysetup verify: %v\n%s", err, out)
			}
			if err := Verify(f, n, root); err != nil {
				t.Fatalf("Verify: %v", err)
			}
			// A flipped byte in the last data block, then (restored) in the
			// tree's last block: both refused, by veritysetup and Verify.
			flips := []int64{int64(n)*BlockSize - 100}
			if n > 1 {
				flips = append(flips, int64(len(ours))-BlockSize+5)
			}
			for _, at := range flips {
				flip(t, f, at)
				if out, err := verify(); err == nil {
					t.Errorf("veritysetup verify accepts the disk with byte %d flipped:\n%s", at, out)
				}
				var ve *VerifyError
				if err := Verify(f, n, root); !errors.As(err, &ve) {
					t.Errorf("Verify accepts the disk with byte %d flipped: %v", at, err)
				}
				flip(t, f, at)
			}
			// Another root: refused.
			other := root
			other[0] ^= 1
			if err := Verify(f, n, other); err == nil {
				t.Error("Verify accepts another root")
			}
		})
	}
}

// flip inverts byte at of f.
func flip(t *testing.T, f *os.File, at int64) {
	t.Helper()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, at); err != nil {
		t.Fatal(err)
	}
}

// Verify names the block that does not match: the data block, the hash
// block of a level, or the root.
func TestVerifyNamesTheBlock(t *testing.T) {
	const n = 129 // levels: 2 blocks, then 1; the tree is blocks 129 (top), 130-131 (level 0)
	f := randomDisk(t, n, 7)
	root, err := WriteHashTree(f, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		block uint64
		want  string
	}{
		{5, "data block 5 does not match"},
		{128, "data block 128 does not match"},
		// The last digest of level 0's first block is data block 127's.
		{130, "data block 127 does not match"},
		{131, "hash block 131 (level 0) does not match"},
		{129, "root is not the expected root hash"},
	} {
		flip(t, f, int64(c.block)*BlockSize+BlockSize-1) // the last byte: padding in block 131
		err := Verify(f, n, root)
		if err == nil || !regexp.MustCompile(regexp.QuoteMeta(c.want)).MatchString(err.Error()) {
			t.Errorf("block %d flipped: %v, want %q", c.block, err, c.want)
		}
		flip(t, f, int64(c.block)*BlockSize+BlockSize-1)
	}
	if err := Verify(f, n, root); err != nil {
		t.Fatal(err)
	}
}

// WriteHashTree refuses no data, and reports a short disk.
func TestWriteHashTreeErrors(t *testing.T) {
	f := randomDisk(t, 3, 1)
	if _, err := WriteHashTree(f, 0); err == nil {
		t.Error("0 data blocks accepted")
	}
	if _, err := WriteHashTree(f, 4); err == nil {
		t.Error("4 data blocks of a 3-block disk accepted")
	}
}

func ExampleHashTreeBlocks() {
	for _, n := range []uint64{1, 128, 129, 262144} {
		fmt.Println(n, HashTreeBlocks(n))
	}
	// Output:
	// 1 0
	// 128 1
	// 129 3
	// 262144 2065
}
