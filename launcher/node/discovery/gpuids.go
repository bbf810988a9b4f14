package discovery

// NVIDIA PCI IDs. Vendor 0x10de; a data-center GPU is a 3D controller
// (class 0x0302) or, on some boards, a VGA controller (0x0300).
const (
	NVIDIAVendor  = 0x10de
	Class3D       = 0x0302
	ClassVGA      = 0x0300
	ClassBridge   = 0x0604
	archHopper    = "hopper"
	archBlackwell = "blackwell"
)

// gpuModel is a GPU model the node agent knows by its PCI device ID.
type gpuModel struct {
	// Name is the device name in pci.ids (the part in brackets).
	Name string
	// Arch is the architecture: "hopper" (GH100) or "blackwell" (GB100,
	// GB102, GB110).
	Arch string
}

// gpuModels are the Hopper and Blackwell data-center GPUs whose
// architecture supports confidential computing (NVIDIA Confidential
// Computing: Hopper and later). Whether a given board and VBIOS support
// CC mode is NVIDIA's Secure AI compatibility matrix to say; the node
// agent advertises a GPU only when its CC mode is on as well (see
// GPUInfo).
//
// Sources (names as in pci.ids, which is GPL-2.0-or-later OR
// BSD-3-Clause; only the IDs and names are used here, as facts):
//   - Debian 12 package pci.ids 0.0~2023.04.11-1 (pci.ids version
//     2023.04.10): 2322, 2324, 2330, 2331, 2336, 2339.
//   - pciutils/pciids on GitHub, pci.ids version 2026.08.22 (commit
//     c1c12547d626): every ID below, including the later H100 variants,
//     H200, H20, GH200 and Blackwell.
//
// IDs pci.ids lists only as a bare chip ("GH100", "GB100") or as
// "Reserved Dev ID" are left out: nothing public says what product they
// are.
var gpuModels = map[uint16]gpuModel{
	// Hopper (GH100).
	0x230c: {"H20 NVL16", archHopper},
	0x230e: {"H20 NVL16", archHopper},
	0x2321: {"H100L 94GB", archHopper},
	0x2322: {"H800 PCIe", archHopper},
	0x2324: {"H800", archHopper},
	0x2328: {"H20B", archHopper},
	0x2329: {"H20", archHopper},
	0x232c: {"H20 HBM3e", archHopper},
	0x2330: {"H100 SXM5 80GB", archHopper},
	0x2331: {"H100 PCIe", archHopper},
	0x2335: {"H200 SXM 141GB", archHopper},
	0x2336: {"H100", archHopper},
	0x2337: {"H100 SXM5 64GB", archHopper},
	0x2338: {"H100 SXM5 96GB", archHopper},
	0x2339: {"H100 SXM5 94GB", archHopper},
	0x233a: {"H800L 94GB", archHopper},
	0x233b: {"H200 NVL", archHopper},
	0x233d: {"H100 96GB", archHopper},
	0x2342: {"GH200 120GB / 480GB", archHopper},
	0x2348: {"GH200 144G HBM3e", archHopper},
	// Blackwell (GB100, GB102, GB110).
	0x2901: {"B200", archBlackwell},
	0x2909: {"HGX B200 168GB", archBlackwell},
	0x2920: {"TS4 / B100", archBlackwell},
	0x2941: {"HGX GB200", archBlackwell},
	0x29bc: {"B100", archBlackwell},
	0x3182: {"B300 SXM6 AC", archBlackwell},
	0x31c2: {"GB300", archBlackwell},
	0x31c3: {"GB300", archBlackwell},
}
