package uki

// These tests build real UKIs from Debian's systemd-stub with objcopy and
// compare the results with the reference tools run at test time:
// systemd-measure (package systemd) for PCR 11 and osslsigncode for the
// Authenticode digest. A test skips, naming what is missing, only when a
// tool or input file is absent; hack/install-deps.sh installs them all.

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const (
	stubPath       = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	systemdMeasure = "/usr/lib/systemd/systemd-measure"
)

func need(t testing.TB, path, pkg string) string {
	t.Helper()
	if filepath.IsAbs(path) {
		if _, err := os.Stat(path); err != nil {
			t.Skipf("%s is missing (Debian package %s; run hack/install-deps.sh)", path, pkg)
		}
		return path
	}
	p, err := exec.LookPath(path)
	if err != nil {
		t.Skipf("%s is not on PATH (Debian package %s; run hack/install-deps.sh)", path, pkg)
	}
	return p
}

// kernel returns the path of an installed Debian kernel image.
func kernel(t testing.TB) string {
	t.Helper()
	m, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(m) == 0 {
		t.Skip("no /boot/vmlinuz-* (Debian package linux-image-amd64; run hack/install-deps.sh)")
	}
	return m[0]
}

type payload struct {
	name, file string
}

// testPayloads writes the section payloads of a test UKI into dir.
func testPayloads(t testing.TB, dir string, all bool) []payload {
	t.Helper()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, strings.TrimPrefix(name, "."))
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ps := []payload{
		{".linux", kernel(t)},
		{".osrel", write(".osrel", []byte("ID=c8s\nVERSION_ID=1\n"))},
		{".cmdline", write(".cmdline", []byte("console=ttyS0 quiet c8s.test=1"))},
	}
	if all {
		initrd := make([]byte, 300_001)
		for i := range initrd {
			initrd[i] = byte(i * 7)
		}
		ps = append(ps,
			payload{".initrd", write(".initrd", initrd)},
			payload{".splash", write(".splash", []byte("BM not really a bitmap"))},
			payload{".dtb", write(".dtb", []byte{0xd0, 0x0d, 0xfe, 0xed, 1, 2, 3})},
			payload{".pcrpkey", write(".pcrpkey", []byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"))},
			// Not measured by the 252 stub, nor known to its systemd-measure.
			payload{".uname", write(".uname", []byte("6.1.0-test"))},
		)
	}
	return ps
}

// buildUKI assembles a UKI from the Debian stub with objcopy, placing each
// section at its own virtual address above the stub's sections.
func buildUKI(t testing.TB, dir string, ps []payload) string {
	t.Helper()
	objcopy := need(t, "objcopy", "binutils")
	need(t, stubPath, "systemd-boot-efi")
	args := []string{}
	vma := uint64(0x1000000)
	for _, p := range ps {
		st, err := os.Stat(p.file)
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "--add-section", p.name+"="+p.file,
			"--change-section-vma", fmt.Sprintf("%s=%#x", p.name, vma))
		vma += (uint64(st.Size()) + 0x10fffff) &^ 0xfffff
	}
	out := filepath.Join(dir, "uki.efi")
	args = append(args, stubPath, out)
	if b, err := exec.Command(objcopy, args...).CombinedOutput(); err != nil {
		t.Fatalf("objcopy %v: %v\n%s", args, err, b)
	}
	return out
}

// referencePCR11 runs systemd-measure calculate for the payloads and
// returns PCR 11 per phase path and bank: with stubOnly the value right
// after the stub (phase ""), otherwise the tool's default phase paths.
func referencePCR11(t testing.TB, ps []payload, stubOnly bool) map[string]map[Bank]string {
	t.Helper()
	tool := need(t, systemdMeasure, "systemd")
	args := []string{"calculate", "--json=short"}
	if stubOnly {
		args = append(args, "--phase=")
	}
	for _, b := range Banks {
		args = append(args, "--bank="+string(b))
	}
	for _, p := range ps {
		if p.name == ".uname" {
			continue
		}
		args = append(args, "--"+strings.TrimPrefix(p.name, ".")+"="+p.file)
	}
	out, err := exec.Command(tool, args...).Output()
	if err != nil {
		t.Fatalf("systemd-measure %v: %v", args, err)
	}
	var res map[string][]struct {
		Phase string `json:"phase"`
		PCR   int    `json:"pcr"`
		Hash  string `json:"hash"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("systemd-measure output %q: %v", out, err)
	}
	got := map[string]map[Bank]string{}
	for _, b := range Banks {
		if len(res[string(b)]) == 0 {
			t.Fatalf("systemd-measure printed nothing for bank %s: %s", b, out)
		}
		for _, e := range res[string(b)] {
			if e.PCR != PCRIndex {
				t.Fatalf("systemd-measure bank %s: %+v", b, e)
			}
			if got[e.Phase] == nil {
				got[e.Phase] = map[Bank]string{}
			}
			got[e.Phase][b] = e.Hash
		}
	}
	return got
}

func TestPCR11MatchesSystemdMeasure(t *testing.T) {
	for _, all := range []bool{false, true} {
		t.Run(fmt.Sprintf("all=%v", all), func(t *testing.T) {
			dir := t.TempDir()
			ps := testPayloads(t, dir, all)
			img, err := os.ReadFile(buildUKI(t, dir, ps))
			if err != nil {
				t.Fatal(err)
			}
			r, err := Measure(img, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if r.StubVersion != 252 || r.StubVersionSource != ".sdmagic" {
				t.Errorf("stub version %d from %s, want 252 from .sdmagic (Debian 12 stub)", r.StubVersion, r.StubVersionSource)
			}
			want := referencePCR11(t, ps, true)[""]
			contents := map[string][]byte{}
			for _, p := range ps {
				if contents[p.name], err = os.ReadFile(p.file); err != nil {
					t.Fatal(err)
				}
			}
			for _, b := range Banks {
				if got := hex.EncodeToString(r.PCR11[b]); got != want[b] {
					t.Errorf("PCR 11 %s = %s, systemd-measure says %s", b, got, want[b])
				}
				direct, err := PCR11(b, 252, contents)
				if err != nil {
					t.Fatal(err)
				}
				if got := hex.EncodeToString(direct); got != want[b] {
					t.Errorf("PCR11(%s) from section contents = %s, systemd-measure says %s", b, got, want[b])
				}
			}
			phased := referencePCR11(t, ps, false)
			if len(phased) != len(DefaultPhases) || len(r.Phases) != len(DefaultPhases) {
				t.Fatalf("phases: systemd-measure %d, ours %d, want %d", len(phased), len(r.Phases), len(DefaultPhases))
			}
			for _, pv := range r.Phases {
				for _, b := range Banks {
					if got := hex.EncodeToString(pv.PCR11[b]); got != phased[pv.Phase][b] {
						t.Errorf("PCR 11 %s after phase %s = %s, systemd-measure says %s", b, pv.Phase, got, phased[pv.Phase][b])
					}
				}
			}
			// The stub's own .sbat section is reported but not measured by 252.
			for _, s := range r.Sections {
				if (s.Name == ".sbat" || s.Name == ".uname") && s.Measured {
					t.Errorf("%s marked measured for a 252 stub", s.Name)
				}
			}
			// A newer stub measures .sbat and .uname too, so PCR 11 must differ.
			r254, err := Measure(img, Options{StubVersion: 254})
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Equal(r254.PCR11[SHA256], r.PCR11[SHA256]) {
				t.Error("stub version 254 gave the same PCR 11 although it also measures .sbat")
			}
		})
	}
}

var calculatedDigest = regexp.MustCompile(`Calculated message digest\s*:\s*([0-9A-Fa-f]+)`)

// osslDigest runs osslsigncode verify on a signed file and returns the
// digest it recomputes from the file.
func osslDigest(t *testing.T, file string) string {
	t.Helper()
	tool := need(t, "osslsigncode", "osslsigncode")
	// verify exits non-zero because the test certificate is untrusted; the
	// recomputed digest is printed regardless.
	out, _ := exec.Command(tool, "verify", "-in", file).CombinedOutput()
	m := calculatedDigest.FindSubmatch(out)
	if m == nil {
		t.Fatalf("osslsigncode verify %s printed no calculated digest:\n%s", file, out)
	}
	return strings.ToLower(string(m[1]))
}

func TestAuthenticodeMatchesOsslsigncode(t *testing.T) {
	openssl := need(t, "openssl", "openssl")
	ossl := need(t, "osslsigncode", "osslsigncode")
	dir := t.TempDir()
	key, cert := filepath.Join(dir, "k.pem"), filepath.Join(dir, "c.pem")
	if b, err := exec.Command(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
		"-out", cert, "-subj", "/CN=c8s test", "-days", "1").CombinedOutput(); err != nil {
		t.Fatalf("openssl req: %v\n%s", err, b)
	}
	uki := buildUKI(t, dir, testPayloads(t, dir, true))
	unsigned, err := os.ReadFile(uki)
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []string{"sha256", "sha384"} {
		signed := filepath.Join(dir, alg+".efi")
		if b, err := exec.Command(ossl, "sign", "-certs", cert, "-key", key, "-h", alg, "-in", uki, "-out", signed).CombinedOutput(); err != nil {
			t.Fatalf("osslsigncode sign: %v\n%s", err, b)
		}
		want := osslDigest(t, signed)
		img, err := os.ReadFile(signed)
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{"signed": img, "unsigned": padTo8(unsigned)} {
			r, err := Measure(data, Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := r.AuthenticodeSHA256
			if alg == "sha384" {
				got = r.AuthenticodeSHA384
			}
			if hex.EncodeToString(got) != want {
				t.Errorf("%s %s UKI: Authenticode %x, osslsigncode %s", alg, name, got, want)
			}
		}
	}

	// A kernel Debian signed itself (SHA-256).
	k := kernel(t)
	data, err := os.ReadFile(k)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Measure(data, Options{})
	if !errors.Is(err, ErrNotUKI) {
		t.Fatalf("Measure(kernel) = %v, want ErrNotUKI", err)
	}
	d, err := AuthenticodeSHA256(data)
	if err != nil {
		t.Fatal(err)
	}
	if want := osslDigest(t, k); hex.EncodeToString(d) != want {
		t.Errorf("kernel %s: Authenticode %x, osslsigncode %s", k, d, want)
	}
}

// padTo8 pads an unsigned image as signing tools do before hashing it.
func padTo8(b []byte) []byte {
	if r := len(b) % 8; r != 0 {
		b = append(append([]byte(nil), b...), make([]byte, 8-r)...)
	}
	return b
}

func TestMeasureRejects(t *testing.T) {
	need(t, stubPath, "systemd-boot-efi")
	stub, err := os.ReadFile(stubPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Measure(stub, Options{}); !errors.Is(err, ErrNotUKI) {
		t.Errorf("Measure(bare stub) = %v, want ErrNotUKI", err)
	}
	if _, err := Measure(stub[:1000], Options{}); err == nil {
		t.Error("Measure(truncated stub) succeeded")
	}
	// Turn the stub's .sbat section into a .linux section whose VirtualSize
	// asks for 2 MiB of zero fill.
	big := append([]byte(nil), stub...)
	pe := int(binary.LittleEndian.Uint32(big[0x3c:]))
	nsec := int(binary.LittleEndian.Uint16(big[pe+6:]))
	secTab := pe + 24 + int(binary.LittleEndian.Uint16(big[pe+20:]))
	renamed := false
	for i := 0; i < nsec; i++ {
		h := big[secTab+40*i:]
		if string(bytes.TrimRight(h[:8], "\x00")) == ".sbat" {
			copy(h[:8], ".linux\x00\x00")
			binary.LittleEndian.PutUint32(h[8:], 2<<20)
			renamed = true
		}
	}
	if !renamed {
		t.Fatal("the stub has no .sbat section to rename")
	}
	if _, err := Measure(big, Options{}); err == nil || !strings.Contains(err.Error(), "zero-fill") {
		t.Errorf("Measure(2 MiB zero fill) = %v, want a zero-fill error", err)
	}
	if _, err := PCR11(SHA256, 252, map[string][]byte{".kernel": []byte("x")}); err == nil {
		t.Error("PCR11 accepted an unknown section name")
	}
	if _, err := ExtendPhase(SHA256, make([]byte, 32), "enter-initrd::ready"); err == nil {
		t.Error("ExtendPhase accepted an empty phase word")
	}
	if _, err := PCR11("md5", 252, nil); err == nil {
		t.Error("PCR11 accepted an unknown bank")
	}
}

func FuzzMeasure(f *testing.F) {
	if b, err := os.ReadFile(stubPath); err == nil {
		f.Add(b)
	}
	f.Add([]byte("MZ"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, _ = Measure(data, Options{})
	})
}

func BenchmarkMeasure(b *testing.B) {
	dir := b.TempDir()
	img, err := os.ReadFile(buildUKI(b, dir, testPayloads(b, dir, true)))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(img)))
	for b.Loop() {
		if _, err := Measure(img, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
