package snp

import (
	"fmt"
	"sort"
)

// CPUSig computes the CPUID Fn0000_0001_EAX signature of an AMD CPU from
// its family, model and stepping (AMD CPUID Specification #25481).
func CPUSig(family, model, stepping uint32) uint32 {
	famLow, famHigh := family, uint32(0)
	if family > 0xf {
		famLow, famHigh = 0xf, (family-0xf)&0xff
	}
	return famHigh<<20 | (model>>4&0xf)<<16 | famLow<<8 | (model&0xf)<<4 | stepping&0xf
}

// vcpuTypes lists the QEMU CPU models the reference tool knows, with their
// family, model and stepping.
var vcpuTypes = map[string][3]uint32{
	"EPYC":          {23, 1, 2},
	"EPYC-v1":       {23, 1, 2},
	"EPYC-v2":       {23, 1, 2},
	"EPYC-IBPB":     {23, 1, 2},
	"EPYC-v3":       {23, 1, 2},
	"EPYC-v4":       {23, 1, 2},
	"EPYC-Rome":     {23, 49, 0},
	"EPYC-Rome-v1":  {23, 49, 0},
	"EPYC-Rome-v2":  {23, 49, 0},
	"EPYC-Rome-v3":  {23, 49, 0},
	"EPYC-Milan":    {25, 1, 1},
	"EPYC-Milan-v1": {25, 1, 1},
	"EPYC-Milan-v2": {25, 1, 1},
	"EPYC-Genoa":    {25, 17, 0},
	"EPYC-Genoa-v1": {25, 17, 0},
	"EPYC-Turin":    {26, 0, 0},
}

// VCPUTypeSig returns the signature of a named QEMU vCPU type such as
// "EPYC-v4" or "EPYC-Milan" (names are case-sensitive, as in QEMU).
func VCPUTypeSig(name string) (uint32, error) {
	fms, ok := vcpuTypes[name]
	if !ok {
		return 0, fmt.Errorf("snp: unknown vCPU type %q (known: %v)", name, VCPUTypes())
	}
	return CPUSig(fms[0], fms[1], fms[2]), nil
}

// VCPUTypes returns the known vCPU type names, sorted.
func VCPUTypes() []string {
	names := make([]string, 0, len(vcpuTypes))
	for n := range vcpuTypes {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
