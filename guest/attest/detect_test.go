package attest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fixture builds a guest root from paths: a trailing slash makes a
// directory, "name=content" a file with content, anything else an empty
// file (a device node stand-in).
func fixture(t *testing.T, root string, paths ...string) {
	t.Helper()
	for _, p := range paths {
		full := filepath.Join(root, strings.SplitN(p, "=", 2)[0])
		if strings.HasSuffix(p, "/") {
			if err := os.MkdirAll(full, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		content := ""
		if _, c, ok := strings.Cut(p, "="); ok {
			content = c
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

var (
	simPort = []string{"sys/class/virtio-ports/vport1p1/name=c8s.agent\n", "dev/vport1p1",
		"sys/class/virtio-ports/vport1p2/name=c8s.attest\n", "dev/vport1p2"}
	tsmDir = "sys/kernel/config/tsm/report/"
)

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name  string
		paths []string
		want  string
		// path is the device or port the provider uses, below the root.
		path string
	}{
		{"sim port", simPort, NameSim, "dev/vport1p2"},
		{"sim port by udev link", []string{"dev/virtio-ports/c8s.attest"}, NameSim, "dev/virtio-ports/c8s.attest"},
		// The tsm module makes its directory on any VM; without a TEE
		// driver there is no provider behind it.
		{"tsm without a TEE driver", append([]string{tsmDir}, simPort...), NameSim, "dev/vport1p2"},
		{"tdx-guest", append([]string{"dev/tdx_guest"}, simPort...), NameTDXGuest, "dev/tdx_guest"},
		{"sev-guest before tdx-guest", append([]string{"dev/sev-guest", "dev/tdx_guest"}, simPort...), NameSEVGuest, "dev/sev-guest"},
		{"configfs-tsm with sev-guest", append([]string{tsmDir, "dev/sev-guest"}, simPort...), NameConfigfsTSM, ""},
		{"configfs-tsm with tdx-guest", []string{tsmDir, "dev/tdx_guest"}, NameConfigfsTSM, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			fixture(t, root, tc.paths...)
			p, err := Detect(context.Background(), root, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != tc.want {
				t.Fatalf("Detect = %s, want %s", p.Name(), tc.want)
			}
			var path string
			switch p := p.(type) {
			case *SEVGuest:
				path = p.path
			case *TDXGuest:
				path = p.path
			case *Sim:
				path = p.path
			case *ConfigfsTSM:
				if c, ok := p.client.(rootedClient); !ok || c.root != root {
					t.Errorf("configfs-tsm client %#v is not rooted at the fixture", p.client)
				}
			}
			if tc.path != "" && path != filepath.Join(root, tc.path) {
				t.Errorf("provider uses %s, want %s", path, filepath.Join(root, tc.path))
			}
		})
	}
}

// The deferred TEE modules load before Detect looks: here "loading" them
// makes the sev-guest device appear.
func TestDetectLoadsModulesFirst(t *testing.T) {
	root := t.TempDir()
	fixture(t, root, simPort...)
	calls := 0
	p, err := Detect(context.Background(), root, func() {
		calls++
		fixture(t, root, "dev/sev-guest")
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 || p.Name() != NameSEVGuest {
		t.Fatalf("loadModules called %d times, provider %s; want once, sev-guest", calls, p.Name())
	}
}

func TestDetectNothing(t *testing.T) {
	root := t.TempDir()
	// The agent's port alone is no attestation port.
	fixture(t, root, simPort[:2]...)
	_, err := Detect(context.Background(), root, nil)
	if err == nil {
		t.Fatal("Detect found a provider in an empty guest")
	}
	for _, want := range []string{"configfs-tsm", filepath.Join(root, TSMReportDir), filepath.Join(root, SEVGuestDevice), filepath.Join(root, TDXGuestDevice), SimPortName} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	fixture(t, root, "dev/sev-guest")
	if _, err := Detect(ctx, root, nil); err == nil {
		t.Error("Detect with a cancelled context returned a provider")
	}
}
