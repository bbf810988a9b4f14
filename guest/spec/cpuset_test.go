package spec

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestParseList(t *testing.T) {
	for in, want := range map[string][]int{"": nil, "0": {0}, "0-3,6": {0, 1, 2, 3, 6}, "5-6,0,5": {0, 5, 6}} {
		got, err := ParseList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"a", "3-1", "1-", "-1", "1,,2", "70000"} {
		if _, err := ParseList(in); err == nil {
			t.Errorf("ParseList(%q) succeeded", in)
		}
	}
}

// TestCPUSetOutsideTheVM: an NRI plugin's cpuset of CPUs a 1-vCPU pod VM
// does not have is refused, naming what was asked, what the VM has and
// what to do; a cpuset the VM has passes.
func TestCPUSetOutsideTheVM(t *testing.T) {
	adapt := func(cpus, mems string) error {
		raw, _ := json.Marshal(&specs.Spec{Process: &specs.Process{Args: []string{"sh"}}, Linux: &specs.Linux{
			Resources: &specs.LinuxResources{CPU: &specs.LinuxCPU{Cpus: cpus, Mems: mems}},
		}})
		_, err := Adapt(raw, Options{ContainerID: "c1", Exists: guestHas(), OnlineCPUs: "0", OnlineMems: "0"})
		return err
	}
	err := adapt("5-6", "")
	if err == nil {
		t.Fatal("cpus 5-6 in a 1-vCPU VM accepted")
	}
	for _, want := range []string{`container "c1"`, "CPUs 5-6", "linux.resources.cpu.cpus", "has only CPUs 0 (1 vCPU)", "default_vcpus"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if err := adapt("0-1", ""); err == nil || !strings.Contains(err.Error(), "CPUs 1 do not exist") {
		t.Errorf("cpus 0-1 in a 1-vCPU VM: %v", err)
	}
	if err := adapt("", "1"); err == nil || !strings.Contains(err.Error(), "memory nodes 1") || !strings.Contains(err.Error(), "has only memory nodes 0 (1 memory node)") {
		t.Errorf("mems 1: %v", err)
	}
	if err := adapt("0", "0"); err != nil {
		t.Errorf("cpus 0, mems 0: %v", err)
	}
	if err := adapt("x", ""); err == nil || !strings.Contains(err.Error(), `cpu.cpus "x"`) {
		t.Errorf("cpus x: %v", err)
	}
	if err := CheckCPUSet("0-3", "", "0-3", ""); err != nil {
		t.Errorf("cpus 0-3 of 0-3: %v", err)
	}
	if err := CheckCPUSet("7", "", "", ""); err != nil {
		t.Errorf("no online list, no check: %v", err)
	}
}

func TestReadOnline(t *testing.T) {
	sys := t.TempDir()
	if _, _, err := ReadOnline(sys); err == nil {
		t.Fatal("no cpu/online: no error")
	}
	if err := os.MkdirAll(filepath.Join(sys, "devices/system/cpu"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, OnlineCPUsFile), []byte("0-1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if cpus, mems, err := ReadOnline(sys); err != nil || cpus != "0-1" || mems != "0" {
		t.Errorf("ReadOnline = %q, %q, %v; want 0-1 and node 0 without NUMA", cpus, mems, err)
	}
}
