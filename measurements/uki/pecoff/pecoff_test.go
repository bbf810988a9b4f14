package pecoff

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"
)

// Offsets in the synthetic image built by minimalPE.
const (
	tLfanew   = 0x40
	tCoff     = tLfanew + 4
	tOpt      = tCoff + coffHeaderSize
	tOptSize  = 112 + 16*8
	tSecTab   = tOpt + tOptSize
	tHeaders  = 0x200
	tRawStart = 0x200
)

// minimalPE builds a PE32+ image with the given sections, each holding
// the given raw data (padded to 0x200 bytes) laid out after the headers.
func minimalPE(names []string, data [][]byte) []byte {
	img := make([]byte, tHeaders)
	img[0], img[1] = 'M', 'Z'
	binary.LittleEndian.PutUint32(img[0x3c:], tLfanew)
	copy(img[tLfanew:], "PE\x00\x00")
	binary.LittleEndian.PutUint16(img[tCoff:], 0x8664)
	binary.LittleEndian.PutUint16(img[tCoff+2:], uint16(len(names)))
	binary.LittleEndian.PutUint16(img[tCoff+16:], tOptSize)
	binary.LittleEndian.PutUint16(img[tOpt:], magicPE32Plus)
	binary.LittleEndian.PutUint32(img[tOpt+60:], tHeaders)
	binary.LittleEndian.PutUint32(img[tOpt+64:], 0xdeadbeef) // checksum: excluded from the hash
	binary.LittleEndian.PutUint32(img[tOpt+108:], 16)
	va := uint32(0x1000)
	for i, n := range names {
		raw := append([]byte(nil), data[i]...)
		for len(raw)%0x200 != 0 {
			raw = append(raw, 0)
		}
		h := img[tSecTab+i*sectionHdrSize:]
		copy(h, n)
		binary.LittleEndian.PutUint32(h[8:], uint32(len(data[i])))
		binary.LittleEndian.PutUint32(h[12:], va)
		binary.LittleEndian.PutUint32(h[16:], uint32(len(raw)))
		binary.LittleEndian.PutUint32(h[20:], uint32(len(img)))
		img = append(img, raw...)
		va += 0x1000 * uint32(1+len(raw)/0x1000)
	}
	return img
}

func TestParseMinimal(t *testing.T) {
	img := minimalPE([]string{".text", ".linux"}, [][]byte{[]byte("code"), []byte("kernel!")})
	f, err := Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	if !f.PE32Plus || f.Machine != 0x8664 || len(f.Sections) != 2 {
		t.Fatalf("parsed %+v", f)
	}
	s, ok := f.Section(".linux")
	if !ok || string(f.FileData(s)) != "kernel!" {
		t.Fatalf(".linux = %+v, %v", s, ok)
	}
	if _, ok := f.Section(".initrd"); ok {
		t.Fatal("found a section that is not there")
	}
	// VirtualSize larger than the raw data: the loaded section is zero-filled.
	binary.LittleEndian.PutUint32(img[tSecTab+sectionHdrSize+8:], 0x300)
	f, err = Parse(img)
	if err != nil {
		t.Fatal(err)
	}
	s, _ = f.Section(".linux")
	var buf bytes.Buffer
	if err := f.WriteMemoryData(&buf, s); err != nil {
		t.Fatal(err)
	}
	if buf.Len() != 0x300 || !bytes.HasPrefix(buf.Bytes(), []byte("kernel!")) || len(bytes.Trim(buf.Bytes()[7:], "\x00")) != 0 {
		t.Fatalf("memory data: %d bytes, prefix %q", buf.Len(), buf.Bytes()[:8])
	}
}

// TestAuthenticodeExclusions checks the digest ignores exactly the checksum,
// the certificate directory entry and the certificate table, and nothing
// else.
func TestAuthenticodeExclusions(t *testing.T) {
	img := minimalPE([]string{".text"}, [][]byte{[]byte("code")})
	digest := func(b []byte) []byte {
		t.Helper()
		f, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		d, err := f.AuthenticodeSHA256()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	base := digest(img)

	changed := append([]byte(nil), img...)
	binary.LittleEndian.PutUint32(changed[tOpt+64:], 0x12345678)
	if !bytes.Equal(digest(changed), base) {
		t.Error("changing the CheckSum changed the digest")
	}

	// Append a certificate table and point the directory entry at it.
	signed := append(append([]byte(nil), img...), bytes.Repeat([]byte{0xcc}, 16)...)
	binary.LittleEndian.PutUint32(signed[tOpt+112+4*8:], uint32(len(img)))
	binary.LittleEndian.PutUint32(signed[tOpt+112+4*8+4:], 16)
	if !bytes.Equal(digest(signed), base) {
		t.Error("adding a certificate table changed the digest")
	}

	// Trailing data that is not a certificate is hashed.
	trailing := append(append([]byte(nil), img...), "tail"...)
	if bytes.Equal(digest(trailing), base) {
		t.Error("trailing data was not hashed")
	}
	want := sha256.New()
	want.Write(img[:tOpt+64])
	want.Write(img[tOpt+68 : tOpt+112+4*8])
	want.Write(img[tOpt+112+5*8 : tHeaders])
	want.Write(img[tRawStart:])
	want.Write([]byte("tail"))
	if got := digest(trailing); !bytes.Equal(got, want.Sum(nil)) {
		t.Errorf("digest %x, want %x computed by hand", got, want.Sum(nil))
	}

	// A byte in a section is covered.
	changed = append([]byte(nil), img...)
	changed[tRawStart] ^= 1
	if bytes.Equal(digest(changed), base) {
		t.Error("changing section data did not change the digest")
	}
}

func TestParseMalformed(t *testing.T) {
	good := minimalPE([]string{".text"}, [][]byte{[]byte("code")})
	mod := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	put32 := func(off int, v uint32) []byte {
		return mod(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b })
	}
	put16 := func(off int, v uint16) []byte {
		return mod(func(b []byte) []byte { binary.LittleEndian.PutUint16(b[off:], v); return b })
	}
	cases := []struct {
		name string
		img  []byte
		want string
	}{
		{"empty", nil, "no MZ DOS header"},
		{"not MZ", mod(func(b []byte) []byte { b[0] = 'X'; return b }), "no MZ DOS header"},
		{"lfanew past end", put32(0x3c, 0xfffffff0), "past the end"},
		{"no PE signature", mod(func(b []byte) []byte { b[tLfanew] = 'X'; return b }), "no PE signature"},
		{"no sections", put16(tCoff+2, 0), "PE file has no sections"},
		{"too many sections", put16(tCoff+2, 200), "more than the PE limit"},
		{"bad magic", put16(tOpt, 0x999), "unknown optional header magic"},
		{"short optional header", put16(tCoff+16, 50), "too short"},
		{"optional header past end", put16(tCoff+16, 0xffff), "does not fit"},
		{"too many data directories", put32(tOpt+108, 0x10000), "data directories do not fit"},
		{"section table past end", put16(tCoff+2, 90), "section table"},
		{"headers past end", put32(tOpt+60, 0x100000), "SizeOfHeaders"},
		{"headers too small", put32(tOpt+60, 0x100), "does not cover"},
		{"section past end", put32(tSecTab+16, 0x100000), "runs past the end"},
		{"section offset past end", put32(tSecTab+20, 0xffffff00), "runs past the end"},
		{"cert table past end", put32(tOpt+112+4*8+4, 0x100000), "certificate table"},
		{"truncated", good[:tSecTab+10], "section table"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.img)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse error %v, want one containing %q", err, c.want)
			}
		})
	}
	if _, err := Parse([]byte("hello")); !errors.Is(err, ErrNotPE) {
		t.Errorf("Parse(text) = %v, want ErrNotPE", err)
	}
	// With fewer than five data directories there is no certificate entry.
	few := put32(tOpt+108, 4)
	if f, err := Parse(few); err != nil {
		t.Errorf("Parse(4 data directories): %v", err)
	} else if f.CertificateTable() != (DataDirectory{}) || f.certDirOff != -1 {
		t.Errorf("Parse(4 data directories): certificate table %+v at %d", f.CertificateTable(), f.certDirOff)
	}
	if _, err := Parse([]byte("MZ")); !errors.Is(err, ErrNotPE) {
		t.Errorf("Parse(MZ) = %v, want ErrNotPE", err)
	}
}

// seedImages are the fuzz seeds: synthetic images, plus the systemd-stub
// when the host has it.
func seedImages() [][]byte {
	seeds := [][]byte{
		minimalPE([]string{".text"}, [][]byte{[]byte("code")}),
		minimalPE([]string{".text", ".linux", ".cmdline"}, [][]byte{[]byte("x"), bytes.Repeat([]byte{1}, 700), []byte("quiet")}),
	}
	if b, err := os.ReadFile("/usr/lib/systemd/boot/efi/linuxx64.efi.stub"); err == nil {
		seeds = append(seeds, b)
	}
	return seeds
}

func FuzzParse(f *testing.F) {
	for _, s := range seedImages() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		pf, err := Parse(data)
		if err != nil {
			return
		}
		if _, err := pf.AuthenticodeSHA256(); err != nil {
			return
		}
		for _, s := range pf.Sections {
			_ = pf.FileData(s)
			if s.VirtualSize <= 1<<20 {
				_ = pf.WriteMemoryData(sha256.New(), s)
			}
		}
	})
}

// TestAuthenticodePE32 checks the PE32 (32-bit) header layout, whose data
// directory starts 16 bytes earlier than PE32+'s.
func TestAuthenticodePE32(t *testing.T) {
	// Rewrite the PE32+ image's optional header as PE32: same size, magic
	// 0x10b, NumberOfRvaAndSizes at 92 and the directory at 96.
	img := minimalPE([]string{".text"}, [][]byte{[]byte("code32")})
	binary.LittleEndian.PutUint16(img[tOpt:], magicPE32)
	binary.LittleEndian.PutUint32(img[tOpt+108:], 0)
	binary.LittleEndian.PutUint32(img[tOpt+92:], 16)
	cert := bytes.Repeat([]byte{0xcc}, 8)
	signed := append(append([]byte(nil), img...), cert...)
	binary.LittleEndian.PutUint32(signed[tOpt+96+4*8:], uint32(len(img)))
	binary.LittleEndian.PutUint32(signed[tOpt+96+4*8+4:], uint32(len(cert)))
	f, err := Parse(signed)
	if err != nil {
		t.Fatal(err)
	}
	if f.PE32Plus || f.CertificateTable().Size != 8 {
		t.Fatalf("parsed PE32 as %+v", f)
	}
	got, err := f.AuthenticodeSHA256()
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.New()
	want.Write(signed[:tOpt+64])
	want.Write(signed[tOpt+68 : tOpt+96+4*8])
	want.Write(signed[tOpt+96+5*8 : tHeaders])
	want.Write(signed[tRawStart:len(img)])
	if !bytes.Equal(got, want.Sum(nil)) {
		t.Errorf("PE32 digest %x, want %x computed by hand", got, want.Sum(nil))
	}
}
