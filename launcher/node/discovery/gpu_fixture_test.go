package discovery

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The GPU fixture trees (testdata/gpu-host, testdata/gpu-one) are written
// by this file's generator, so that their binary config spaces are
// documented by code: TestGPUFixturesUpToDate fails when a tree differs
// from what the generator writes, and C8S_UPDATE_FIXTURES=1 go test
// -run TestGPUFixturesUpToDate ./launcher/node/discovery rewrites them.
// The values are typical of the boards, not a dump of real hardware: no
// GPU exists on the machine this was written on.

// fixtureDev is one PCI function in a fixture tree.
type fixtureDev struct {
	addr        string
	vendor, dev uint16
	class       uint32
	driver      string // "" for none
	group       int    // -1 for none
	cdev        string // vfio-dev/<cdev>, "" for none
	bars        [6][2]uint64
	barFlags    [6]uint64
	flr         bool
	extCaps     []uint16
	resetMethod string
}

// H100 SXM5 80GB BARs: BAR0 16 MiB (32-bit), BAR1 128 GiB and BAR3 32 MiB
// (64-bit prefetchable), as lspci shows them on such boards.
func h100BARs(base uint64) ([6][2]uint64, [6]uint64) {
	var b [6][2]uint64
	var f [6]uint64
	b[0] = [2]uint64{0xe2000000, 0xe2ffffff}
	f[0] = ioresourceMem
	b[1] = [2]uint64{base, base + 128<<30 - 1}
	f[1] = ioresourceMem | ioresourcePrefetch | ioresourceMem64
	b[3] = [2]uint64{base + 128<<30, base + 128<<30 + 32<<20 - 1}
	f[3] = ioresourceMem | ioresourcePrefetch | ioresourceMem64
	return b, f
}

func gpuDev(addr string, dev uint16, driver string, group int, cdev string) fixtureDev {
	b, f := h100BARs(0x20000000000)
	return fixtureDev{addr: addr, vendor: NVIDIAVendor, dev: dev, class: 0x030200, driver: driver, group: group, cdev: cdev,
		bars: b, barFlags: f, flr: true, extCaps: []uint16{0x0001, 0x0015, 0x000f}, resetMethod: "flr bus"}
}

// fixtureConfig is the 4096-byte config space of d: PM, MSI and PCI
// Express capabilities (FLR as d.flr), then d.extCaps.
func fixtureConfig(d fixtureDev) []byte {
	b := make([]byte, pcieConfigSize)
	le := binary.LittleEndian
	le.PutUint16(b[cfgVendor:], d.vendor)
	le.PutUint16(b[cfgDevice:], d.dev)
	le.PutUint16(b[cfgStatus:], statusCapList)
	b[0x09], b[0x0a], b[0x0b] = byte(d.class), byte(d.class>>8), byte(d.class>>16)
	b[cfgCapPtr] = 0x60
	b[0x60], b[0x61] = 0x01, 0x68 // power management
	b[0x68], b[0x69] = 0x05, 0x78 // MSI
	b[0x78], b[0x79] = capIDPCIe, 0x00
	le.PutUint16(b[0x7a:], 0x0002) // version 2, endpoint
	devCap := uint32(0x2)          // 512-byte max payload
	if d.flr {
		devCap |= devCapFLR
	}
	le.PutUint32(b[0x78+pcieDevCap:], devCap)
	off := extCapStart
	for i, id := range d.extCaps {
		next := 0
		if i+1 < len(d.extCaps) {
			next = off + 0x40
		}
		le.PutUint32(b[off:], uint32(id)|1<<16|uint32(next)<<20)
		off = next
	}
	return b
}

// writeFixture writes a fixture tree at root: the devices, their IOMMU
// groups, /dev/vfio nodes (plain files), and the files in extra.
func writeFixture(root string, devs []fixtureDev, extra map[string]string) error {
	write := func(p, s string) error {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(s), 0o644)
	}
	link := func(p, target string) error {
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.Symlink(target, p)
	}
	for _, d := range devs {
		dir := filepath.Join(pciDevices, d.addr)
		var res strings.Builder
		for i := 0; i < 13; i++ {
			if i < 6 && d.bars[i][1] != 0 {
				fmt.Fprintf(&res, "0x%016x 0x%016x 0x%016x\n", d.bars[i][0], d.bars[i][1], d.barFlags[i])
			} else {
				fmt.Fprintf(&res, "0x%016x 0x%016x 0x%016x\n", 0, 0, 0)
			}
		}
		files := map[string]string{
			"vendor":   fmt.Sprintf("0x%04x\n", d.vendor),
			"device":   fmt.Sprintf("0x%04x\n", d.dev),
			"class":    fmt.Sprintf("0x%06x\n", d.class),
			"config":   string(fixtureConfig(d)),
			"resource": res.String(),
		}
		if d.resetMethod != "" {
			files["reset_method"] = d.resetMethod + "\n"
		}
		for name, s := range files {
			if err := write(filepath.Join(dir, name), s); err != nil {
				return err
			}
		}
		if d.driver != "" {
			if err := link(filepath.Join(dir, "driver"), "../../../../bus/pci/drivers/"+d.driver); err != nil {
				return err
			}
		}
		if d.group >= 0 {
			g := fmt.Sprint(d.group)
			if err := link(filepath.Join(dir, "iommu_group"), "../../../../kernel/iommu_groups/"+g); err != nil {
				return err
			}
			if err := link(filepath.Join("sys/kernel/iommu_groups", g, "devices", d.addr), "../../../../bus/pci/devices/"+d.addr); err != nil {
				return err
			}
			if d.driver == DriverVFIO {
				if err := write(filepath.Join("dev/vfio", g), ""); err != nil {
					return err
				}
			}
		}
		if d.cdev != "" {
			if err := write(filepath.Join(dir, "vfio-dev", d.cdev, "dev"), "511:0\n"); err != nil {
				return err
			}
			if err := write(filepath.Join("dev/vfio/devices", d.cdev), ""); err != nil {
				return err
			}
		}
	}
	for p, s := range extra {
		if err := write(p, s); err != nil {
			return err
		}
	}
	return nil
}

// gpuFixtures are the trees under testdata.
var gpuFixtures = map[string]func(root string) error{
	// gpu-host: two usable GPUs (an H100 SXM5 on iommufd, an H100 PCIe
	// on a legacy group) and one of each way a GPU is not usable.
	"gpu-host": func(root string) error {
		a100 := gpuDev("0000:a1:00.0", 0x20b0, DriverVFIO, 42, "")
		a100.extCaps = nil
		audio := fixtureDev{addr: "0000:e1:00.1", vendor: NVIDIAVendor, dev: 0x22a3, class: 0x040300, driver: "snd_hda_intel", group: 44}
		nvswitch := fixtureDev{addr: "0000:05:00.0", vendor: NVIDIAVendor, dev: 0x22a3, class: 0x068000, driver: DriverVFIO, group: 45}
		bridge := fixtureDev{addr: "0000:00:01.1", vendor: 0x1022, dev: 0x14ab, class: 0x060400, driver: driverPCIPort, group: 40}
		noFLR := gpuDev("0000:c1:00.0", 0x2331, DriverVFIO, 41, "")
		noFLR.flr, noFLR.resetMethod = false, ""
		devs := []fixtureDev{
			bridge,
			gpuDev("0000:41:00.0", 0x2330, DriverVFIO, 40, "vfio0"),
			noFLR,
			gpuDev("0000:81:00.0", 0x2335, DriverVFIO, 43, "vfio2"),
			gpuDev("0000:61:00.0", 0x2330, "nvidia", 46, ""),
			a100,
			gpuDev("0000:e1:00.0", 0x2330, DriverVFIO, 44, "vfio3"),
			audio,
			nvswitch,
			gpuDev("0000:21:00.0", 0x2330, DriverVFIO, -1, ""),
		}
		return writeFixture(root, devs, map[string]string{
			"dev/iommu": "",
			"etc/c8s/gpu-cc-modes": `# written by provisioning after nvidia_gpu_tools.py --set-cc-mode=on --reset-after-cc-mode-switch
0000:41:00.0 on
0000:c1:00.0 on   # H100 PCIe
0000:81:00.0 off
0000:61:00.0 on
0000:a1:00.0 on
0000:e1:00.0 on
0000:21:00.0 on
`,
		})
	},
	// gpu-one: one usable H100 SXM5 (iommufd), as the Kubernetes e2e's
	// node advertises it.
	"gpu-one": func(root string) error {
		return writeFixture(root, []fixtureDev{gpuDev("0000:41:00.0", 0x2330, DriverVFIO, 40, "vfio0")}, map[string]string{
			"dev/iommu":            "",
			"etc/c8s/gpu-cc-modes": "0000:41:00.0 on\n",
		})
	},
}

func TestGPUFixturesUpToDate(t *testing.T) {
	for name, gen := range gpuFixtures {
		t.Run(name, func(t *testing.T) {
			want := filepath.Join("testdata", name)
			if os.Getenv("C8S_UPDATE_FIXTURES") == "1" {
				if err := os.RemoveAll(want); err != nil {
					t.Fatal(err)
				}
				if err := gen(want); err != nil {
					t.Fatal(err)
				}
			}
			got := t.TempDir()
			if err := gen(got); err != nil {
				t.Fatal(err)
			}
			a, b := snapshotTree(t, got), snapshotTree(t, want)
			for p, v := range a {
				if b[p] != v {
					t.Errorf("%s/%s differs from what the generator writes (C8S_UPDATE_FIXTURES=1 rewrites it)", want, p)
				}
			}
			for p := range b {
				if _, ok := a[p]; !ok {
					t.Errorf("%s/%s is not what the generator writes (C8S_UPDATE_FIXTURES=1 rewrites the tree)", want, p)
				}
			}
		})
	}
}

// snapshotTree maps each path under root to its content or link target.
func snapshotTree(t *testing.T, root string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			m[rel] = "-> " + target
			return err
		case d.IsDir():
			return nil
		}
		data, err := os.ReadFile(p)
		m[rel] = string(bytes.Clone(data))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
