package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A c8s pod VM's command line names its TEE; a digest over one that does
// not is of no c8s pod, and the command says so (on stderr: it measures
// other VMs too).
func TestNoteTEEParam(t *testing.T) {
	for _, tc := range []struct {
		tee, cmdline, want string
	}{
		{"snp", "console=ttyS0 c8s.tee=snp", ""},
		{"snp", "console=ttyS0", "does not name the TEE"},
		{"tdx", "console=ttyS0 c8s.tee=snp", "names c8s.tee=snp"},
		{"sim", "c8s.tee=sim c8s.tee=sim", "more than once"},
	} {
		var stderr bytes.Buffer
		noteTEEParam(&stderr, tc.tee, tc.cmdline)
		got := stderr.String()
		if tc.want == "" {
			if got != "" {
				t.Errorf("%s %q: note %q, want none", tc.tee, tc.cmdline, got)
			}
			continue
		}
		if !strings.Contains(got, tc.want) || !strings.Contains(got, "c8s.tee="+tc.tee) || !strings.Contains(got, "kernel-params -tee "+tc.tee) {
			t.Errorf("%s %q: note %q, want it to say %q and how to get c8s.tee=%s", tc.tee, tc.cmdline, got, tc.want, tc.tee)
		}
	}
}

func TestSimCommandNotesTheTEEParam(t *testing.T) {
	dir := t.TempDir()
	fw, kernel := filepath.Join(dir, "bios.bin"), filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(fw, make([]byte, 64<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kernel, []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	for cmdline, noted := range map[string]bool{"console=ttyS0": true, "console=ttyS0 c8s.tee=sim": false} {
		out, warn, err := measureWarn(runSim, "--firmware", fw, "--kernel", kernel, "--append", cmdline, "--vcpus", "1", "--vcpu-type", "EPYC-v4")
		if err != nil || len(strings.TrimSpace(out)) != 96 {
			t.Fatalf("sim --append %q: %q, %v", cmdline, out, err)
		}
		if got := strings.Contains(warn, "c8s.tee=sim"); got != noted {
			t.Errorf("sim --append %q: stderr %q; want a note %v", cmdline, warn, noted)
		}
	}
	var help bytes.Buffer
	f := newSevFlags("sim", &help, &help).withKernel()
	f.fs.SetOutput(&help)
	f.fs.PrintDefaults()
	if !strings.Contains(help.String(), "c8s.tee=sim|snp|tdx") {
		t.Errorf("--append's help does not say a pod VM's command line names its TEE:\n%s", help.String())
	}
}
