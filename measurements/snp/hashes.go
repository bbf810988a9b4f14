package snp

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/c8s-dev/c8s/measurements/ovmf"
)

// GUIDs of QEMU's SEV hashes table and its entries.
var (
	HashTableHeaderGUID  = ovmf.MustParseGUID("9438d606-4f22-4cc9-b479-a793d411fd21")
	HashTableKernelGUID  = ovmf.MustParseGUID("4de79437-abd2-427f-b835-d5b172d2045b")
	HashTableInitrdGUID  = ovmf.MustParseGUID("44baf731-3a2f-4bd7-9af1-41e29169781d")
	HashTableCmdlineGUID = ovmf.MustParseGUID("97d02dd8-bd20-4c94-aa78-e7714d36ab2a")
)

const (
	hashEntrySize = 16 + 2 + sha256.Size     // GUID, uint16 length, SHA-256
	hashTableSize = 16 + 2 + 3*hashEntrySize // header GUID, length, three entries
	// HashTableSize is the size of the table QEMU writes, padded to 16 bytes.
	HashTableSize = (hashTableSize + 15) &^ 15
)

// KernelHashes are the SHA-256 digests QEMU puts in the SEV hashes table
// for a direct kernel boot (-kernel, -initrd, -append).
type KernelHashes struct {
	Kernel  [sha256.Size]byte
	Initrd  [sha256.Size]byte
	Cmdline [sha256.Size]byte
}

// NewKernelHashes hashes a kernel, an initrd (nil or empty when there is
// none) and a command line. Large kernels and initrds are hashed
// concurrently.
func NewKernelHashes(kernel, initrd []byte, cmdline string) KernelHashes {
	k := KernelHashes{Cmdline: CmdlineHash(cmdline)}
	if len(kernel) < 1<<20 || len(initrd) < 1<<20 {
		k.Kernel, k.Initrd = sha256.Sum256(kernel), sha256.Sum256(initrd)
		return k
	}
	done := make(chan struct{})
	go func() {
		k.Initrd = sha256.Sum256(initrd)
		close(done)
	}()
	k.Kernel = sha256.Sum256(kernel)
	<-done
	return k
}

// CmdlineHash returns the hash QEMU records for a kernel command line: the
// SHA-256 of the string with its terminating NUL (a lone NUL when empty).
func CmdlineHash(cmdline string) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(cmdline))
	h.Write([]byte{0})
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// Table returns QEMU's SEV hashes table (header, then the cmdline, initrd
// and kernel entries), zero-padded to HashTableSize bytes.
func (k KernelHashes) Table() []byte {
	t := make([]byte, HashTableSize)
	copy(t, HashTableHeaderGUID[:])
	binary.LittleEndian.PutUint16(t[16:], hashTableSize)
	off := 18
	for _, e := range []struct {
		guid ovmf.GUID
		hash [sha256.Size]byte
	}{
		{HashTableCmdlineGUID, k.Cmdline},
		{HashTableInitrdGUID, k.Initrd},
		{HashTableKernelGUID, k.Kernel},
	} {
		copy(t[off:], e.guid[:])
		binary.LittleEndian.PutUint16(t[off+16:], hashEntrySize)
		copy(t[off+18:], e.hash[:])
		off += hashEntrySize
	}
	return t
}

// Page returns a 4 KiB page holding the hashes table at offset, as QEMU
// fills the SNP_KERNEL_HASHES page.
func (k KernelHashes) Page(offset int) ([]byte, error) {
	if offset < 0 || offset+HashTableSize > PageSize {
		return nil, fmt.Errorf("snp: hashes table at page offset %#x does not fit in a 4 KiB page", offset)
	}
	p := make([]byte, PageSize)
	copy(p[offset:], k.Table())
	return p, nil
}
