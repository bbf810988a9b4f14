package attest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
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

// providerPath is the device or port a provider uses; "" for configfs-tsm,
// whose client must be rooted at root.
func providerPath(t *testing.T, p Provider, root string) string {
	t.Helper()
	switch p := p.(type) {
	case withCCEL:
		if p.path != filepath.Join(root, CCELPath) {
			t.Errorf("CC event log read from %s, want the fixture's", p.path)
		}
		return providerPath(t, p.Provider, root)
	case withTDReport:
		return providerPath(t, p.Provider, root)
	case *SEVGuest:
		return p.path
	case *TDXGuest:
		return p.path
	case *Sim:
		return p.path
	case *ConfigfsTSM:
		if c, ok := p.client.(rootedClient); !ok || c.root != root {
			t.Errorf("configfs-tsm client %#v is not rooted at the fixture", p.client)
		}
	}
	return ""
}

// A guest whose kernel command line names no TEE (an older launcher, a
// plain VM) takes what it finds, sim included.
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
			p, err := Detect(context.Background(), root, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != tc.want {
				t.Fatalf("Detect = %s, want %s", p.Name(), tc.want)
			}
			path := providerPath(t, p, root)
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
	p, err := Detect(context.Background(), root, "", func() {
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
	_, err := Detect(context.Background(), root, "", nil)
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
	if _, err := Detect(ctx, root, "", nil); err == nil {
		t.Error("Detect with a cancelled context returned a provider")
	}
}

// A guest started as snp or tdx (c8s.tee on its measured command line)
// takes only its own TEE's providers: never the sim port the host serves,
// never the other hardware TEE's device.
func TestDetectNamedTEE(t *testing.T) {
	for _, tc := range []struct {
		name, tee string
		paths     []string
		want      string
		path      string
	}{
		{"snp: sev-guest", "snp", append([]string{"dev/sev-guest"}, simPort...), NameSEVGuest, "dev/sev-guest"},
		{"snp: configfs-tsm with sev-guest", "snp", append([]string{tsmDir, "dev/sev-guest"}, simPort...), NameConfigfsTSM, ""},
		{"snp: sev-guest, not tdx-guest", "snp", []string{"dev/tdx_guest", "dev/sev-guest"}, NameSEVGuest, "dev/sev-guest"},
		{"tdx: tdx-guest", "tdx", append([]string{"dev/tdx_guest"}, simPort...), NameTDXGuest, "dev/tdx_guest"},
		{"tdx: tdx-guest, not sev-guest", "tdx", []string{"dev/sev-guest", "dev/tdx_guest"}, NameTDXGuest, "dev/tdx_guest"},
		{"tdx: configfs-tsm with tdx-guest", "tdx", []string{tsmDir, "dev/tdx_guest"}, NameConfigfsTSM, ""},
		{"sim: the port", "sim", simPort, NameSim, "dev/vport1p2"},
		// A sim guest takes the port even where a TEE device shows up:
		// its measurement is the simulated secure processor's.
		{"sim: the port, not sev-guest", "sim", append([]string{tsmDir, "dev/sev-guest"}, simPort...), NameSim, "dev/vport1p2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			fixture(t, root, tc.paths...)
			p, err := Detect(context.Background(), root, tc.tee, nil)
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != tc.want {
				t.Fatalf("Detect = %s, want %s", p.Name(), tc.want)
			}
			if path := providerPath(t, p, root); tc.path != "" && path != filepath.Join(root, tc.path) {
				t.Errorf("provider uses %s, want %s", path, filepath.Join(root, tc.path))
			}
			if c, ok := p.(*ConfigfsTSM); ok && c.kind != tc.tee {
				t.Errorf("configfs-tsm accepts %q evidence, want only %q", c.kind, tc.tee)
			}
		})
	}
}

// A host that breaks the SEV or TDX guest driver of a confidential VM (so
// that its device is missing) gets neither its own sim evidence nor "no
// TEE": Detect fails with ErrTEEUnavailable, naming the TEE and the device.
func TestDetectNamedTEEMissingFailsClosed(t *testing.T) {
	for _, tc := range []struct {
		tee   string
		paths []string
		want  []string
	}{
		// The sim port (and the tsm directory, which any VM has) is there:
		// the host serves it, so it proves nothing.
		{"snp", append([]string{tsmDir}, simPort...), []string{"snp", "c8s.tee=snp", SEVGuestDevice, "sev-guest"}},
		// The other hardware TEE's device does not stand in either.
		{"snp", []string{"dev/tdx_guest"}, []string{"snp", SEVGuestDevice}},
		{"tdx", append([]string{tsmDir}, simPort...), []string{"tdx", "c8s.tee=tdx", TDXGuestDevice, "tdx-guest"}},
		{"tdx", []string{"dev/sev-guest"}, []string{"tdx", TDXGuestDevice}},
		{"sim", []string{tsmDir, "dev/sev-guest"}, []string{"sim", "c8s.tee=sim", SimPortName}},
	} {
		root := t.TempDir()
		fixture(t, root, tc.paths...)
		p, err := Detect(context.Background(), root, tc.tee, nil)
		if err == nil {
			t.Errorf("%s guest with %v: Detect = %s, want ErrTEEUnavailable", tc.tee, tc.paths, p.Name())
			continue
		}
		if !errors.Is(err, ErrTEEUnavailable) || errors.Is(err, ErrNoProvider) {
			t.Errorf("%s guest with %v: %v; want ErrTEEUnavailable and not ErrNoProvider (the agent's allow-all)", tc.tee, tc.paths, err)
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s guest: error %q does not name %s", tc.tee, err, w)
			}
		}
	}
}

func TestDetectUnknownTEE(t *testing.T) {
	root := t.TempDir()
	fixture(t, root, append([]string{"dev/sev-guest"}, simPort...)...)
	loaded := false
	_, err := Detect(context.Background(), root, "sgx", func() { loaded = true })
	if err == nil || !strings.Contains(err.Error(), `sgx`) || errors.Is(err, ErrNoProvider) {
		t.Fatalf("Detect(tee sgx) = %v, want an error naming it", err)
	}
	if loaded {
		t.Error("modules loaded for an unknown TEE")
	}
}

// The TEE names of the command line are the evidence kinds: Detect and
// configfs-tsm compare them.
func TestTEENamesAreKinds(t *testing.T) {
	if teeparam.SNP != KindSNP || teeparam.TDX != KindTDX {
		t.Fatalf("teeparam names %s, %s differ from evidence kinds %s, %s", teeparam.SNP, teeparam.TDX, KindSNP, KindTDX)
	}
}
