package ovmf

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// GUID is an EFI GUID in its on-disk byte order: the first three fields are
// little-endian, the last eight bytes are stored as written. This is the
// order in which GUIDs appear in the OVMF footer table and in QEMU's SEV
// hashes table.
type GUID [16]byte

// ParseGUID parses the canonical text form
// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into its on-disk byte order.
func ParseGUID(s string) (GUID, error) {
	var g GUID
	parts := strings.Split(s, "-")
	if len(s) != 36 || len(parts) != 5 || len(parts[0]) != 8 || len(parts[1]) != 4 ||
		len(parts[2]) != 4 || len(parts[3]) != 4 || len(parts[4]) != 12 {
		return g, fmt.Errorf("ovmf: GUID %q is not of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", s)
	}
	raw, err := hex.DecodeString(strings.Join(parts, ""))
	if err != nil {
		return g, fmt.Errorf("ovmf: GUID %q: %v", s, err)
	}
	// Data1 (4 bytes), Data2 and Data3 (2 bytes each) are little-endian.
	g[0], g[1], g[2], g[3] = raw[3], raw[2], raw[1], raw[0]
	g[4], g[5] = raw[5], raw[4]
	g[6], g[7] = raw[7], raw[6]
	copy(g[8:], raw[8:])
	return g, nil
}

// MustParseGUID is ParseGUID for GUID literals known at compile time. It
// panics on a malformed literal, which is a programming error; never call it
// on input.
func MustParseGUID(s string) GUID {
	g, err := ParseGUID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// String returns the canonical lower-case text form of g.
func (g GUID) String() string {
	return fmt.Sprintf("%02x%02x%02x%02x-%02x%02x-%02x%02x-%x-%x",
		g[3], g[2], g[1], g[0], g[5], g[4], g[7], g[6], g[8:10], g[10:])
}

// Well-known GUIDs of the OVMF footer table and the SEV hashes table.
var (
	// FooterTableGUID closes the GUIDed table that ends 0x20 bytes before
	// the end of the firmware.
	FooterTableGUID = MustParseGUID("96b582de-1fb2-45f7-baea-a366c55a082d")
	// SevMetadataGUID points at the OvmfSevMetadata structure (SNP).
	SevMetadataGUID = MustParseGUID("dc886566-984a-4798-a75e-5585a7bf67cc")
	// SevESResetBlockGUID holds the SEV-ES AP reset vector (EIP).
	SevESResetBlockGUID = MustParseGUID("00f771de-1a7e-4fcb-890e-68c77e2fb44e")
	// SevHashTableGUID holds the GPA and size of the area where QEMU puts
	// the kernel/initrd/cmdline hashes table.
	SevHashTableGUID = MustParseGUID("7255371f-3a3b-4b04-927b-1da6efa8d454")
	// SevSecretBlockGUID holds the GPA and size of the SEV launch secret area.
	SevSecretBlockGUID = MustParseGUID("4c2eb361-7d9b-4cc3-8081-127c90d3d294")
	// TDXMetadataOffsetGUID holds the offset from the end of the firmware
	// of the TDX metadata (TDVF descriptor).
	TDXMetadataOffsetGUID = MustParseGUID("e47a6535-984a-4798-865e-4685a7bf8ec2")
	// SVSMInfoGUID holds, in a Coconut-SVSM image, the offset of the SVSM
	// entry point from the start of the image.
	SVSMInfoGUID = MustParseGUID("a789a612-0597-4c4b-a49f-cbb1fe9d1ddd")
)
