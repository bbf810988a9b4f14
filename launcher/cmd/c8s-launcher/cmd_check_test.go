package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"github.com/c8s-dev/c8s/launcher/admin/diag"
)

// TestCheckCommand runs check --json against the plain-host fixture tree:
// the report is valid JSON of the documented schema and a failed check
// makes the command fail.
func TestCheckCommand(t *testing.T) {
	root, _ := filepath.Abs("../../admin/diag/testdata/plain-host")
	var out bytes.Buffer
	err := tool.Run(context.Background(), "check", []string{"--root", root, "--json"}, &out)
	if !errors.Is(err, errChecksFailed) {
		t.Fatalf("check on a host without containerd returned %v, want errChecksFailed", err)
	}
	var rep diag.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out.String())
	}
	if rep.Schema != diag.Schema || len(rep.Checks) != len(diag.IDs()) || rep.TEE != "sim" {
		t.Fatalf("report: schema %q, %d checks, tee %q", rep.Schema, len(rep.Checks), rep.TEE)
	}
	for _, c := range rep.Checks {
		if c.ID == "containerd.handler" && c.Status != diag.Fail {
			t.Errorf("containerd.handler is %s on a containerd config without c8s", c.Status)
		}
	}

	out.Reset()
	if err := tool.Run(context.Background(), "check", []string{"--root", root, "--tee", "snp"}, &out); !errors.Is(err, errChecksFailed) {
		t.Fatalf("text check: %v", err)
	}
	if !bytes.Contains(out.Bytes(), []byte("checked for tee=snp:")) || !bytes.Contains(out.Bytes(), []byte("FAIL  snp.host")) {
		t.Fatalf("text report:\n%s", out.String())
	}
	if err := tool.Run(context.Background(), "check", []string{"--root", root, "--config", "/nonexistent.toml"}, &out); err == nil || errors.Is(err, errChecksFailed) {
		t.Fatalf("a missing --config file must be an error, got %v", err)
	}
}

// TestEnvCommand prints the environment of the SNP fixture tree as TOML and
// JSON.
func TestEnvCommand(t *testing.T) {
	root, _ := filepath.Abs("../../admin/diag/testdata/snp-host")
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "env", []string{"--root", root}, &out); err != nil {
		t.Fatal(err)
	}
	var tm map[string]any
	if err := toml.Unmarshal(out.Bytes(), &tm); err != nil {
		t.Fatalf("env output is not TOML: %v\n%s", err, out.String())
	}
	if c8s := tm["c8s"].(map[string]any); c8s["config_path"] != "/etc/c8s/config.toml" {
		t.Fatalf("config_path %v", c8s["config_path"])
	}
	out.Reset()
	if err := tool.Run(context.Background(), "env", []string{"--root", root, "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var env diag.Env
	if err := json.Unmarshal(out.Bytes(), &env); err != nil {
		t.Fatal(err)
	}
	if env.Schema != diag.EnvSchema || env.Hypervisor.Version != "9.2.0" || env.Image.KernelRelease == "" || env.Hypervisor.TEE != "snp" {
		t.Fatalf("env: %+v", env)
	}
}
