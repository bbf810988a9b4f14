package task

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/containerd/containerd/v2/pkg/stdio"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// hostUTSSpec is a spec as CRI writes it for a host-network pod's
// container: no "uts" namespace, with fields this shim's runtime-spec may
// not know.
const hostUTSSpec = `{"ociVersion":"1.2.1","process":{"args":["pause"],"cwd":"/"},
"future":{"kept":true},
"linux":{"namespaces":[{"type":"pid"},{"type":"ipc","path":"/proc/42/ns/ipc"},{"type":"mount"}],
"resources":{"memory":{"limit":9223372036854775807}},"futureLinux":[1,2]}}`

func parseSpec(t *testing.T, raw []byte) (*specs.Spec, map[string]any) {
	t.Helper()
	var s specs.Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("spec %s: %v", raw, err)
	}
	var doc map[string]any
	d := json.NewDecoder(strings.NewReader(string(raw)))
	d.UseNumber()
	if err := d.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	return &s, doc
}

func utsOf(s *specs.Spec) []specs.LinuxNamespace {
	var out []specs.LinuxNamespace
	for _, ns := range s.Linux.Namespaces {
		if ns.Type == specs.UTSNamespace {
			out = append(out, ns)
		}
	}
	return out
}

func node(name string) func() (string, error) {
	return func() (string, error) { return name, nil }
}

// The sandbox container of a host-network pod gets a UTS namespace of its
// own named as the node; nothing else in its spec changes.
func TestNodeUTSNamesTheSandboxAsTheNode(t *testing.T) {
	spec, _ := parseSpec(t, []byte(hostUTSSpec))
	out, err := nodeUTS("sb", []byte(hostUTSSpec), spec, "", node("node-1"))
	if err != nil {
		t.Fatal(err)
	}
	got, doc := parseSpec(t, out)
	if uts := utsOf(got); got.Hostname != "node-1" || len(uts) != 1 || uts[0].Path != "" {
		t.Fatalf("hostname %q, UTS namespaces %+v; want node-1 in a new UTS namespace", got.Hostname, uts)
	}
	if len(got.Linux.Namespaces) != 4 || got.Linux.Namespaces[1].Path != "/proc/42/ns/ipc" {
		t.Errorf("the other namespaces changed: %+v", got.Linux.Namespaces)
	}
	linux := doc["linux"].(map[string]any)
	if doc["future"] == nil || linux["futureLinux"] == nil {
		t.Errorf("fields unknown to runtime-spec were dropped: %s", out)
	}
	if lim := linux["resources"].(map[string]any)["memory"].(map[string]any)["limit"]; lim.(json.Number).String() != "9223372036854775807" {
		t.Errorf("memory limit = %v, want it exact", lim)
	}
	if spec.Hostname != "node-1" || len(utsOf(spec)) != 1 {
		t.Errorf("the parsed spec was not updated alike: %q %+v", spec.Hostname, spec.Linux.Namespaces)
	}
}

// The pod's other containers join the sandbox container's UTS namespace,
// by the path the guest replaces with its sandbox container's.
func TestNodeUTSJoinsTheSandboxsNamespace(t *testing.T) {
	spec, _ := parseSpec(t, []byte(hostUTSSpec))
	out, err := nodeUTS("app", []byte(hostUTSSpec), spec, "/proc/7/ns/uts",
		func() (string, error) { t.Error("the node's name was read for a container that joins"); return "", nil })
	if err != nil {
		t.Fatal(err)
	}
	got, _ := parseSpec(t, out)
	if uts := utsOf(got); got.Hostname != "" || len(uts) != 1 || uts[0].Path != "/proc/7/ns/uts" {
		t.Fatalf("hostname %q, UTS namespaces %+v; want the sandbox's joined, no hostname", got.Hostname, uts)
	}
}

// A container with a UTS namespace of its own (any pod that is not
// host-network) is left as it is, byte for byte.
func TestNodeUTSLeavesPrivateUTSAlone(t *testing.T) {
	for _, raw := range []string{
		`{"hostname":"web","process":{"args":["x"]},"linux":{"namespaces":[{"type":"uts"}]}}`,
		`{"process":{"args":["x"]},"linux":{"namespaces":[{"type":"uts","path":"/proc/9/ns/uts"}]}}`,
		`{"hostname":"no-linux","process":{"args":["x"]}}`,
	} {
		spec, _ := parseSpec(t, []byte(raw))
		out, err := nodeUTS("c", []byte(raw), spec, "/proc/1/ns/uts", node("node-1"))
		if err != nil || string(out) != raw {
			t.Errorf("nodeUTS(%s) = %s, %v; want it unchanged", raw, out, err)
		}
	}
}

// As runc: a hostname or domain name without a private UTS namespace is
// an error (CRI: a host-network pod with a hostname fails).
func TestNodeUTSRefusesAHostnameAsRuncDoes(t *testing.T) {
	for _, field := range []string{"hostname", "domainname"} {
		raw := `{"` + field + `":"custom","process":{"args":["x"]},"linux":{"namespaces":[{"type":"pid"}]}}`
		spec, _ := parseSpec(t, []byte(raw))
		_, err := nodeUTS("sb", []byte(raw), spec, "", node("node-1"))
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("%s without a UTS namespace: %v, want InvalidArgument", field, err)
		}
		for _, want := range []string{`"sb"`, `"custom"`, "unable to set " + field + " without a private UTS namespace", "hostNetwork"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}
		}
	}
}

func TestNodeUTSNodeNameError(t *testing.T) {
	spec, _ := parseSpec(t, []byte(hostUTSSpec))
	_, err := nodeUTS("sb", []byte(hostUTSSpec), spec, "", func() (string, error) { return "", errors.New("uname failed") })
	if err == nil || !strings.Contains(err.Error(), "node's hostname") || !strings.Contains(err.Error(), "uname failed") {
		t.Fatalf("error = %v, want it to name the node's hostname and the cause", err)
	}
}

// withNodeUTS joins a container to the sandbox container's UTS namespace
// by the pid reported for the sandbox, once the shim has it.
func TestWithNodeUTSJoinsOnlyAnExistingSandbox(t *testing.T) {
	pod := &podState{id: "sb"}
	sbInit := newProcess("sb", "", stdio.Stdio{}, nil)
	sbInit.setRunning(4242)
	s := &service{conts: map[string]*container{}}
	for _, tc := range []struct {
		id, wantPath string
		withSandbox  bool
	}{
		{"sb", "", false},
		{"app", "", false}, // no sandbox container in this shim: a UTS namespace of its own
		{"app", "/proc/4242/ns/uts", true},
	} {
		if tc.withSandbox {
			s.conts["sb"] = &container{id: "sb", init: sbInit}
		}
		spec, _ := parseSpec(t, []byte(hostUTSSpec))
		out, err := s.withNodeUTS(tc.id, pod, []byte(hostUTSSpec), spec)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := parseSpec(t, out)
		uts := utsOf(got)
		if len(uts) != 1 || uts[0].Path != tc.wantPath || (tc.wantPath == "") != (got.Hostname != "") {
			t.Errorf("%s (sandbox known: %v): UTS %+v hostname %q; want path %q", tc.id, tc.withSandbox, uts, got.Hostname, tc.wantPath)
		}
	}
}

// Containers CRI made report QEMU's pid for all their processes; others
// their guest pids.
func TestCRIContainersReportTheHostPid(t *testing.T) {
	for _, tc := range []struct {
		ann  map[string]string
		want uint32
	}{
		{map[string]string{ContainerTypeAnnotation: "sandbox"}, 999},
		{map[string]string{ContainerTypeAnnotation: "container", SandboxIDAnnotation: "sb"}, 999},
		{map[string]string{SandboxIDAnnotation: "sb"}, 7},
		{nil, 7},
	} {
		c := &container{hostPid: criHostPid(&specs.Spec{Annotations: tc.ann}, 999)}
		if got := c.reported(7); got != tc.want {
			t.Errorf("annotations %v: reported pid %d, want %d", tc.ann, got, tc.want)
		}
	}
	if got := criHostPid(&specs.Spec{Annotations: map[string]string{ContainerTypeAnnotation: "sandbox"}}, 0); got != 0 {
		t.Errorf("no QEMU pid known: %d, want 0 (guest pids)", got)
	}
}
