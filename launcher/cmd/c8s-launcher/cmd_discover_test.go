package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDiscoverCommand(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c8s.toml")
	if err := os.WriteFile(cfg, []byte("[node]\nsim_slots = 2\ntrust_pool = \"lab\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join("..", "..", "node", "discovery", "testdata", "snp-host")
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "discover", []string{"--config", cfg, "--root", root}, &out); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Discovery struct {
			SNP struct {
				Enabled bool
				ASIDs   struct{ Total int64 }
			}
			Sim struct{ Slots int64 }
		}
		Desired struct {
			Labels    map[string]string
			Taint     struct{ Key, Value, Effect string }
			Resources []struct {
				Name  string
				Count int64
			}
		}
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, out.String())
	}
	d := got.Desired
	if !got.Discovery.SNP.Enabled || got.Discovery.SNP.ASIDs.Total != 99 || got.Discovery.Sim.Slots != 2 {
		t.Fatalf("discovery: %s", out.String())
	}
	if d.Labels["c8s.io/tee.snp"] != "true" || d.Labels["c8s.io/trust-pool"] != "lab" || d.Taint.Key != "c8s.io/confidential" {
		t.Fatalf("desired: %s", out.String())
	}
	if len(d.Resources) != 2 || d.Resources[0].Name != "c8s.io/snp-asid" || d.Resources[1].Count != 2 {
		t.Fatalf("resources: %+v", d.Resources)
	}

	// A bad taint in the config is reported.
	if err := os.WriteFile(cfg, []byte("[node]\ntaint = \"c8s.io/x\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := tool.Run(context.Background(), "discover", []string{"--config", cfg, "--root", root}, &out); err == nil || !strings.Contains(err.Error(), "node.taint") {
		t.Fatalf("bad taint: %v", err)
	}
}
