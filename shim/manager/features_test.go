package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	runtimeoptions "github.com/containerd/containerd/api/types/runtimeoptions/v1"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/runtime-spec/specs-go/features"
	"google.golang.org/protobuf/proto"

	"github.com/c8s-dev/c8s/internal/golden"
)

// featuresTypeURL is the TypeUrl containerd registers for features.Features
// (core/runtime/typeurl.go) and decodes RuntimeInfo.Features with.
const featuresTypeURL = "types.containerd.io/opencontainers/runtime-spec/1/features/Features"

// infoFeatures calls Info with the options on stdin and decodes Features as
// containerd does (core/runtime/v2 and the CRI plugin: typeurl.UnmarshalAny,
// then a type assertion).
func infoFeatures(t *testing.T, options []byte) *features.Features {
	t.Helper()
	info, err := New(RuntimeName).Info(context.Background(), bytes.NewReader(options))
	if err != nil {
		t.Fatalf("Info: %v", err)
	}
	if info.GetName() != RuntimeName || info.GetVersion().GetVersion() != Version {
		t.Errorf("Info name %q version %q, want %q %q", info.GetName(), info.GetVersion().GetVersion(), RuntimeName, Version)
	}
	if info.GetFeatures() == nil {
		t.Fatal("Info returned no Features")
	}
	if got := info.GetFeatures().GetTypeUrl(); got != featuresTypeURL {
		t.Fatalf("Features TypeUrl %q, want %q", got, featuresTypeURL)
	}
	v, err := typeurl.UnmarshalAny(info.GetFeatures())
	if err != nil {
		t.Fatalf("unmarshal Features: %v", err)
	}
	f, ok := v.(*features.Features)
	if !ok {
		t.Fatalf("Features is a %T, want *features.Features", v)
	}
	return f
}

func TestInfoReportsTheGuestRuntimeFeatures(t *testing.T) {
	f := infoFeatures(t, nil)

	if f.OCIVersionMin != "1.0.0" || f.OCIVersionMax != "1.0.2-dev" {
		t.Errorf("OCI versions %q..%q, want 1.0.0..1.0.2-dev", f.OCIVersionMin, f.OCIVersionMax)
	}
	if f.Hooks != nil {
		t.Errorf("hooks %v: the agent drops hooks, none is supported", f.Hooks)
	}
	for _, o := range []string{"rro", "rrw", "rnosuid", "rnodev", "rnoexec", "idmap", "tmpcopyup", "rbind", "ro"} {
		if !slices.Contains(f.MountOptions, o) {
			t.Errorf("mount option %q missing", o)
		}
	}
	// Options crun 1.8.1 does not have, or gets wrong.
	for _, o := range []string{"ridmap", "rrelatime", "rdirsync", "rnoatime", "rsync", "nosymfollow"} {
		if slices.Contains(f.MountOptions, o) {
			t.Errorf("mount option %q claimed", o)
		}
	}
	l := f.Linux
	if l == nil {
		t.Fatal("no linux features")
	}
	if want := []string{"cgroup", "ipc", "mount", "network", "pid", "user", "uts"}; !slices.Equal(l.Namespaces, want) {
		t.Errorf("namespaces %v, want %v", l.Namespaces, want)
	}
	if len(l.Capabilities) != 41 || l.Capabilities[0] != "CAP_CHOWN" || l.Capabilities[40] != "CAP_CHECKPOINT_RESTORE" {
		t.Errorf("capabilities %v: want the 41 of Linux 6.12 in kernel order", l.Capabilities)
	}
	isTrue := func(b *bool) bool { return b != nil && *b }
	isFalse := func(b *bool) bool { return b != nil && !*b }
	if c := l.Cgroup; c == nil || !isTrue(c.V2) || !isFalse(c.V1) || !isFalse(c.Systemd) || !isFalse(c.SystemdUser) {
		t.Errorf("cgroup %+v: want v2 only, without systemd", c)
	}
	s := l.Seccomp
	if s == nil || !isTrue(s.Enabled) {
		t.Fatalf("seccomp %+v not enabled", s)
	}
	if slices.Contains(s.Actions, "SCMP_ACT_NOTIFY") {
		t.Error("SCMP_ACT_NOTIFY claimed: its listener is on the host")
	}
	for _, a := range []string{"SCMP_ACT_ERRNO", "SCMP_ACT_KILL_PROCESS", "SCMP_ACT_LOG"} {
		if !slices.Contains(s.Actions, a) {
			t.Errorf("seccomp action %s missing", a)
		}
	}
	for _, a := range []string{"SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"} {
		if !slices.Contains(s.Archs, a) {
			t.Errorf("seccomp arch %s missing", a)
		}
	}
	if len(s.Operators) != 7 {
		t.Errorf("seccomp operators %v", s.Operators)
	}
	if l.Apparmor == nil || !isFalse(l.Apparmor.Enabled) || l.Selinux == nil || !isFalse(l.Selinux.Enabled) {
		t.Errorf("apparmor %+v selinux %+v: the agent drops profiles and labels", l.Apparmor, l.Selinux)
	}
	if l.IntelRdt == nil || !isFalse(l.IntelRdt.Enabled) {
		t.Errorf("intelRdt %+v, want disabled", l.IntelRdt)
	}
	if f.Annotations["run.oci.crun.version"] != guestCrunVersion || f.Annotations["io.github.seccomp.libseccomp.version"] != guestLibseccompVersion {
		t.Errorf("annotations %v", f.Annotations)
	}
	for _, a := range []string{"io.containerd.c8s.v2.group", "io.katacontainers.config.hypervisor.", "run.oci."} {
		if !slices.Contains(f.PotentiallyUnsafeConfigAnnotations, a) {
			t.Errorf("potentially unsafe annotation %q missing", a)
		}
	}

	// What containerd derives from them. The CRI plugin: recursive
	// read-only mounts if "rro" is there, user namespaces if "user" and
	// idmap are (internal/cri/server/service.go).
	if !slices.Contains(f.MountOptions, "rro") {
		t.Error("CRI would not enable recursive read-only mounts")
	}
	idmap := l.MountExtensions != nil && l.MountExtensions.IDMap != nil && isTrue(l.MountExtensions.IDMap.Enabled)
	if !idmap || !slices.Contains(l.Namespaces, "user") {
		t.Error("CRI would not enable user namespaces; the task manager would refuse idmap mounts (core/runtime/v2 supportsIDMapMounts)")
	}
}

func TestInfoIgnoresRuntimeOptions(t *testing.T) {
	// What containerd's CRI passes for a runtime that is not runc's.
	opts, err := typeurl.MarshalAnyToProto(&runtimeoptions.Options{ConfigPath: "/etc/c8s/config.toml"})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := proto.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	if f := infoFeatures(t, raw); !slices.Contains(f.MountOptions, "rro") {
		t.Errorf("features with options differ: %+v", f)
	}
}

func TestFeaturesGolden(t *testing.T) {
	got, err := json.MarshalIndent(Features(), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	golden.Check(t, "features.json", append(got, '\n'))
}

func TestFeaturesListsAreSortedSetsAndCopies(t *testing.T) {
	for name, l := range map[string][]string{
		"mount options": guestMountOptions, "namespaces": guestNamespaces,
		"seccomp actions": guestSeccompActions, "seccomp operators": guestSeccompOperators,
		"seccomp archs": guestSeccompArchs, "unsafe annotations": unsafeConfigAnnotations,
	} {
		if !slices.IsSorted(l) || len(slices.Compact(slices.Clone(l))) != len(l) {
			t.Errorf("%s not sorted or not unique: %v", name, l)
		}
	}
	f := Features()
	f.MountOptions[0] = "changed"
	*f.Linux.Cgroup.V2 = false
	if g := Features(); g.MountOptions[0] == "changed" || !*g.Linux.Cgroup.V2 {
		t.Error("Features shares state between calls")
	}
}

// TestFeaturesMatchTheImage checks the facts features.go is built from
// against their sources: images/build.sh's kernel, and the crun
// images/crun.sh builds for the image (its pinned version and commit, which
// it checks against the binary's crun --version, and the features it
// refuses) and the libseccomp it links. When it fails, check the new crun
// or kernel (mount options, namespaces, seccomp) before updating the
// constants and the golden file.
func TestFeaturesMatchTheImage(t *testing.T) {
	script, err := os.ReadFile("../../images/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "\nKERNEL_PKG=linux-image-"+guestKernelSeries+".") {
		t.Errorf("images/build.sh's KERNEL_PKG is not a %s kernel", guestKernelSeries)
	}
	if !strings.Contains(string(script), `CRUN=$("$ROOT/images/crun.sh" "$CACHE")`) {
		t.Error("images/build.sh no longer builds the image's crun with images/crun.sh")
	}
	crun, err := os.ReadFile("../../images/crun.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, pin := range []string{"\nCRUN_VERSION=" + guestCrunVersion + "\n", "\nCRUN_COMMIT=" + guestCrunCommit + "\n"} {
		if !strings.Contains(string(crun), pin) {
			t.Errorf("images/crun.sh does not pin %q: features.go describes crun %s, commit %s", strings.TrimSpace(pin), guestCrunVersion, guestCrunCommit)
		}
	}
	for _, f := range []string{"+CRIU", "+WASM", "+LIBKRUN", "+SYSTEMD"} {
		if !regexp.MustCompile(`(?m)^\s*for f in .*` + regexp.QuoteMeta(f) + `.*; do\n.*!=`).Match(crun) {
			t.Errorf("images/crun.sh no longer refuses a crun built with %s: update the annotations", f)
		}
	}

	osRelease, _ := os.ReadFile("/etc/os-release")
	if !regexp.MustCompile(`(?m)^ID=debian$`).Match(osRelease) || !regexp.MustCompile(`(?m)^VERSION_ID="12"$`).Match(osRelease) {
		t.Skip("not a Debian 12 build host: its libseccomp is not the image's")
	}
	out, err := exec.Command("dpkg-query", "-W", "-f", "${Version}", "libseccomp-dev").Output()
	if err != nil {
		t.Fatalf("libseccomp-dev, which images/crun.sh links into crun, is not installed (make deps): %v", err)
	}
	if !strings.HasPrefix(string(out), guestLibseccompVersion+"-") {
		t.Errorf("libseccomp-dev is %s, features.go says %s", out, guestLibseccompVersion)
	}
}
