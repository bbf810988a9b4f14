package discovery

// CPUIDFunc executes CPUID for a leaf and subleaf and returns EAX, EBX, ECX
// and EDX. Discovery takes it as a parameter so tests can describe any CPU;
// HostCPUID is the real instruction where the platform has one.
type CPUIDFunc func(leaf, subleaf uint32) (eax, ebx, ecx, edx uint32)

// CPUID leaves discovery reads.
const (
	leafMaxExtended = 0x80000000
	leafSEV         = 0x8000001F // AMD memory encryption: features, C-bit, ASID ranges
	leafFeatures7   = 0x7        // EBX bit 2: SGX
	leafSGX         = 0x12       // subleaf 2+: EPC sections
	leafMaxBasic    = 0x0
)

// sevASIDs reads the SEV ASID ranges from CPUID 0x8000001F: ECX is the
// highest ASID for encrypted guests and EDX the lowest ASID for plain SEV
// guests, so SEV-ES and SEV-SNP guests share ASIDs 1..EDX-1 and plain SEV
// guests EDX..ECX. ok is false when the leaf is absent or reports no SEV.
func sevASIDs(cpuid CPUIDFunc) (esSNP, sev int64, ok bool) {
	if cpuid == nil {
		return 0, 0, false
	}
	if maxExt, _, _, _ := cpuid(leafMaxExtended, 0); maxExt < leafSEV {
		return 0, 0, false
	}
	eax, _, ecx, edx := cpuid(leafSEV, 0)
	if eax&(1<<1) == 0 || ecx == 0 { // bit 1: SEV supported
		return 0, 0, false
	}
	minSEV := int64(edx)
	if minSEV < 1 {
		minSEV = 1
	}
	if int64(ecx) < minSEV {
		return minSEV - 1, 0, true
	}
	return minSEV - 1, int64(ecx) - minSEV + 1, true
}

// sgxEPCBytes sums the EPC sections CPUID leaf 0x12 reports (subleaves 2
// and up, each with its type in EAX[3:0]: 1 is a valid section, 0 ends the
// list). ok is false without SGX.
func sgxEPCBytes(cpuid CPUIDFunc) (int64, bool) {
	if cpuid == nil {
		return 0, false
	}
	if maxBasic, _, _, _ := cpuid(leafMaxBasic, 0); maxBasic < leafSGX {
		return 0, false
	}
	if _, ebx, _, _ := cpuid(leafFeatures7, 0); ebx&(1<<2) == 0 {
		return 0, false
	}
	var total int64
	// Real CPUs have a handful of sections; the bound keeps a bad CPUID
	// function from looping forever.
	for sub := uint32(2); sub < 2+64; sub++ {
		eax, _, ecx, edx := cpuid(leafSGX, sub)
		if eax&0xf != 1 {
			break
		}
		total += int64(ecx&0xfffff000) | int64(edx&0xfffff)<<32
	}
	return total, total > 0
}
