package discovery

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// PCI configuration space offsets and capability IDs (PCI Local Bus 3.0
// and PCI Express Base 5.0).
const (
	cfgVendor      = 0x00
	cfgDevice      = 0x02
	cfgStatus      = 0x06
	cfgCapPtr      = 0x34
	statusCapList  = 1 << 4
	capIDPCIe      = 0x10
	pcieDevCap     = 0x04
	devCapFLR      = 1 << 28
	extCapStart    = 0x100
	pciConfigSize  = 256
	pcieConfigSize = 4096
)

// extCapNames are the PCIe extended capabilities discovery reports.
var extCapNames = map[uint16]string{
	0x0001: "AER",
	0x000d: "ACS",
	0x000f: "ATS",
	0x0010: "SR-IOV",
	0x0015: "ResizableBAR",
	0x0023: "DVSEC",
	0x002e: "DOE",
	0x0030: "IDE",
}

// pciConfig is what discovery reads from a device's configuration space
// (/sys/bus/pci/devices/X/config: 256 bytes, 4096 when read as root).
type pciConfig struct {
	Vendor, Device uint16
	// PCIe is true when the device has a PCI Express capability.
	PCIe bool
	// FLR is the PCIe Device Capabilities' Function Level Reset bit.
	FLR bool
	// ExtCaps are the extended capabilities found, by name, in order.
	ExtCaps []string
	// Extended is true when the extended configuration space was readable
	// (4096 bytes): ExtCaps is meaningful only then.
	Extended bool
}

// parsePCIConfig walks the capability lists of a configuration space
// dump. Loops and out-of-range pointers end a walk with an error.
func parsePCIConfig(b []byte) (pciConfig, error) {
	var c pciConfig
	if len(b) < 64 {
		return c, fmt.Errorf("config space is %d bytes, want at least 64", len(b))
	}
	le := binary.LittleEndian
	c.Vendor, c.Device = le.Uint16(b[cfgVendor:]), le.Uint16(b[cfgDevice:])
	if le.Uint16(b[cfgStatus:])&statusCapList != 0 {
		limit := min(len(b), pciConfigSize)
		ptr := int(b[cfgCapPtr]) &^ 3
		for n := 0; ptr != 0; n++ {
			if n > 48 || ptr < 0x40 || ptr+2 > limit {
				return c, fmt.Errorf("capability list broken at %#x", ptr)
			}
			if b[ptr] == capIDPCIe {
				c.PCIe = true
				if ptr+pcieDevCap+4 <= limit {
					c.FLR = le.Uint32(b[ptr+pcieDevCap:])&devCapFLR != 0
				}
			}
			ptr = int(b[ptr+1]) &^ 3
		}
	}
	if !c.PCIe || len(b) < pcieConfigSize {
		return c, nil
	}
	c.Extended = true
	for off, n := extCapStart, 0; off != 0; n++ {
		if n > (pcieConfigSize-extCapStart)/4 || off < extCapStart || off+4 > pcieConfigSize {
			return c, fmt.Errorf("extended capability list broken at %#x", off)
		}
		h := le.Uint32(b[off:])
		if h == 0 || h == 0xffffffff {
			break
		}
		if name, ok := extCapNames[uint16(h&0xffff)]; ok {
			c.ExtCaps = append(c.ExtCaps, name)
		}
		off = int(h>>20) &^ 3
	}
	return c, nil
}

// BAR is one of a device's base address registers, as the kernel sized it.
type BAR struct {
	Index int    `json:"index"`
	Size  uint64 `json:"size"`
	// Mem64 and Prefetch are the BAR's type: 64-bit memory, prefetchable.
	Mem64    bool `json:"mem64,omitempty"`
	Prefetch bool `json:"prefetch,omitempty"`
}

// Linux IORESOURCE_* flags in /sys/bus/pci/devices/X/resource.
const (
	ioresourceMem      = 0x00000200
	ioresourcePrefetch = 0x00002000
	ioresourceMem64    = 0x00100000
)

// parseResource reads the first six lines of a sysfs resource file
// ("start end flags" in hex): the memory BARs with a size.
func parseResource(data []byte) ([]BAR, error) {
	var bars []BAR
	sc := bufio.NewScanner(bytes.NewReader(data))
	for i := 0; i < 6 && sc.Scan(); i++ {
		f := strings.Fields(sc.Text())
		if len(f) != 3 {
			return nil, fmt.Errorf("resource line %d: want start end flags, got %q", i, sc.Text())
		}
		var v [3]uint64
		for j := range f {
			n, err := strconv.ParseUint(strings.TrimPrefix(f[j], "0x"), 16, 64)
			if err != nil {
				return nil, fmt.Errorf("resource line %d: %v", i, err)
			}
			v[j] = n
		}
		start, end, flags := v[0], v[1], v[2]
		if flags&ioresourceMem == 0 || end <= start {
			continue
		}
		bars = append(bars, BAR{Index: i, Size: end - start + 1, Mem64: flags&ioresourceMem64 != 0, Prefetch: flags&ioresourcePrefetch != 0})
	}
	return bars, nil
}
