package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestArgsCommand(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"vmlinuz", "initrd", "qemu"} {
		if err := os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "c8s.toml")
	content := "[hypervisor]\npath = \"" + dir + "/qemu\"\nkernel = \"" + dir + "/vmlinuz\"\ninitrd = \"" + dir + "/initrd\"\naccel = \"tcg\"\n" +
		"[runtime]\nstate_dir = \"" + dir + "/state\"\n"
	if err := os.WriteFile(cfg, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "args", []string{"--config", cfg, "--id", "pod7"}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if lines[0] != dir+"/qemu" {
		t.Fatalf("argv[0] = %q", lines[0])
	}
	for _, want := range []string{"-accel\ntcg,tb-size=128\n", "c8s-pod7\n", "file:" + dir + "/state/pod7/console.log\n", "-kernel\n" + dir + "/vmlinuz\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}

	// Configuration errors reach the user.
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte("[hypervisor]\ntee = \"sgx\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tool.Run(context.Background(), "args", []string{"--config", bad}, &out); err == nil || !strings.Contains(err.Error(), "sgx") {
		t.Fatalf("args with tee sgx: %v", err)
	}
}
