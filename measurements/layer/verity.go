package layer

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
)

// BlockSize is the size of the layer disk's blocks: the ext4 file
// system's, and dm-verity's data and hash blocks.
const BlockSize = 4096

// The hash tree is dm-verity's format version 1 with sha256 and no salt:
// each hash block holds BlockSize/sha256.Size digests, zero-padded; a
// level hashes the blocks of the level below (level 0 the data blocks)
// until a level fits in one block, whose digest is the root hash. The
// levels are stored top first: the one-block top level at the start of
// the hash area, level 0 at its end. With a single data block there is
// no tree at all, and the root hash is that block's digest. This is what
// veritysetup format --no-superblock --salt=- writes and the kernel's
// dm-verity reads (Documentation/admin-guide/device-mapper/verity.rst).
const (
	digestsPerBlock = BlockSize / sha256.Size // 128
	digestsPerShift = 7                       // log2(digestsPerBlock)
)

// hashLevels returns the number of blocks of each level of the tree of
// dataBlocks data blocks, level 0 first, as cryptsetup's hash_levels and
// the kernel's verity_ctr count them.
func hashLevels(dataBlocks uint64) []uint64 {
	var levels []uint64
	for n := 0; digestsPerShift*n < 64 && (dataBlocks-1)>>(digestsPerShift*n) != 0; n++ {
		shift := digestsPerShift * (n + 1)
		var blocks uint64
		if shift >= 64 {
			blocks = 1
		} else {
			blocks = (dataBlocks + 1<<shift - 1) >> shift
		}
		levels = append(levels, blocks)
	}
	return levels
}

// HashTreeBlocks is the number of hash blocks of the tree of dataBlocks
// data blocks: 0 for one data block, 1 for up to 128, then about
// dataBlocks/127.
func HashTreeBlocks(dataBlocks uint64) uint64 {
	var n uint64
	for _, b := range hashLevels(dataBlocks) {
		n += b
	}
	return n
}

// levelOffsets returns the first block of each level, counted from the
// start of the hash area, level 0 first.
func levelOffsets(levels []uint64) []uint64 {
	off := make([]uint64, len(levels))
	var pos uint64
	for i := len(levels) - 1; i >= 0; i-- {
		off[i] = pos
		pos += levels[i]
	}
	return off
}

// chunkBlocks is how many blocks the tree writer reads at a time.
const chunkBlocks = 256

// WriteHashTree computes the dm-verity hash tree of the first dataBlocks
// blocks of rw and writes it from block dataBlocks on, HashTreeBlocks
// blocks; it returns the root hash. rw's offset 0 is the disk's first
// byte; the position it is left at is unspecified.
func WriteHashTree(rw io.ReadWriteSeeker, dataBlocks uint64) ([sha256.Size]byte, error) {
	var root [sha256.Size]byte
	if dataBlocks == 0 {
		return root, errors.New("dm-verity: no data blocks to protect")
	}
	if dataBlocks > 1<<40 {
		return root, fmt.Errorf("dm-verity: %d data blocks is more than a layer disk may have (2^40)", dataBlocks)
	}
	levels := hashLevels(dataBlocks)
	offs := levelOffsets(levels)
	start := int64(dataBlocks) * BlockSize
	// Level i hashes the blocks below it: the data, or level i-1.
	below, belowBlocks := int64(0), dataBlocks
	for i := range levels {
		out := start + int64(offs[i])*BlockSize
		if err := hashBlocks(rw, below, belowBlocks, out); err != nil {
			return root, fmt.Errorf("dm-verity level %d: %w", i, err)
		}
		below, belowBlocks = out, levels[i]
	}
	// The root hashes the top level's one block, or the one data block.
	if _, err := rw.Seek(below, io.SeekStart); err != nil {
		return root, err
	}
	top := make([]byte, BlockSize)
	if _, err := io.ReadFull(rw, top); err != nil {
		return root, fmt.Errorf("dm-verity root: %w", err)
	}
	return sha256.Sum256(top), nil
}

// hashBlocks reads n blocks at in and writes their digests, packed into
// zero-padded hash blocks, at out.
func hashBlocks(rw io.ReadWriteSeeker, in int64, n uint64, out int64) error {
	buf := make([]byte, chunkBlocks*BlockSize)
	// A chunk's digests fill chunkBlocks/digestsPerBlock hash blocks.
	hashes := make([]byte, 0, chunkBlocks*sha256.Size)
	for done := uint64(0); done < n; {
		k := min(n-done, chunkBlocks)
		if _, err := rw.Seek(in+int64(done)*BlockSize, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.ReadFull(rw, buf[:k*BlockSize]); err != nil {
			return fmt.Errorf("read block %d: %w", done, err)
		}
		hashes = hashes[:0]
		for b := range k {
			sum := sha256.Sum256(buf[b*BlockSize : (b+1)*BlockSize])
			hashes = append(hashes, sum[:]...)
		}
		done += k
		if done == n {
			// The last hash block is zero-padded.
			if r := len(hashes) % BlockSize; r != 0 {
				hashes = append(hashes, make([]byte, BlockSize-r)...)
			}
		}
		// done-k is a multiple of chunkBlocks, so of digestsPerBlock: the
		// chunk's digests start a hash block.
		if _, err := rw.Seek(out+int64((done-k)/digestsPerBlock)*BlockSize, io.SeekStart); err != nil {
			return err
		}
		if _, err := rw.Write(hashes); err != nil {
			return err
		}
	}
	return nil
}

// VerifyError says which block of a layer disk does not match its hash
// tree.
type VerifyError struct {
	// Level is -1 for a data block, else the hash level the block is in.
	Level int
	// Block is the block's index in the disk.
	Block uint64
	// Root is set when the tree is consistent but its root is not the
	// expected one (another disk, or a changed top block).
	Root bool
}

func (e *VerifyError) Error() string {
	switch {
	case e.Root:
		return "dm-verity: the hash tree's root is not the expected root hash: another layer disk"
	case e.Level < 0:
		return fmt.Sprintf("dm-verity: data block %d does not match its hash", e.Block)
	}
	return fmt.Sprintf("dm-verity: hash block %d (level %d) does not match its hash", e.Block, e.Level)
}

// Verify checks a layer disk against root as dm-verity would read it:
// every data block against the tree that follows block dataBlocks, and
// the tree against root. It reads the whole disk; the first mismatch is
// a *VerifyError.
func Verify(r io.ReaderAt, dataBlocks uint64, root [sha256.Size]byte) error {
	if dataBlocks == 0 {
		return errors.New("dm-verity: no data blocks")
	}
	levels := hashLevels(dataBlocks)
	offs := levelOffsets(levels)
	start := dataBlocks
	blk := make([]byte, BlockSize)
	stored := make([]byte, BlockSize)
	storedAt := ^uint64(0) // the block stored holds
	// Each level's blocks are checked against the digests the level
	// above stores; the top is checked against root.
	check := func(level int, first, n uint64) error {
		for b := range n {
			if _, err := r.ReadAt(blk, int64(first+b)*BlockSize); err != nil {
				return fmt.Errorf("dm-verity: read block %d: %w", first+b, err)
			}
			sum := sha256.Sum256(blk)
			if level+1 == len(levels) {
				if sum != root {
					return &VerifyError{Level: level, Block: first + b, Root: true}
				}
				continue
			}
			parent := start + offs[level+1] + b/digestsPerBlock
			if parent != storedAt {
				if _, err := r.ReadAt(stored, int64(parent)*BlockSize); err != nil {
					return fmt.Errorf("dm-verity: read block %d: %w", parent, err)
				}
				storedAt = parent
			}
			i := (b % digestsPerBlock) * sha256.Size
			if !bytes.Equal(stored[i:i+sha256.Size], sum[:]) {
				return &VerifyError{Level: level, Block: first + b}
			}
		}
		return nil
	}
	if err := check(-1, 0, dataBlocks); err != nil {
		return err
	}
	// A hash block's padding is covered too: the digest above is of the
	// whole block.
	for i := range levels {
		if err := check(i, start+offs[i], levels[i]); err != nil {
			return err
		}
	}
	return nil
}
