package task

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/launcher/config"
)

func TestConfigPathPrecedence(t *testing.T) {
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: "/opt/c8s.toml"})
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(ConfigPathEnv, "/env/c8s.toml")
	if p, err := configPath(&taskAPI.CreateTaskRequest{Options: opts}); err != nil || p != "/opt/c8s.toml" {
		t.Fatalf("with runtime option: %q, %v", p, err)
	}
	if p, _ := configPath(&taskAPI.CreateTaskRequest{}); p != "/env/c8s.toml" {
		t.Fatalf("with env: %q", p)
	}
	t.Setenv(ConfigPathEnv, "")
	if p, _ := configPath(&taskAPI.CreateTaskRequest{}); p != DefaultConfigPath {
		t.Fatalf("default: %q", p)
	}
}

func TestLoadConfigErrorsNameTheProblem(t *testing.T) {
	if _, err := loadConfig("/nonexistent/c8s.toml"); err == nil || !strings.Contains(err.Error(), "/nonexistent/c8s.toml") || !errdefs.IsInvalidArgument(err) {
		t.Fatalf("missing explicit config: %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("[hypervisor]\nkernal = \"x\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := loadConfig(bad); err == nil || !strings.Contains(err.Error(), "kernal") {
		t.Fatalf("typo in config: %v", err)
	}
}

func TestSharedFilesPassesSmallBindMountedFiles(t *testing.T) {
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, make([]byte, maxSharedFile+1), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := &specs.Spec{Mounts: []specs.Mount{
		{Destination: "/etc/hosts", Type: "bind", Source: hosts, Options: []string{"rbind", "ro"}},
		{Destination: "/data", Type: "bind", Source: dir, Options: []string{"rbind"}},
		{Destination: "/big", Source: big, Options: []string{"bind"}},
		{Destination: "/proc", Type: "proc", Source: "proc"},
	}}
	files := sharedFiles(context.Background(), spec)
	if len(files) != 1 || files[0].Source != hosts || string(files[0].Content) != "127.0.0.1 localhost\n" || files[0].Mode != 0o644 {
		t.Fatalf("shared files = %+v, want only %s", files, hosts)
	}
}

func TestDiskIDIsAValidBoundedQEMUID(t *testing.T) {
	long := strings.Repeat("a1", 32)
	id := diskID(long)
	if len(id) > 31 || !strings.HasPrefix(id, "rootfs-") {
		t.Fatalf("diskID(%q) = %q", long, id)
	}
	if diskID("c1") != "rootfs-c1" {
		t.Fatalf("diskID(c1) = %q", diskID("c1"))
	}
}

func TestValidIDRejectsPaths(t *testing.T) {
	for _, id := range []string{"", ".", "..", "a/b", "../x"} {
		if err := validID(id); !errdefs.IsInvalidArgument(err) {
			t.Errorf("validID(%q) = %v, want invalid argument", id, err)
		}
	}
	if err := validID("c8s-1"); err != nil {
		t.Fatal(err)
	}
}

func TestDirNameIsShortAndDistinct(t *testing.T) {
	if dirName("pod1") != "pod1" {
		t.Fatalf("short ids are kept: %q", dirName("pod1"))
	}
	a := dirName(strings.Repeat("e7", 32))
	b := dirName(strings.Repeat("e7", 31) + "e8")
	if len(a) > 24 || a == b || !strings.HasPrefix(a, "e7e7e7e7e7e7-") {
		t.Fatalf("dirName of CRI-style ids: %q, %q", a, b)
	}
}

func TestPodInitData(t *testing.T) {
	doc := "version = \"0.1\"\n[agent_policy]\nallow_exec = false\n"
	cfg := config.Default()
	got, err := podInitData(map[string]string{"io.c8s.initdata": base64.StdEncoding.EncodeToString([]byte(doc))}, cfg)
	if err != nil || string(got) != doc {
		t.Fatalf("from the annotation: %q, %v", got, err)
	}
	if got, err := podInitData(nil, cfg); err != nil || len(got) != 0 {
		t.Fatalf("no init data: %q, %v", got, err)
	}
	def := filepath.Join(t.TempDir(), "initdata.toml")
	if err := os.WriteFile(def, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Attestation.InitData = def
	if got, err := podInitData(nil, cfg); err != nil || string(got) != doc {
		t.Fatalf("node default: %q, %v", got, err)
	}
	for name, ann := range map[string]string{
		"not base64":  "%%%",
		"unknown key": base64.StdEncoding.EncodeToString([]byte("version = \"0.1\"\nallow_everything = true\n")),
	} {
		if _, err := podInitData(map[string]string{"io.c8s.initdata": ann}, cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
