// Package verity is the contract between the image build, the launcher and
// the guest's first-stage init for a dm-verity protected guest root file
// system: the parameters of the hash tree and how they travel on the kernel
// command line. Because the command line is part of the launch measurement
// (SNP kernel hashes, TDX RTMR, the sim TEE's digest), so is the root hash,
// and through it every block of the root file system.
//
// The format is plain kernel parameters, one per field:
//
//	c8s.root=/dev/vda c8s.rootfstype=erofs
//	c8s.verity.roothash=<hex> c8s.verity.salt=<hex>
//	c8s.verity.blocks=<data blocks> c8s.verity.hashstart=<hash start block>
//
// Data and hash tree live on one device: the file system first, then (at
// block hashstart) the hash tree. Block sizes are 4096 and the hash is
// sha256, the defaults of veritysetup(8).
package verity

import (
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Kernel parameter names.
const (
	ParamRoot      = "c8s.root"
	ParamFSType    = "c8s.rootfstype"
	ParamRootHash  = "c8s.verity.roothash"
	ParamSalt      = "c8s.verity.salt"
	ParamBlocks    = "c8s.verity.blocks"
	ParamHashStart = "c8s.verity.hashstart"
)

// BlockSize is the data and hash block size in bytes.
const BlockSize = 4096

// HashAlgorithm is the hash of the tree, as dm-verity names it.
const HashAlgorithm = "sha256"

// Params describe a verity-protected root device.
type Params struct {
	// Device is the guest block device holding data and hash tree, e.g.
	// /dev/vda.
	Device string `json:"device"`
	// FSType is the file system on the data area (erofs or ext4).
	FSType string `json:"fs_type"`
	// RootHash is the hex sha256 root of the hash tree.
	RootHash string `json:"root_hash"`
	// Salt is the hex salt veritysetup hashed every block with.
	Salt string `json:"salt"`
	// DataBlocks is the size of the data area in BlockSize blocks.
	DataBlocks uint64 `json:"data_blocks"`
	// HashStartBlock is the first block of the hash tree (after the verity
	// superblock, when there is one), counted in BlockSize blocks from the
	// start of the device.
	HashStartBlock uint64 `json:"hash_start_block"`
}

// Validate reports the first problem of p.
func (p Params) Validate() error {
	if !strings.HasPrefix(p.Device, "/dev/") || strings.ContainsAny(p.Device, " \t\n\"") {
		return fmt.Errorf("verity: device %q is not a /dev path", p.Device)
	}
	switch p.FSType {
	case "erofs", "ext4", "squashfs":
	default:
		return fmt.Errorf("verity: file system type %q is not erofs, ext4 or squashfs", p.FSType)
	}
	if b, err := hex.DecodeString(p.RootHash); err != nil || len(b) != 32 {
		return fmt.Errorf("verity: root hash %q is not a hex sha256", p.RootHash)
	}
	if b, err := hex.DecodeString(p.Salt); err != nil || len(b) > 256 {
		return fmt.Errorf("verity: salt %q is not hex of at most 256 bytes", p.Salt)
	}
	if p.DataBlocks == 0 {
		return errors.New("verity: no data blocks")
	}
	if p.HashStartBlock < p.DataBlocks {
		return fmt.Errorf("verity: hash tree at block %d overlaps the %d data blocks", p.HashStartBlock, p.DataBlocks)
	}
	return nil
}

// KernelParams renders p as kernel parameters, in a fixed order.
func (p Params) KernelParams() []string {
	return []string{
		ParamRoot + "=" + p.Device,
		ParamFSType + "=" + p.FSType,
		ParamRootHash + "=" + p.RootHash,
		ParamSalt + "=" + p.Salt,
		ParamBlocks + "=" + strconv.FormatUint(p.DataBlocks, 10),
		ParamHashStart + "=" + strconv.FormatUint(p.HashStartBlock, 10),
	}
}

// FromCmdline parses the parameters out of a kernel command line. ok is
// false when the command line names no verity root (c8s.root absent); an
// error means it names one but the parameters are incomplete or malformed.
//
// Each parameter may appear once: which root boots must not depend on
// which of two values wins, nor on what follows the image's own
// parameters (the launcher appends a node's kernel_params there).
func FromCmdline(cmdline string) (p Params, ok bool, err error) {
	vals := map[string]string{}
	var repeated []string
	for _, f := range strings.Fields(cmdline) {
		k, v, _ := strings.Cut(f, "=")
		if _, seen := vals[k]; seen && IsParam(k) && !slices.Contains(repeated, k) {
			repeated = append(repeated, k)
		}
		vals[k] = v
	}
	dev, ok := vals[ParamRoot]
	if !ok {
		return Params{}, false, nil
	}
	if len(repeated) > 0 {
		return Params{}, true, fmt.Errorf("verity: %s= given more than once on the kernel command line: each of the root's parameters may be given once", strings.Join(repeated, "=, "))
	}
	p = Params{Device: dev, FSType: vals[ParamFSType], RootHash: vals[ParamRootHash], Salt: vals[ParamSalt]}
	for _, f := range []struct {
		name string
		dst  *uint64
	}{{ParamBlocks, &p.DataBlocks}, {ParamHashStart, &p.HashStartBlock}} {
		s, present := vals[f.name]
		if !present {
			return p, true, fmt.Errorf("verity: %s= is missing from the kernel command line", f.name)
		}
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return p, true, fmt.Errorf("verity: %s=%q is not a block count", f.name, s)
		}
		*f.dst = n
	}
	if p.FSType == "" {
		p.FSType = "erofs"
	}
	return p, true, p.Validate()
}

// Table returns the device-mapper table line of the verity target (see the
// kernel's Documentation/admin-guide/device-mapper/verity.rst), with the
// device's data and hash tree on the same block device: version 1, 4 KiB
// blocks, sha256. Corruption returns I/O errors to the reader.
func (p Params) Table() string {
	salt := p.Salt
	if salt == "" {
		salt = "-"
	}
	return fmt.Sprintf("1 %s %s %d %d %d %d %s %s %s",
		p.Device, p.Device, BlockSize, BlockSize, p.DataBlocks, p.HashStartBlock, HashAlgorithm, p.RootHash, salt)
}

// Sectors is the size of the mapped device in 512-byte sectors.
func (p Params) Sectors() uint64 { return p.DataBlocks * (BlockSize / 512) }

// Layer returns the parameters of an image layer disk in c8s's layer
// format (measurements/layer): an ext4 file system of dataBlocks blocks,
// then its hash tree, unsalted and without a verity superblock, from
// block dataBlocks on.
func Layer(device, rootHash string, dataBlocks uint64) Params {
	return Params{Device: device, FSType: "ext4", RootHash: rootHash, DataBlocks: dataBlocks, HashStartBlock: dataBlocks}
}

// IsParam reports whether k names one of the root's kernel parameters.
func IsParam(k string) bool {
	switch k {
	case ParamRoot, ParamFSType, ParamRootHash, ParamSalt, ParamBlocks, ParamHashStart:
		return true
	}
	return false
}
