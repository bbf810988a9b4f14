package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// images/build.sh takes the image's command line from `kernel-params`, so
// the launcher's parameters have one spelling: vm.BaseKernelParams, and
// each TEE backend's KernelParams.
func TestKernelParamsCommand(t *testing.T) {
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := tool.Run(context.Background(), "kernel-params", args, &out)
		return out.String(), err
	}
	if got, err := run(); err != nil || got != vm.BaseKernelParams+"\n" {
		t.Fatalf("kernel-params printed %q, %v; want %q", got, err, vm.BaseKernelParams+"\n")
	}
	for _, name := range []string{"sim", "snp", "tdx"} {
		if got, err := run("-tee", name); err != nil || got != "c8s.tee="+name+"\n" {
			t.Errorf("kernel-params -tee %s printed %q, %v; want c8s.tee=%s", name, got, err, name)
		}
	}
	if _, err := run("-tee", "sgx"); err == nil || !strings.Contains(err.Error(), "sgx") {
		t.Errorf("kernel-params -tee sgx: %v, want an unknown TEE", err)
	}
	if _, err := run("extra"); err == nil {
		t.Fatal("kernel-params took an argument")
	}
	script, err := os.ReadFile("../../../images/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), `kernel-params)`) || strings.Contains(string(script), vm.BaseKernelParams) {
		t.Error("images/build.sh spells the base kernel parameters itself instead of asking `c8s-launcher kernel-params`")
	}
	if !strings.Contains(string(script), `kernel-params -tee "$t")`) {
		t.Error("images/build.sh does not ask `c8s-launcher kernel-params -tee` for the TEEs' kernel parameters")
	}
	for i, line := range strings.Split(string(script), "\n") {
		if code, _, _ := strings.Cut(line, "#"); strings.Contains(code, "c8s.tee") {
			t.Errorf("images/build.sh:%d spells a TEE's kernel parameter itself: %s", i+1, line)
		}
	}
}
