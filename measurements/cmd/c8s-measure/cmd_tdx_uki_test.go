package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/measurements/uki"
)

func needFile(t *testing.T, path, pkg string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s is missing (Debian package %s; run hack/install-deps.sh)", path, pkg)
	}
}

func TestTDXCommand(t *testing.T) {
	const ovmf = "/usr/share/ovmf/OVMF.fd"
	needFile(t, ovmf, "ovmf")
	// The MRTD google/gce-tcb-verifier computes for this file (see
	// measurements/tdx/tdx_test.go).
	const want = "4c7206f0f483c524f12c366c711e9049030a8d47c471ee5aa9c4999a08de4057fb887fed0744d5631a212967fb231c47"
	out, err := measure(t, "tdx", "--ovmf", ovmf)
	if err != nil || strings.TrimSpace(out) != want {
		t.Fatalf("tdx --ovmf: %q, %v; want %s", out, err, want)
	}
	two, err := measure(t, "tdx", "--ovmf", ovmf, "--two-pass")
	if err != nil || len(strings.TrimSpace(two)) != 96 || two == out {
		t.Fatalf("tdx --two-pass: %q, %v", two, err)
	}

	kernels, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(kernels) == 0 {
		t.Skip("no /boot/vmlinuz-* (Debian package linux-image-amd64)")
	}
	initrd := filepath.Join(t.TempDir(), "initrd")
	if err := os.WriteFile(initrd, []byte("initrd bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	js, err := measure(t, "tdx", "--ovmf", ovmf, "--kernel", kernels[0], "--append", "console=hvc0", "--initrd", initrd, "--output-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var res tdxJSON
	if err := json.Unmarshal([]byte(js), &res); err != nil {
		t.Fatalf("json output %q: %v", js, err)
	}
	if res.MRTD != want || res.RTMR0 != nil || res.RTMR1 == nil || res.RTMR2 == nil || len(res.Assumptions) < 2 {
		t.Fatalf("json output %+v", res)
	}
	kernel, err := os.ReadFile(kernels[0])
	if err != nil {
		t.Fatal(err)
	}
	kd, err := uki.AuthenticodeSHA384(kernel)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.RTMR1.Events) != 5 || res.RTMR1.Events[0].Digest != hex.EncodeToString(kd) {
		t.Errorf("RTMR1 events %+v, want 5 starting with the kernel's Authenticode %x", res.RTMR1.Events, kd)
	}
	if len(res.RTMR2.Events) != 2 || !strings.Contains(res.RTMR2.Events[0].Description, "console=hvc0 initrd=initrd") {
		t.Errorf("RTMR2 events %+v", res.RTMR2.Events)
	}

	for _, bad := range [][]string{
		{},
		{"--ovmf", ovmf, "--append", "x"},
		{"--ovmf", ovmf, "--output-format", "yaml"},
		{"--ovmf", ovmf, "extra"},
		{"--ovmf", "/nonexistent"},
		{"--ovmf", kernels[0]},
	} {
		if _, err := measure(t, "tdx", bad...); err == nil {
			t.Errorf("tdx %v succeeded", bad)
		}
	}
}

func TestUKICommand(t *testing.T) {
	const stub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"
	needFile(t, stub, "systemd-boot-efi")
	objcopy, err := exec.LookPath("objcopy")
	if err != nil {
		t.Skip("objcopy is not on PATH (Debian package binutils)")
	}
	dir := t.TempDir()
	cmdline := filepath.Join(dir, "cmdline")
	linux := filepath.Join(dir, "linux")
	if err := os.WriteFile(cmdline, []byte("quiet"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(linux, bytes.Repeat([]byte("kernel"), 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "uki.efi")
	if b, err := exec.Command(objcopy, "--add-section", ".linux="+linux, "--change-section-vma", ".linux=0x1000000",
		"--add-section", ".cmdline="+cmdline, "--change-section-vma", ".cmdline=0x2000000", stub, img).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v\n%s", err, b)
	}
	data, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	linuxData, _ := os.ReadFile(linux)
	want, err := uki.PCR11(uki.SHA256, 252, map[string][]byte{".linux": linuxData, ".cmdline": []byte("quiet")})
	if err != nil {
		t.Fatal(err)
	}

	// Flags after the file work too.
	js, err := measure(t, "uki", img, "--output-format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var res ukiJSON
	if err := json.Unmarshal([]byte(js), &res); err != nil {
		t.Fatalf("json output %q: %v", js, err)
	}
	if len(res.Phases) != len(uki.DefaultPhases) || res.Phases[0].Phase != "enter-initrd" {
		t.Errorf("uki json phases %+v", res.Phases)
	} else if enter, _ := uki.ExtendPhase(uki.SHA256, want, "enter-initrd"); res.Phases[0].PCR11["sha256"] != hex.EncodeToString(enter) {
		t.Errorf("PCR 11 after enter-initrd %s, want %x", res.Phases[0].PCR11["sha256"], enter)
	}
	if res.PCR11["sha256"] != hex.EncodeToString(want) || res.StubVersion != 252 || len(res.Sections) != 3 {
		t.Errorf("uki json %+v, want PCR 11 sha256 %x from stub 252 and sections .linux .cmdline .sbat", res, want)
	}
	ac, _ := uki.AuthenticodeSHA256(data)
	text, err := measure(t, "uki", "--output-format", "text", img)
	if err != nil || !strings.Contains(text, hex.EncodeToString(want)) || !strings.Contains(text, hex.EncodeToString(ac)) {
		t.Errorf("uki text output %q, %v", text, err)
	}

	for _, bad := range [][]string{{}, {img, img}, {img, "--output-format", "xml"}, {stub}, {"/nonexistent"}} {
		if _, err := measure(t, "uki", bad...); err == nil {
			t.Errorf("uki %v succeeded", bad)
		}
	}
}
