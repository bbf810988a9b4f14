package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/launcher/layercache"
)

// layers list shows the cache with each layer's pods, and prune
// --all-unused removes every layer but those a running pod uses.
func TestLayersCommand(t *testing.T) {
	dir := t.TempDir()
	cacheDir := filepath.Join(dir, "layers")
	cfg := filepath.Join(dir, "c8s.toml")
	if err := os.WriteFile(cfg, []byte("[runtime]\nlayer_cache_dir = \""+cacheDir+"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := layercache.Open(cacheDir)
	if err != nil {
		t.Fatal(err)
	}
	running, err := layercache.PodRef("k8s.io", "running", "")
	if err != nil {
		t.Fatal(err)
	}
	gone := layercache.Ref{Name: "gone", Namespace: "k8s.io", Pod: "gone", PID: 1 << 30}
	used, unused := digest.FromString("used"), digest.FromString("unused")
	for d, ref := range map[digest.Digest]layercache.Ref{used: running, unused: gone} {
		_, _, err := c.Acquire(context.Background(), d, ref, func(ctx context.Context, out *os.File) (layercache.Meta, error) {
			out.Write(bytes.Repeat([]byte("x"), 8192))
			return layercache.Meta{DiffID: d, RootHash: strings.Repeat("0", 64), DataBlocks: 2}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	var out bytes.Buffer
	if err := tool.Run(context.Background(), "layers", []string{"list", "--config", cfg, "--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var listed []layerJSON
	if err := json.Unmarshal(out.Bytes(), &listed); err != nil {
		t.Fatalf("layers list --json: %v\n%s", err, out.String())
	}
	pods := map[digest.Digest]string{}
	for _, l := range listed {
		pods[l.DiffID] = strings.Join(l.Pods, ",") + "|" + strings.Join(l.StalePods, ",")
		if l.Size != 8192 {
			t.Errorf("layer %s: size %d", l.DiffID, l.Size)
		}
	}
	if len(listed) != 2 || pods[used] != "k8s.io/running|" || pods[unused] != "|k8s.io/gone" {
		t.Fatalf("layers list: %v", pods)
	}
	out.Reset()
	if err := tool.Run(context.Background(), "layers", []string{"list", "--config", cfg}, &out); err != nil || !strings.Contains(out.String(), "2 layers") {
		t.Fatalf("layers list: %v\n%s", err, out.String())
	}

	out.Reset()
	// Without containerd, its images cannot keep layers: --all-unused
	// says to ignore them.
	if err := tool.Run(context.Background(), "layers", []string{"prune", "--config", cfg, "--containerd-address", ""}, &out); err == nil || !strings.Contains(err.Error(), "--all-unused") {
		t.Fatalf("layers prune without containerd or --all-unused: %v", err)
	}
	if err := tool.Run(context.Background(), "layers", []string{"sync", "--config", cfg, "--containerd-address", ""}, &out); err == nil {
		t.Fatal("layers sync without containerd succeeded")
	}
	if err := tool.Run(context.Background(), "layers", []string{"prune", "--config", cfg, "--containerd-address", "", "--all-unused"}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "removed "+unused.String()) || strings.Contains(out.String(), used.String()) ||
		!strings.Contains(out.String(), "pruned 1 layers") || !strings.Contains(out.String(), "1 stale references") {
		t.Fatalf("layers prune --all-unused:\n%s", out.String())
	}
	if _, err := c.Lookup(used); err != nil {
		t.Fatalf("prune removed the running pod's layer: %v", err)
	}
	if err := tool.Run(context.Background(), "layers", []string{"clean"}, &out); err == nil || !strings.Contains(err.Error(), "usage") {
		t.Fatalf("layers clean: %v", err)
	}
}
