package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

func TestRenderProgress(t *testing.T) {
	got := renderProgress(&adminapi.MigrationProgressResponse{
		Active: true, Status: "active", Transferred: 96 << 20, Remaining: 192 << 20, Total: 256 << 20, Mbps: 812.4, DirtyPagesRate: 120,
	})
	for _, want := range []string{"[#######.......................]", " 25% active", "96 MiB sent, 192 MiB remaining of 256 MiB", "812 Mbit/s", "120 dirty pages/s"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress line %q lacks %q", got, want)
		}
	}
	// QEMU can report more remaining than the total while it syncs.
	if got := renderProgress(&adminapi.MigrationProgressResponse{Remaining: 300, Total: 100}); !strings.Contains(got, "[..............................]   0%") {
		t.Errorf("progress with remaining > total: %q", got)
	}
}

func TestMigrateAndServeUsage(t *testing.T) {
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "migrate", []string{"pod1"}, &out); err == nil || !strings.Contains(err.Error(), "--to SOCK") {
		t.Fatalf("migrate without --to: %v", err)
	}
	if err := tool.Run(context.Background(), "serve", []string{"extra"}, &out); err == nil || !strings.Contains(err.Error(), "usage: c8s-launcher serve") {
		t.Fatalf("serve with an argument: %v", err)
	}
	if err := tool.Run(context.Background(), "serve", []string{"--config", "/nonexistent/c8s.toml"}, &out); err == nil || !strings.Contains(err.Error(), "/nonexistent/c8s.toml") {
		t.Fatalf("serve with a missing config: %v", err)
	}
}
