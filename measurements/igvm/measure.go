package igvm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/c8s-dev/c8s/measurements/snp"
)

// Loader selects whose rules SNPLaunchDigest follows where the reference
// implementations differ. Neither QEMU nor igvmmeasure looks at the
// PAGE_DATA shared flag, so neither loader here does: a shared page is
// measured like any other.
type Loader int

const (
	// LoaderQEMU follows QEMU's igvm-cfg backend with KVM (the default):
	//   - consecutive PAGE_DATA directives with equal flags, data type, mask
	//     and data presence are gathered into one region that is measured
	//     when the next PAGE_DATA directive does not extend it (or at the
	//     end), so a PARAMETER_INSERT that follows a region is measured
	//     before it;
	//   - a PARAMETER_INSERT measures every page of its parameter area as
	//     unmeasured;
	//   - VP contexts are not measured in place: KVM measures one VMSA per
	//     vCPU at launch finish, at snp.VMSAGPA, in vCPU order. vCPU i uses
	//     the file's VP context with VP index i; a vCPU the file gives no
	//     context starts from the architectural reset state (see
	//     MeasureOptions.ResetVCPUSig).
	LoaderQEMU Loader = iota
	// LoaderIGVMMeasure follows coconut-svsm's igvmmeasure: directives in
	// file order, each VP context measured where it appears at its own GPA,
	// a PARAMETER_INSERT measured as one unmeasured page, and MeasureOptions.
	// VCPUs ignored.
	LoaderIGVMMeasure
)

// String names the loader.
func (l Loader) String() string {
	if l == LoaderIGVMMeasure {
		return "igvmmeasure"
	}
	return "qemu"
}

// ParseLoader accepts "qemu" and "igvmmeasure".
func ParseLoader(s string) (Loader, error) {
	switch s {
	case "qemu", "":
		return LoaderQEMU, nil
	case "igvmmeasure":
		return LoaderIGVMMeasure, nil
	}
	return 0, fmt.Errorf("igvm: unknown loader %q (want qemu or igvmmeasure)", s)
}

// MeasureOptions tune SNPLaunchDigest.
type MeasureOptions struct {
	// Loader is LoaderQEMU (zero value) or LoaderIGVMMeasure.
	Loader Loader
	// VCPUs is the number of vCPUs the guest is started with (LoaderQEMU).
	// Zero means one per VP context in the file (at least 1).
	VCPUs int
	// NormalZeroPages measures a PAGE_DATA directive without data as a
	// normal page full of zeros instead of as a native SNP zero page.
	// The IGVM specification asks loaders for the former; igvmmeasure
	// offers both (--native-zero); QEMU's loader hands such pages to its
	// confidential-guest backend as "zero" pages, and the SEV backend of
	// the QEMU IGVM series read for this package launch-updates those as
	// normal pages (set this to predict that QEMU). The default (false,
	// native zero pages, igvmmeasure --native-zero) is the only rule under
	// which an IGVM file can reproduce an OVMF boot's digest, whose
	// SNP_SEC_MEM pages are native zero pages; FromOVMF files rely on it.
	NormalZeroPages bool
	// ResetVCPUSig is the CPUID signature QEMU puts in RDX of a vCPU the
	// file gives no VP context (LoaderQEMU, VCPUs above the contexts):
	// such a vCPU is measured as the architectural reset state
	// (snp.BuildVMSA with snp.BSPResetEIP), with the SEV_FEATURES of the
	// boot processor's VMSA. Zero refuses such vCPUs.
	ResetVCPUSig uint64
}

// VCPUSource says where the VMSA of one vCPU came from.
type VCPUSource struct {
	VCPU int
	// FromFile is true when the file's VP context was used, false for the
	// reset state.
	FromFile bool
	GPA      uint64
}

// Measurement is the result of SNPLaunchDigest.
type Measurement struct {
	Digest snp.Digest
	// Mask is the SEV-SNP compatibility mask that was measured.
	Mask uint32
	// Pages counts the PAGE_INFO updates by page type.
	Pages map[snp.PageType]int
	// VMSAs lists the measured VMSA pages in order.
	VMSAs []VCPUSource
	// Policy is the SEV-SNP GUEST_POLICY, if the file has one.
	Policy *uint64
	// IDBlock is the file's SNP ID block, if it has one for SEV-SNP.
	IDBlock *SNPIDBlock
	// Notes are things worth knowing that did not prevent measuring, such
	// as directives QEMU's loader would refuse.
	Notes []string
}

// ErrIDBlockMismatch is returned (wrapped) by (*Measurement).CheckIDBlock.
var ErrIDBlockMismatch = errors.New("igvm: launch digest does not match the SNP ID block")

// CheckIDBlock compares the digest with the ID block's expected launch
// digest, if the file has an ID block.
func (m *Measurement) CheckIDBlock() error {
	if m.IDBlock == nil || snp.Digest(m.IDBlock.LD) == m.Digest {
		return nil
	}
	return fmt.Errorf("%w: the ID block expects %s, the file measures %s", ErrIDBlockMismatch, snp.Digest(m.IDBlock.LD), m.Digest)
}

// qemuHandled are the directive types QEMU's igvm-cfg loader processes; it
// refuses a file with any other directive.
var qemuHandled = map[HeaderType]bool{
	TypePageData: true, TypeVPContext: true, TypeParameterArea: true, TypeParameterInsert: true,
	TypeMemoryMap: true, TypeVPCount: true, TypeEnvironmentInfo: true, TypeRequiredMemory: true,
	TypeSNPIDBlock: true, TypeMADT: true,
}

// sevFeaturesOffset is the offset of SEV_FEATURES in a VMSA page.
const sevFeaturesOffset = 0x3B0

// SNPLaunchDigest computes the SEV-SNP launch digest of the directives of f
// that apply to its SEV-SNP platform.
func SNPLaunchDigest(f *File, opt MeasureOptions) (*Measurement, error) {
	mask, err := f.PlatformMask(PlatformSEVSNP)
	if err != nil {
		return nil, err
	}
	if opt.VCPUs < 0 {
		return nil, fmt.Errorf("igvm: %d vCPUs", opt.VCPUs)
	}
	m := &measurer{opt: opt, mask: mask, ld: snp.NewLaunchDigest(), areas: map[uint32]uint64{}, used: map[uint32]bool{},
		res: &Measurement{Mask: mask, Pages: map[snp.PageType]int{}}, vmsas: map[uint16]*VPContext{}}
	for _, h := range f.Initialization {
		if p, ok := h.(*GuestPolicy); ok && p.CompatibilityMask&mask != 0 {
			v := p.Policy
			m.res.Policy = &v
		}
	}
	for i, h := range f.Directives {
		if err := m.directive(i, h); err != nil {
			return nil, fmt.Errorf("igvm: directive %d (%s): %w", i, h.Type(), err)
		}
	}
	if err := m.flush(); err != nil {
		return nil, err
	}
	if opt.Loader == LoaderQEMU {
		if err := m.qemuVMSAs(); err != nil {
			return nil, err
		}
	}
	m.res.Digest = m.ld.Digest()
	return m.res, nil
}

type measurer struct {
	opt   MeasureOptions
	mask  uint32
	ld    *snp.LaunchDigest
	res   *Measurement
	areas map[uint32]uint64 // parameter area index -> size
	used  map[uint32]bool   // parameter areas already inserted
	vmsas map[uint16]*VPContext

	// The pending QEMU page region.
	region    []*PageData
	lastIndex int
}

func (m *measurer) update(t snp.PageType, gpa uint64, page []byte) error {
	m.res.Pages[t]++
	return m.ld.UpdatePage(t, gpa, page)
}

func (m *measurer) directive(i int, h Header) error {
	if !Applies(h, m.mask) {
		return nil
	}
	if m.opt.Loader == LoaderQEMU && !qemuHandled[h.Type()] {
		m.res.Notes = append(m.res.Notes, fmt.Sprintf("directive %d (%s): QEMU's IGVM loader does not handle this type and refuses the file", i, h.Type()))
	}
	switch h := h.(type) {
	case *PageData:
		if m.opt.Loader == LoaderIGVMMeasure {
			return m.pages([]*PageData{h})
		}
		if len(m.region) > 0 && !m.extends(i, h) {
			if err := m.flush(); err != nil {
				return err
			}
		}
		m.region = append(m.region, h)
		m.lastIndex = i
	case *ParameterArea:
		if _, dup := m.areas[h.Index]; dup {
			return fmt.Errorf("parameter area %d declared twice", h.Index)
		}
		m.areas[h.Index] = h.NumberOfBytes
	case *ParameterInsert:
		size, ok := m.areas[h.Index]
		if !ok {
			return fmt.Errorf("PARAMETER_INSERT of undeclared parameter area %d", h.Index)
		}
		if m.used[h.Index] {
			return fmt.Errorf("parameter area %d inserted twice; an area can be inserted once", h.Index)
		}
		m.used[h.Index] = true
		if m.opt.Loader == LoaderIGVMMeasure {
			size = PageSize
		}
		if size%PageSize != 0 || size > 1<<32 {
			return fmt.Errorf("parameter area %d is %#x bytes, not a page multiple below 4 GiB", h.Index, size)
		}
		for off := uint64(0); off < size; off += PageSize {
			if err := m.update(snp.PageUnmeasured, h.GPA+off, nil); err != nil {
				return err
			}
		}
	case *VPContext:
		if len(h.Data) != PageSize {
			return fmt.Errorf("SEV-SNP VP context for VP %d has %d bytes of VMSA, want a 4096-byte page", h.VPIndex, len(h.Data))
		}
		if m.opt.Loader == LoaderIGVMMeasure {
			m.res.VMSAs = append(m.res.VMSAs, VCPUSource{VCPU: int(h.VPIndex), FromFile: true, GPA: h.GPA})
			return m.update(snp.PageVMSA, h.GPA, h.Data)
		}
		m.vmsas[h.VPIndex] = h // QEMU replaces an earlier context
	case *SNPIDBlock:
		if m.res.IDBlock != nil {
			return errors.New("more than one SNP ID block for SEV-SNP")
		}
		m.res.IDBlock = h
	case *Unknown:
		if h.HeaderType&OptionalBit == 0 {
			return errors.New("unknown directive without the optional bit")
		}
	}
	return nil
}

// extends reports whether page h, directive i, continues the pending QEMU
// region: adjacent directive, next GPA, same flags, type, mask and data
// presence.
func (m *measurer) extends(i int, h *PageData) bool {
	last := m.region[len(m.region)-1]
	return i == m.lastIndex+1 && last.GPA+last.Flags.Size() == h.GPA && last.Flags == h.Flags &&
		last.DataType == h.DataType && last.CompatibilityMask == h.CompatibilityMask &&
		(len(last.Data) == 0) == (len(h.Data) == 0)
}

func (m *measurer) flush() error {
	region := m.region
	m.region = nil
	return m.pages(region)
}

// pages measures PAGE_DATA directives, each as its 4 KiB pages.
func (m *measurer) pages(region []*PageData) error {
	for _, p := range region {
		var typ snp.PageType
		switch p.DataType {
		case PageDataNormal:
			switch {
			case p.Flags&PageUnmeasured != 0:
				typ = snp.PageUnmeasured
			case len(p.Data) == 0 && !m.opt.NormalZeroPages:
				typ = snp.PageZero
			default:
				typ = snp.PageNormal
			}
		case PageDataSecrets:
			typ = snp.PageSecrets
		case PageDataCPUIDData, PageDataCPUIDXF:
			typ = snp.PageCPUID
		default:
			return fmt.Errorf("PAGE_DATA at GPA %#x has unknown data type %s", p.GPA, p.DataType)
		}
		for off := uint64(0); off < p.Flags.Size(); off += PageSize {
			var data []byte
			if typ == snp.PageNormal && off == 0 {
				data = p.Data // the rest of a 2 MiB page is zero
			}
			if err := m.update(typ, p.GPA+off, data); err != nil {
				return fmt.Errorf("PAGE_DATA at GPA %#x: %w", p.GPA, err)
			}
		}
	}
	return nil
}

// qemuVMSAs measures one VMSA per vCPU, as KVM does at launch finish.
func (m *measurer) qemuVMSAs() error {
	n := m.opt.VCPUs
	if n == 0 {
		n = max(len(m.vmsas), 1)
	}
	for idx := range m.vmsas {
		if int(idx) >= n {
			return fmt.Errorf("igvm: the file has a VP context for VP index %d but the guest has %d vCPUs; QEMU refuses a context for a vCPU it does not have", idx, n)
		}
	}
	var resetVMSA []byte
	for i := 0; i < n; i++ {
		if vp, ok := m.vmsas[uint16(i)]; ok {
			m.res.VMSAs = append(m.res.VMSAs, VCPUSource{VCPU: i, FromFile: true, GPA: snp.VMSAGPA})
			if f := binary.LittleEndian.Uint64(vp.Data[sevFeaturesOffset:]); f != 1 {
				m.res.Notes = append(m.res.Notes, fmt.Sprintf("VP %d: SEV_FEATURES is %#x; QEMU's IGVM loader, as introduced, accepts only 0x1 (SNPActive) in an SEV-SNP VMSA", i, f))
			}
			if vp.GPA != snp.VMSAGPA {
				m.res.Notes = append(m.res.Notes, fmt.Sprintf("VP %d: the file places its VMSA at GPA %#x; KVM measures every VMSA at %#x", i, vp.GPA, uint64(snp.VMSAGPA)))
			}
			if err := m.update(snp.PageVMSA, snp.VMSAGPA, vp.Data); err != nil {
				return err
			}
			continue
		}
		if resetVMSA == nil {
			if m.opt.ResetVCPUSig == 0 {
				return fmt.Errorf("igvm: vCPU %d has no VP context in the file (it has %d); QEMU starts it from the reset state, which needs its vCPU signature (the vCPU type, --vcpu-type), or measure with %d vCPUs", i, len(m.vmsas), max(len(m.vmsas), 1))
			}
			var features uint64
			if bsp, ok := m.vmsas[0]; ok {
				features = binary.LittleEndian.Uint64(bsp.Data[sevFeaturesOffset:])
			} else {
				features = 1 // SNPActive
			}
			v, err := snp.BuildVMSA(snp.VMSAParams{VMM: snp.VMMQEMU, EIP: snp.BSPResetEIP, VCPUSig: m.opt.ResetVCPUSig, Features: features})
			if err != nil {
				return err
			}
			resetVMSA = v
		}
		m.res.VMSAs = append(m.res.VMSAs, VCPUSource{VCPU: i, GPA: snp.VMSAGPA})
		if err := m.update(snp.PageVMSA, snp.VMSAGPA, resetVMSA); err != nil {
			return err
		}
	}
	return nil
}
