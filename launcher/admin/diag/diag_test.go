package diag

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/internal/golden"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
	"github.com/c8s-dev/c8s/manifest"
)

// fixtureRoot copies testdata/<name> into a short temporary directory (unix
// socket paths are limited to 108 bytes) and makes what git cannot hold:
// files named *.pad4m become the file without that suffix, zero-padded at
// the front to 4 MiB (firmware images end in their metadata tables), and
// every path in .sockets becomes a listening unix socket; one marked
// "grpc" serves containerd's version API.
func fixtureRoot(t *testing.T, name string) string {
	t.Helper()
	root, err := os.MkdirTemp("", "c8s-diag-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	src := filepath.Join("testdata", name)
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		dst := filepath.Join(root, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if strings.HasSuffix(dst, ".pad4m") {
			dst = strings.TrimSuffix(dst, ".pad4m")
			data = append(make([]byte, 4<<20-len(data)), data...)
		}
		return os.WriteFile(dst, data, info.Mode().Perm())
	})
	if err != nil {
		t.Fatal(err)
	}
	sockets, err := os.ReadFile(filepath.Join(root, ".sockets"))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(sockets))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		p := filepath.Join(root, f[0])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		if len(f) > 1 && f[1] == "grpc" {
			srv := grpc.NewServer()
			versionapi.RegisterVersionServer(srv, fakeVersion{})
			runtimeapi.RegisterRuntimeServiceServer(srv, fakeCRI{})
			go func() { _ = srv.Serve(l) }()
			t.Cleanup(srv.Stop)
			continue
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	return root
}

type fakeVersion struct {
	versionapi.UnimplementedVersionServer
}

func (fakeVersion) Version(context.Context, *emptypb.Empty) (*versionapi.VersionResponse, error) {
	return &versionapi.VersionResponse{Version: "v2.2.0-fixture", Revision: "fixture"}, nil
}

// criHandlers are the handlers the fixtures' fake containerd says it loaded.
var criHandlers = []string{"", "c8s", "c8s-snp", "runc"}

type fakeCRI struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (fakeCRI) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	resp := &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{}}
	for _, h := range criHandlers {
		resp.RuntimeHandlers = append(resp.RuntimeHandlers, &runtimeapi.RuntimeHandler{Name: h})
	}
	return resp, nil
}

// fixtureConfig loads the fixture's /etc/c8s/config.toml, or the defaults.
func fixtureConfig(t *testing.T, root string) config.Config {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "etc/c8s/config.toml"))
	if os.IsNotExist(err) {
		return config.Default()
	}
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return *cfg
}

// fakeProbe answers the KVM probe without booting anything and records
// that it was asked.
func fakeProbe(accelName string, calls *int) ProbeFunc {
	return func(_ context.Context, _, _, _ string) (accel.Result, error) {
		*calls++
		return accel.Result{Accel: accelName, Reason: "fixture probe chose " + accelName}, nil
	}
}

func byID(rep *Report) map[string]Result {
	m := map[string]Result{}
	for _, r := range rep.Checks {
		m[r.ID] = r
	}
	return m
}

// TestFixtureHosts runs every check against the three fixture trees, compares
// the text and JSON reports with golden files, and asserts the outcomes
// each tree was built to produce.
func TestFixtureHosts(t *testing.T) {
	cases := []struct {
		name   string
		failed bool
		want   map[string]Status
	}{
		{"snp-host", false, map[string]Status{
			"cpu.virt": Pass, "kvm.device": Pass, "kvm.probe": Pass, "qemu.binary": Pass, "qemu.snp": Pass,
			"qemu.tdx": Warn, "qemu.igvm": Pass, "qemu.migration": Pass, "firmware": Pass, "snp.host": Pass,
			"tdx.host": Warn, "image": Pass, "containerd.socket": Pass, "containerd.handler": Pass, "kubelet.socket": Pass,
		}},
		{"tdx-host", true, map[string]Status{
			"cpu.virt": Pass, "kvm.probe": Pass, "qemu.snp": Warn, "qemu.tdx": Pass, "snp.host": Warn,
			"tdx.host": Fail, "image": Pass, "containerd.socket": Pass, "containerd.handler": Fail, "kubelet.socket": Warn,
		}},
		{"plain-host", true, map[string]Status{
			"cpu.virt": Warn, "kvm.device": Warn, "kvm.probe": Warn, "qemu.binary": Pass, "qemu.snp": Warn,
			"qemu.igvm": Warn, "firmware": Fail, "snp.host": Warn, "tdx.host": Warn, "image": Fail, "image.digest": Warn,
			"containerd.socket": Fail, "containerd.handler": Fail, "kubelet.socket": Warn,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root := fixtureRoot(t, tc.name)
			calls := 0
			rep := Run(context.Background(), Options{Root: root, Config: fixtureConfig(t, root), Probe: fakeProbe("kvm", &calls)})
			got := byID(rep)
			for id, want := range tc.want {
				if got[id].Status != want {
					t.Errorf("%s: status %s, want %s (%s)", id, got[id].Status, want, got[id].Detail)
				}
			}
			if rep.Failed() != tc.failed {
				t.Errorf("Failed() = %v, want %v", rep.Failed(), tc.failed)
			}
			if wantCalls := map[bool]int{true: 1, false: 0}[got["kvm.device"].Status == Pass]; calls != wantCalls {
				t.Errorf("the probe ran %d times with kvm.device %s", calls, got["kvm.device"].Status)
			}
			for _, r := range rep.Checks {
				if r.Status != Pass && r.Hint == "" {
					t.Errorf("%s is %s without a hint", r.ID, r.Status)
				}
				if strings.Contains(r.Detail, root) {
					t.Errorf("%s detail leaks the fixture root: %s", r.ID, r.Detail)
				}
			}
			var js, txt bytes.Buffer
			if err := rep.WriteJSON(&js); err != nil {
				t.Fatal(err)
			}
			if err := rep.WriteText(&txt); err != nil {
				t.Fatal(err)
			}
			golden.Check(t, tc.name+".json", js.Bytes())
			golden.Check(t, tc.name+".txt", txt.Bytes())
		})
	}
}

// TestJSONSchemaIsStable pins the report's field names and the check IDs in
// order: consumers of c8s.io/check/v1 rely on both.
func TestJSONSchemaIsStable(t *testing.T) {
	wantIDs := []string{"cpu.virt", "kvm.device", "kvm.probe", "qemu.binary", "qemu.snp", "qemu.tdx", "qemu.igvm",
		"qemu.migration", "firmware", "snp.host", "tdx.host", "image", "image.digest", "containerd.socket", "containerd.handler", "kubelet.socket"}
	if !reflect.DeepEqual(IDs(), wantIDs) {
		t.Fatalf("check IDs changed:\n got %v\nwant %v", IDs(), wantIDs)
	}
	root := fixtureRoot(t, "plain-host")
	rep := Run(context.Background(), Options{Root: root, Config: fixtureConfig(t, root)})
	var buf bytes.Buffer
	if err := rep.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	if doc["schema"] != Schema || doc["tee"] != "sim" {
		t.Fatalf("schema/tee: %v %v", doc["schema"], doc["tee"])
	}
	if s := doc["summary"].(map[string]any); len(s) != 3 || s["pass"] == nil || s["warn"] == nil || s["fail"] == nil {
		t.Fatalf("summary: %v", s)
	}
	allowed := map[string]bool{"id": true, "title": true, "status": true, "detail": true, "hint": true, "facts": true}
	for i, c := range doc["checks"].([]any) {
		for k := range c.(map[string]any) {
			if !allowed[k] {
				t.Errorf("check %d has field %q outside the schema", i, k)
			}
		}
		if id := c.(map[string]any)["id"]; id != wantIDs[i] {
			t.Errorf("check %d is %v, want %s", i, id, wantIDs[i])
		}
	}
}

// TestSeverityFollowsTheTEE checks the same host for each TEE: a gap is a
// fail only for the TEE that needs it.
func TestSeverityFollowsTheTEE(t *testing.T) {
	root := fixtureRoot(t, "snp-host")
	calls := 0
	for _, tc := range []struct {
		tee, probe string
		want       map[string]Status
	}{
		{"snp", "tcg", map[string]Status{"kvm.probe": Fail, "tdx.host": Warn, "qemu.tdx": Warn}},
		{"sim", "tcg", map[string]Status{"kvm.probe": Warn, "snp.host": Pass}},
		{"tdx", "kvm", map[string]Status{"kvm.probe": Pass, "tdx.host": Fail, "qemu.tdx": Fail, "snp.host": Pass}},
	} {
		rep := Run(context.Background(), Options{Root: root, Config: fixtureConfig(t, root), TEE: tc.tee, Probe: fakeProbe(tc.probe, &calls)})
		got := byID(rep)
		for id, want := range tc.want {
			if got[id].Status != want {
				t.Errorf("tee=%s probe=%s: %s is %s, want %s (%s)", tc.tee, tc.probe, id, got[id].Status, want, got[id].Detail)
			}
		}
		if rep.TEE != tc.tee {
			t.Errorf("report TEE %q, want %q", rep.TEE, tc.tee)
		}
	}
	// A sim node whose configuration forces KVM fails when KVM does not work.
	cfg := fixtureConfig(t, root)
	cfg.Hypervisor.Accel = "kvm"
	rep := Run(context.Background(), Options{Root: root, Config: cfg, TEE: "sim", Probe: fakeProbe("tcg", &calls)})
	if r := byID(rep)["kvm.probe"]; r.Status != Fail || !strings.Contains(r.Hint, "hypervisor.accel") {
		t.Errorf("accel=kvm on a host where KVM does not run guests: %+v", r)
	}
}

// TestCachedProbeIsUsedUnlessNoCache checks that the probe is handed the
// configured cache directory, and none with NoCache.
func TestCachedProbeIsUsedUnlessNoCache(t *testing.T) {
	root := fixtureRoot(t, "snp-host")
	cfg := fixtureConfig(t, root)
	cfg.Runtime.CacheDir = "/var/cache/c8s"
	for _, noCache := range []bool{false, true} {
		var gotCache string
		probe := func(_ context.Context, _, kernel, cacheDir string) (accel.Result, error) {
			gotCache = cacheDir
			if kernel != filepath.Join(root, "usr/local/share/c8s/vmlinuz") {
				t.Errorf("probe kernel %s", kernel)
			}
			return accel.Result{Accel: "tcg", Reason: "cached", Cached: true}, nil
		}
		rep := Run(context.Background(), Options{Root: root, Config: cfg, NoCache: noCache, Probe: probe})
		want := "/var/cache/c8s"
		if noCache {
			want = ""
		}
		if gotCache != want {
			t.Errorf("NoCache=%v: probe cache dir %q, want %q", noCache, gotCache, want)
		}
		if r := byID(rep)["kvm.probe"]; !strings.Contains(r.Detail, "cached result") || r.Facts["cached"] != "true" {
			t.Errorf("cached probe result not reported as such: %+v", r)
		}
	}
}

// TestHandlersNotLoadedUntilRestart: handlers in the config that the
// running containerd does not report (no restart since install) fail.
func TestHandlersNotLoadedUntilRestart(t *testing.T) {
	saved := criHandlers
	criHandlers = []string{"runc"}
	t.Cleanup(func() { criHandlers = saved })
	root := fixtureRoot(t, "snp-host")
	calls := 0
	r := byID(Run(context.Background(), Options{Root: root, Config: fixtureConfig(t, root), Probe: fakeProbe("kvm", &calls)}))["containerd.handler"]
	if r.Status != Fail || !strings.Contains(r.Detail, "has not loaded c8s, c8s-snp") || !strings.Contains(r.Hint, "restart containerd") {
		t.Fatalf("containerd.handler: %+v", r)
	}
}

// TestSimLaunchDigest recomputes the sim launch digest on a fixture tree
// and compares it with the manifest's: a match passes, another command line
// fails naming the cause, and the digest follows the initrd.
func TestSimLaunchDigest(t *testing.T) {
	root := fixtureRoot(t, "snp-host")
	cfg := fixtureConfig(t, root)
	run := func(cfg config.Config) Result {
		return byID(Run(context.Background(), Options{Root: root, Config: cfg, TEE: "sim"}))["image.digest"]
	}
	first := run(cfg)
	if first.Status != Warn || len(first.Facts["sim"]) != 96 || !strings.Contains(first.Detail, `no "sim" digests`) {
		t.Fatalf("image.digest without expected digests: %+v", first)
	}
	manifestPath := filepath.Join(root, "usr/local/share/c8s/manifest.json")
	m, err := manifest.Load(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := os.ReadFile(filepath.Join(root, "usr/share/ovmf/OVMF.fd"))
	if err != nil {
		t.Fatal(err)
	}
	fwSum := sha256.Sum256(fw)
	expect := func(digest, cmdline string) {
		t.Helper()
		err := m.SetSim(manifest.SimDigests{
			Firmware: manifest.FileDigest{Path: "/usr/share/ovmf/OVMF.fd", SHA256: hex.EncodeToString(fwSum[:])},
			Cmdline:  cmdline, VCPUType: "EPYC-v4", GuestFeatures: 1,
			ByVCPUs: map[string]string{"1": digest},
		})
		if err != nil {
			t.Fatal(err)
		}
		data, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(manifestPath, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A sim VM's command line: the image's common one (here just the
	// launcher's built-in parameters) and the sim TEE's c8s.tee=sim.
	expect(first.Facts["sim"], vm.BaseKernelParams+" c8s.tee=sim")
	if r := run(cfg); r.Status != Pass || !strings.Contains(r.Detail, "as manifest.json expects") {
		t.Fatalf("matching manifest digest: %+v", r)
	}
	withParams := cfg
	withParams.Hypervisor.KernelParams = "debug"
	if r := run(withParams); r.Status != Fail || !strings.Contains(r.Detail, `kernel command line "`+vm.BaseKernelParams+` c8s.tee=sim debug" differs`) {
		t.Fatalf("another command line: %+v", r)
	}
	twoVCPUs := cfg
	twoVCPUs.Hypervisor.DefaultVCPUs = 2
	if r := run(twoVCPUs); r.Status != Warn || !strings.Contains(r.Detail, "no digest for 2 vCPUs") {
		t.Fatalf("a vCPU count the manifest lacks: %+v", r)
	}
	initrd := filepath.Join(root, "usr/local/share/c8s/initrd.img")
	orig, _ := os.ReadFile(initrd)
	if err := os.WriteFile(initrd, append(orig, 'x'), 0o644); err != nil {
		t.Fatal(err)
	}
	// The image check fails on the changed initrd, so there is no verified
	// manifest to compare with; the recomputed digest still changes.
	if r := run(cfg); r.Facts["sim"] == "" || r.Facts["sim"] == first.Facts["sim"] || r.Status != Warn {
		t.Fatalf("the digest does not follow the initrd: %+v", r)
	}
}
