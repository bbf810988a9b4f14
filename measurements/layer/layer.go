// Package layer converts an OCI image layer into c8s's layer disk, the
// read-only block device a pod VM opens through dm-verity with the root
// hash its measured policy pins (guest/api/policy Layer), and computes
// what the policy pins: the layer's diff ID, the root hash and the number
// of data blocks.
//
// # Why ext4 and tar2ext4, not EROFS
//
// The conversion must be deterministic and computable off the node from
// the layer's bytes alone, so that the image's owner (`c8s-measure image`)
// and every node arrive at the same root hash. EROFS would be the natural
// file system, but the tools that build it from a tar do not exist here:
// Debian 12's erofs-utils (1.5) has no `mkfs.erofs --tar` (its usage lists
// only FILE DIRECTORY), so building an EROFS image would mean unpacking
// the tar on disk first, as root, to keep owners and device nodes, and
// then depending on that unpacking being faithful. containerd 2.2's EROFS
// snapshotter has the same dependency: it runs mkfs.erofs --tar=f
// (internal/erofsutils). Microsoft's hcsshim ext4/tar2ext4, used for
// exactly this in LCOW and in Azure's confidential containers (hcsshim's
// dmverity-vhd, whose trees have a salt and so other roots), writes a
// compact ext4 file system straight from the tar stream, in Go, with no
// timestamps of its own, no random UUID (the superblock's is zero) and
// no map-order dependence; Build checks the result is byte-identical
// across runs and processes (TestDeterministic).
//
// # The layer disk
//
// A layer disk is, from its first byte:
//
//   - the layer's files as an ext4 file system (4096-byte blocks,
//     read-only feature set, no journal), as tar2ext4 writes it with its
//     whiteout conversion: an OCI whiteout `.wh.NAME` becomes a 0/0
//     character device NAME and `.wh..wh..opq` the trusted.overlay.opaque
//     xattr of its directory, which is how overlayfs reads a lower layer;
//     the file system is sized for at most MaxDataSize (its group
//     descriptor table is reserved for that), and is a whole number of
//     blocks, DataBlocks;
//   - then, from block DataBlocks, the dm-verity hash tree of those
//     blocks: format version 1, sha256, 4096-byte data and hash blocks, no
//     salt, no verity superblock (WriteHashTree). veritysetup opens it
//     with --no-superblock --salt=- --hash-offset=DataBlocks*4096
//     --data-blocks=DataBlocks.
//
// Before tar2ext4 sees the tar, Build normalizes it as containerd's
// applier reads a layer: names are cleaned (no "..", "/" or "./"
// prefixes), hard-link targets too; PAX global headers and AUFS metadata
// (.wh..wh.* other than the opaque marker) are skipped; GNU sparse files
// are written out in full; only the xattrs a tar carries (SCHILY.xattr.*)
// are kept of its PAX records; times before 1970 become the epoch (which
// tar2ext4 cannot encode); other entry types, ids outside 32 bits, device
// numbers outside Linux's and empty symlink targets are refused with the
// entry named.
//
// Two things differ from a layer unpacked by containerd and are visible
// in the container: each layer's file system has an empty /lost+found
// (0700, root), which tar2ext4 always writes, and a directory the tar
// only implies (a parent of an entry, with no entry of its own) gets its
// parent's mode, owner and times, where containerd keeps the lower
// layer's (image builders write an entry for every directory they
// change).
//
// The format is this package's output for a given tar, byte for byte:
// the reference vector in testdata (TestReferenceVector) pins it, and a
// change to this package or to tar2ext4 that changes it changes every
// layer's root hash (and so every policy that pins one).
package layer

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/Microsoft/hcsshim/ext4/tar2ext4"
	digest "github.com/opencontainers/go-digest"
)

// MaxDataSize is the largest file system a layer disk may hold, 128 GiB
// (as hcsshim's own ConvertAndComputeRootDigest sizes it); a layer whose
// files do not fit is refused.
const MaxDataSize = 128 << 30

// Info describes a layer disk Build wrote.
type Info struct {
	// DiffID is the layer's diff ID: sha256 of the uncompressed tar,
	// every byte read, as the image config's rootfs.diff_ids lists it.
	DiffID digest.Digest
	// RootHash is the dm-verity root hash, 64 lower-case hex digits.
	RootHash string
	// DataBlocks is the number of 4096-byte blocks of the ext4 file
	// system; the hash tree starts at block DataBlocks.
	DataBlocks uint64
	// Size is the disk's size in bytes: data blocks and hash tree.
	Size int64
}

// HashOffset is the byte offset of the hash tree in the disk
// (veritysetup's --hash-offset).
func (i Info) HashOffset() int64 { return int64(i.DataBlocks) * BlockSize }

// Build reads an uncompressed OCI layer tar from tarStream (to its end:
// the diff ID covers every byte, tar padding included) and writes the
// layer disk to out, which must be empty (its offset 0 is the disk's
// first byte; Build reads back what it wrote to compute the hash tree).
// A compressed layer goes through Decompress first. The same tar gives
// the same disk, byte for byte, on any machine.
//
// The caller checks Info.DiffID against what the image config lists; an
// error from tarStream (for example a digest verifier's at its end) fails
// Build with that error.
func Build(tarStream io.Reader, out io.ReadWriteSeeker) (Info, error) {
	return build(tarStream, out, MaxDataSize)
}

// build is Build with limit bytes of file content at most (the fuzz
// target keeps it small).
func build(tarStream io.Reader, out io.ReadWriteSeeker, limit int64) (Info, error) {
	end, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return Info{}, fmt.Errorf("layer disk: %w", err)
	}
	if end != 0 {
		return Info{}, fmt.Errorf("layer disk: the output already holds %d bytes: Build writes a whole disk into an empty file", end)
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return Info{}, fmt.Errorf("layer disk: %w", err)
	}
	h := sha256.New()
	n := newNormalizer(io.TeeReader(tarStream, h), limit)
	convErr := tar2ext4.ConvertTarToExt4(n, out, tar2ext4.ConvertWhiteout, tar2ext4.MaximumDiskSize(MaxDataSize))
	// tar2ext4 stops at the archive's end; the rest (tar padding, and
	// the input's own end, where a digest verifier speaks) is read here.
	_, drainErr := io.Copy(io.Discard, n)
	switch {
	case drainErr != nil:
		// The input's error is the cause of tar2ext4's, if it has one.
		return Info{}, fmt.Errorf("layer tar: %w", drainErr)
	case convErr != nil:
		// tar2ext4's errors name the entry.
		return Info{}, fmt.Errorf("layer tar: converting to ext4: %w", convErr)
	}
	dataSize, err := out.Seek(0, io.SeekEnd)
	if err != nil {
		return Info{}, fmt.Errorf("layer disk: %w", err)
	}
	// tar2ext4 writes whole blocks up to the size its superblock states;
	// anything else is not the format.
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return Info{}, fmt.Errorf("layer disk: %w", err)
	}
	fsSize, fsBlock, err := tar2ext4.Ext4FileSystemSize(out)
	if err != nil {
		return Info{}, fmt.Errorf("layer disk: %w", err)
	}
	if fsBlock != BlockSize || fsSize != dataSize || dataSize%BlockSize != 0 {
		return Info{}, fmt.Errorf("layer disk: tar2ext4 wrote %d bytes for a file system of %d bytes in %d-byte blocks: not the layer format", dataSize, fsSize, fsBlock)
	}
	dataBlocks := uint64(dataSize / BlockSize)
	root, err := WriteHashTree(out, dataBlocks)
	if err != nil {
		return Info{}, fmt.Errorf("layer disk: %w", err)
	}
	return Info{
		DiffID:     digest.NewDigest(digest.SHA256, h),
		RootHash:   hex.EncodeToString(root[:]),
		DataBlocks: dataBlocks,
		Size:       int64(dataBlocks+HashTreeBlocks(dataBlocks)) * BlockSize,
	}, nil
}

// ParseRootHash reads a root hash as Info.RootHash and the policy write
// it: 64 lower-case hex digits.
func ParseRootHash(s string) ([sha256.Size]byte, error) {
	var root [sha256.Size]byte
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != sha256.Size || hex.EncodeToString(b) != s {
		return root, errors.New("a dm-verity root hash is 64 lower-case hex digits")
	}
	copy(root[:], b)
	return root, nil
}
