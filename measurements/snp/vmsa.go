package snp

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// VMMType selects the initial register state a VMM gives its vCPUs, which
// the VMSA pages (and so the launch digest) capture.
type VMMType int

// VMM types, as the reference tool sev-snp-measure names them.
const (
	VMMQEMU VMMType = 1
	VMMEC2  VMMType = 2
	VMMGCE  VMMType = 3
)

// String returns the name sev-snp-measure uses for t.
func (t VMMType) String() string {
	switch t {
	case VMMQEMU:
		return "QEMU"
	case VMMEC2:
		return "ec2"
	case VMMGCE:
		return "gce"
	}
	return fmt.Sprintf("VMMType(%d)", int(t))
}

// ParseVMMType accepts "qemu", "ec2" and "gce" in any case.
func ParseVMMType(s string) (VMMType, error) {
	switch strings.ToLower(s) {
	case "qemu":
		return VMMQEMU, nil
	case "ec2":
		return VMMEC2, nil
	case "gce":
		return VMMGCE, nil
	}
	return 0, fmt.Errorf("snp: unknown VMM type %q (want qemu, ec2 or gce)", s)
}

// BSPResetEIP is the reset vector of the boot processor.
const BSPResetEIP = 0xfffffff0

// Byte offsets in the VMSA (struct sev_es_save_area, AMD APM Vol 2 Table
// B-4).
const (
	vmsaES          = 0x000
	vmsaCS          = 0x010
	vmsaSS          = 0x020
	vmsaDS          = 0x030
	vmsaFS          = 0x040
	vmsaGS          = 0x050
	vmsaGDTR        = 0x060
	vmsaLDTR        = 0x070
	vmsaIDTR        = 0x080
	vmsaTR          = 0x090
	vmsaEFER        = 0x0d0
	vmsaCR4         = 0x148
	vmsaCR0         = 0x158
	vmsaDR7         = 0x160
	vmsaDR6         = 0x168
	vmsaRFLAGS      = 0x170
	vmsaRIP         = 0x178
	vmsaGPAT        = 0x268
	vmsaRDX         = 0x310
	vmsaSEVFeatures = 0x3b0
	vmsaXCR0        = 0x3e8
	vmsaMXCSR       = 0x408
	vmsaX87FCW      = 0x410
)

// vmsaBuilder writes fields into a 4 KiB VMSA page.
type vmsaBuilder []byte

func (v vmsaBuilder) seg(off int, selector, attrib uint16, limit uint32, base uint64) {
	binary.LittleEndian.PutUint16(v[off:], selector)
	binary.LittleEndian.PutUint16(v[off+2:], attrib)
	binary.LittleEndian.PutUint32(v[off+4:], limit)
	binary.LittleEndian.PutUint64(v[off+8:], base)
}

func (v vmsaBuilder) u64(off int, x uint64) { binary.LittleEndian.PutUint64(v[off:], x) }
func (v vmsaBuilder) u32(off int, x uint32) { binary.LittleEndian.PutUint32(v[off:], x) }
func (v vmsaBuilder) u16(off int, x uint16) { binary.LittleEndian.PutUint16(v[off:], x) }

// newVMSA returns a VMSA page with the fields every reset state here shares:
// empty descriptor tables, EFER.SVME and CR4.MCE (set by KVM), the
// architectural DR6/DR7/RFLAGS reset values and XCR0 = x87.
func newVMSA() vmsaBuilder {
	v := vmsaBuilder(make([]byte, PageSize))
	v.seg(vmsaGDTR, 0, 0, 0xffff, 0)
	v.seg(vmsaLDTR, 0, 0x82, 0xffff, 0)
	v.seg(vmsaIDTR, 0, 0, 0xffff, 0)
	v.u64(vmsaEFER, 0x1000)
	v.u64(vmsaCR4, 0x40)
	v.u64(vmsaDR7, 0x400)
	v.u64(vmsaDR6, 0xffff0ff0)
	v.u64(vmsaRFLAGS, 0x2)
	v.u64(vmsaXCR0, 0x1)
	return v
}

// VMSAParams describes one vCPU's initial state.
type VMSAParams struct {
	VMM VMMType
	// EIP is the reset vector: BSPResetEIP for the boot processor, the
	// firmware's SEV-ES reset block EIP for application processors.
	EIP uint32
	// VCPUSig is the CPUID signature (family/model/stepping) QEMU puts in
	// RDX at reset; EC2 and GCE ignore it.
	VCPUSig uint64
	// Features is the VMSA SEV_FEATURES value (0x1 = SNPActive).
	Features uint64
}

// BuildVMSA returns the 4 KiB VMSA page of a vCPU at reset, as QEMU, EC2 or
// GCE set it up for an SEV-ES or SEV-SNP guest.
func BuildVMSA(p VMSAParams) ([]byte, error) {
	gPAT := uint64(0x0007040600070406) // PAT MSR reset value (APM Vol 2, A.3)
	var csFlags, ssFlags, trFlags uint16
	var rdx uint64
	var mxcsr uint32
	var fcw uint16
	switch p.VMM {
	case VMMQEMU:
		csFlags, ssFlags, trFlags = 0x9b, 0x93, 0x8b
		rdx = p.VCPUSig
		mxcsr, fcw = 0x1f80, 0x37f
	case VMMEC2:
		csFlags, ssFlags, trFlags = 0x9b, 0x92, 0x83
		if p.EIP == BSPResetEIP {
			csFlags = 0x9a
		}
		rdx = 0x600
	case VMMGCE:
		csFlags, ssFlags, trFlags = 0x9b, 0x93, 0x8b
		gPAT = 0x00070106 // GCE's hypervisor overrides the PAT reset value
		rdx = 0x600
	default:
		return nil, fmt.Errorf("snp: unknown VMM type %d (want VMMQEMU, VMMEC2 or VMMGCE)", int(p.VMM))
	}
	// Real mode at the reset vector: CS base holds the upper EIP bits.
	v := newVMSA()
	v.seg(vmsaES, 0, 0x93, 0xffff, 0)
	v.seg(vmsaCS, 0xf000, csFlags, 0xffff, uint64(p.EIP&0xffff0000))
	v.seg(vmsaSS, 0, ssFlags, 0xffff, 0)
	v.seg(vmsaDS, 0, 0x93, 0xffff, 0)
	v.seg(vmsaFS, 0, 0x93, 0xffff, 0)
	v.seg(vmsaGS, 0, 0x93, 0xffff, 0)
	v.seg(vmsaTR, 0, trFlags, 0xffff, 0)
	v.u64(vmsaCR0, 0x10)
	v.u64(vmsaRIP, uint64(p.EIP&0xffff))
	v.u64(vmsaGPAT, gPAT)
	v.u64(vmsaRDX, rdx)
	v.u64(vmsaSEVFeatures, p.Features)
	v.u32(vmsaMXCSR, mxcsr)
	v.u16(vmsaX87FCW, fcw)
	return v, nil
}

// BSPVMSA returns the boot processor's VMSA page.
func BSPVMSA(vmm VMMType, vcpuSig, features uint64) ([]byte, error) {
	return BuildVMSA(VMSAParams{VMM: vmm, EIP: BSPResetEIP, VCPUSig: vcpuSig, Features: features})
}

// APVMSA returns an application processor's VMSA page; resetEIP is the
// firmware's SEV-ES reset block EIP (ovmf.Firmware.SevESResetEIP).
func APVMSA(vmm VMMType, vcpuSig, features uint64, resetEIP uint32) ([]byte, error) {
	if resetEIP == 0 {
		return nil, fmt.Errorf("snp: the firmware's SEV-ES reset EIP is 0, so it cannot start application processors; use 1 vCPU or a firmware with an SEV-ES reset block")
	}
	return BuildVMSA(VMSAParams{VMM: vmm, EIP: resetEIP, VCPUSig: vcpuSig, Features: features})
}

// SVSMFeatures is the SEV_FEATURES value of the vCPUs QEMU starts at a
// Coconut-SVSM entry point (SNPActive only).
const SVSMFeatures = 0x1

// SVSMVMSA returns the VMSA page QEMU (the Coconut-SVSM fork) builds for
// every vCPU of an SNP guest that boots an SVSM: 32-bit protected mode
// with flat segments, starting at eip. Like the reference tool, it leaves
// the x87 control word at 0.
func SVSMVMSA(eip uint64, vcpuSig uint64) []byte {
	v := newVMSA()
	for _, off := range []int{vmsaES, vmsaSS, vmsaDS, vmsaFS} {
		v.seg(off, 16, 0xc93, 0xffffffff, 0) // flat 32-bit data
	}
	v.seg(vmsaCS, 8, 0xc9b, 0xffffffff, 0) // flat 32-bit code
	v.seg(vmsaGS, 0, 0x93, 0xffff, 0)
	v.seg(vmsaTR, 0, 0x8b, 0xffff, 0)
	v.u64(vmsaCR0, 0x11) // PE
	v.u64(vmsaRIP, eip)
	v.u64(vmsaGPAT, 0x0007040600070406)
	v.u64(vmsaRDX, vcpuSig)
	v.u64(vmsaSEVFeatures, SVSMFeatures)
	v.u32(vmsaMXCSR, 0x1f80)
	return v
}
