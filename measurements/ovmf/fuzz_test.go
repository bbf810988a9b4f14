package ovmf

import (
	"encoding/binary"
	"testing"

	"github.com/c8s-dev/c8s/measurements/internal/fixtures"
)

// fuzzSeeds adds the fixture firmwares' last 0x600 bytes (where the footer
// table and, for the suffix fixtures, the SEV metadata live) and small
// hand-made tables.
func fuzzSeeds(f *testing.F) {
	for _, name := range []string{"ovmf_AmdSev_suffix.bin", "ovmf_OvmfX64_suffix.bin", "svsm.bin"} {
		b := fixtures.Read(f, "snp", name)
		f.Add(b[max(0, len(b)-0x600):])
	}
	empty := make([]byte, 64)
	binary.LittleEndian.PutUint16(empty[64-0x20-18:], 18)
	copy(empty[64-0x20-16:], FooterTableGUID[:])
	f.Add(empty)
	f.Add([]byte{})
}

// FuzzParse checks that Parse never panics and that what it returns is
// self-consistent.
func FuzzParse(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		fw, err := Parse(data)
		if err != nil {
			if fw != nil {
				t.Fatal("Parse returned both a firmware and an error")
			}
			return
		}
		for _, e := range fw.Table {
			if _, ok := fw.TableEntry(e.GUID); !ok {
				t.Fatalf("entry %s listed but not found", e.GUID)
			}
		}
		_, _ = fw.SevESResetEIP()
		_, _ = fw.SevHashTable()
		_, _ = fw.SVSMEntryOffset()
		if fw.Metadata != nil && fw.Metadata.Offset+16+12*len(fw.Metadata.Sections) > len(data) {
			t.Fatalf("metadata with %d sections at %d overruns %d bytes", len(fw.Metadata.Sections), fw.Metadata.Offset, len(data))
		}
	})
}

// FuzzSevMetadata fuzzes the SEV metadata block behind a valid footer
// table entry pointing at it.
func FuzzSevMetadata(f *testing.F) {
	f.Add([]byte("ASEV\x28\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x00\x00\x80\x00\x00\x90\x00\x00\x01\x00\x00\x00\x00\xd0\x80\x00\x00\x10\x00\x00\x02\x00\x00\x00"), uint32(0x100))
	f.Add([]byte("ASEV\xff\xff\xff\xff\x01\x00\x00\x00\xff\xff\xff\xff"), uint32(16))
	f.Fuzz(func(t *testing.T, md []byte, fromEnd uint32) {
		// Layout: padding, metadata, padding, metadata entry, footer, 0x20 tail.
		const tail = 0x20 + 18 + 4 + 18
		img := make([]byte, 256+len(md)+tail)
		copy(img[256:], md)
		entry := len(img) - tail
		binary.LittleEndian.PutUint32(img[entry:], fromEnd)
		binary.LittleEndian.PutUint16(img[entry+4:], 4+18)
		copy(img[entry+6:], SevMetadataGUID[:])
		footer := entry + 22
		binary.LittleEndian.PutUint16(img[footer:], 22+18)
		copy(img[footer+2:], FooterTableGUID[:])
		fw, err := Parse(img)
		if err != nil {
			return
		}
		if fw.Metadata != nil {
			for _, s := range fw.Metadata.Sections {
				_ = s.Type.String()
			}
		}
	})
}
