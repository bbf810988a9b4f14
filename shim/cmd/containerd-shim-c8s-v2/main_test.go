package main

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"

	apitypes "github.com/containerd/containerd/api/types"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"google.golang.org/protobuf/proto"

	"github.com/c8s-dev/c8s/shim/manager"
)

// TestInfo builds the shim and asks it for its runtime info the way
// containerd does (core/runtime/v2 getRuntimeInfo): `shim -info` with the
// runtime options, a protobuf Any, on stdin and a protobuf RuntimeInfo on
// stdout, whose Features containerd decodes with typeurl.
func TestInfo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the shim")
	}
	shim := filepath.Join(t.TempDir(), "containerd-shim-c8s-v2")
	// go test puts its own go first on PATH.
	build := exec.Command("go", "build", "-o", shim, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: "/etc/c8s/config.toml"})
	if err != nil {
		t.Fatal(err)
	}
	optsB, err := proto.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(manager.Features())
	if err != nil {
		t.Fatal(err)
	}

	for name, stdin := range map[string][]byte{"no options": nil, "options": optsB} {
		t.Run(name, func(t *testing.T) {
			var stderr bytes.Buffer
			cmd := exec.Command(shim, "-info")
			cmd.Stdin = bytes.NewReader(stdin)
			cmd.Stderr = &stderr
			cmd.Dir = t.TempDir()
			stdout, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %v (stderr: %q)", cmd.Args, err, stderr.String())
			}
			var info apitypes.RuntimeInfo
			if err := proto.Unmarshal(stdout, &info); err != nil {
				t.Fatalf("unmarshal stdout into RuntimeInfo: %v", err)
			}
			if info.GetName() != manager.RuntimeName || info.GetVersion().GetVersion() != manager.Version {
				t.Errorf("name %q version %q, want %q %q", info.GetName(), info.GetVersion().GetVersion(), manager.RuntimeName, manager.Version)
			}
			v, err := typeurl.UnmarshalAny(info.GetFeatures())
			if err != nil {
				t.Fatalf("unmarshal Features: %v", err)
			}
			f, ok := v.(*features.Features)
			if !ok {
				t.Fatalf("Features is a %T, want *features.Features", v)
			}
			got, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("the shim's features\n%s\ndiffer from manager.Features()\n%s", got, want)
			}
		})
	}
}
