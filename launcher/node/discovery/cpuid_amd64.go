package discovery

// HostCPUID is the CPUID instruction of the CPU this runs on.
var HostCPUID CPUIDFunc = cpuid

// cpuid is implemented in cpuid_amd64.s.
func cpuid(leaf, subleaf uint32) (eax, ebx, ecx, edx uint32)
