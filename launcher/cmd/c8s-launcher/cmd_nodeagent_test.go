package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestNodeAgentNeedsANodeName(t *testing.T) {
	t.Setenv("NODE_NAME", "")
	err := tool.Run(context.Background(), "node-agent", []string{"--root", t.TempDir(), "--once"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "NODE_NAME") {
		t.Fatalf("err = %v, want one naming NODE_NAME", err)
	}
}

func TestNodeAgentBadKubeconfig(t *testing.T) {
	err := tool.Run(context.Background(), "node-agent", []string{"--root", t.TempDir(), "--once", "--node-name", "n1", "--kubeconfig", "/nonexistent/kubeconfig"}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "/nonexistent/kubeconfig") {
		t.Fatalf("err = %v, want one naming the kubeconfig", err)
	}
}
