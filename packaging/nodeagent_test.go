package packaging

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// nodeAgentDocs splits the rendered node-agent manifest into its documents
// and decodes each strictly into its Kubernetes API type, so a misspelt
// or misplaced field fails.
type nodeAgentDocs struct {
	sa      corev1.ServiceAccount
	role    rbacv1.ClusterRole
	binding rbacv1.ClusterRoleBinding
	ds      appsv1.DaemonSet
}

func decodeNodeAgent(t *testing.T, out string) nodeAgentDocs {
	t.Helper()
	var d nodeAgentDocs
	targets := map[string]any{"ServiceAccount": &d.sa, "ClusterRole": &d.role, "ClusterRoleBinding": &d.binding, "DaemonSet": &d.ds}
	seen := map[string]bool{}
	dec := yaml.NewDecoder(strings.NewReader(out))
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("not valid YAML: %v", err)
		}
		kind, _ := doc["kind"].(string)
		target, ok := targets[kind]
		if !ok || seen[kind] {
			t.Fatalf("unexpected or repeated document of kind %q", kind)
		}
		seen[kind] = true
		var buf bytes.Buffer
		if err := yaml.NewEncoder(&buf).Encode(doc); err != nil {
			t.Fatal(err)
		}
		if err := sigsyaml.UnmarshalStrict(buf.Bytes(), target); err != nil {
			t.Fatalf("%s does not decode as the Kubernetes type: %v", kind, err)
		}
	}
	if len(seen) != len(targets) {
		t.Fatalf("documents %v, want %d kinds", seen, len(targets))
	}
	return d
}

// TestNodeAgentManifest checks the node-agent DaemonSet and its RBAC:
// golden, strict decoding into the API types, the rules the agent needs
// and no more, and the host paths it reads.
func TestNodeAgentManifest(t *testing.T) {
	out, err := Render("kubernetes/node-agent.yaml", paths)
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "kubernetes/node-agent.yaml", out)
	d := decodeNodeAgent(t, out)

	rules := map[string][]string{}
	for _, r := range d.role.Rules {
		if !slices.Equal(r.APIGroups, []string{""}) {
			t.Errorf("rule outside the core API group: %v", r)
		}
		for _, res := range r.Resources {
			rules[res] = append(rules[res], r.Verbs...)
		}
	}
	want := map[string][]string{"nodes": {"get", "patch"}, "nodes/status": {"patch"}, "pods": {"get", "list"},
		"pods/status": {"patch"}, "events": {"create"}, "configmaps": {"get"}}
	if len(rules) != len(want) {
		t.Errorf("ClusterRole rules %v, want %v", rules, want)
	}
	for res, verbs := range want {
		if !slices.Equal(rules[res], verbs) {
			t.Errorf("ClusterRole rules for %s: %v, want %v", res, rules[res], verbs)
		}
	}
	for _, r := range d.role.Rules {
		// The trust bundle's ConfigMap only, not every ConfigMap.
		if slices.Contains(r.Resources, "configmaps") && !slices.Equal(r.ResourceNames, []string{"c8s-trust-bundle"}) {
			t.Errorf("configmaps rule %+v: want resourceNames [c8s-trust-bundle]", r)
		}
	}
	if d.binding.RoleRef.Kind != "ClusterRole" || d.binding.RoleRef.Name != d.role.Name ||
		len(d.binding.Subjects) != 1 || d.binding.Subjects[0].Kind != "ServiceAccount" ||
		d.binding.Subjects[0].Name != d.sa.Name || d.binding.Subjects[0].Namespace != d.sa.Namespace {
		t.Errorf("the binding does not bind the role to the service account: %+v", d.binding)
	}

	ds := d.ds
	if ds.Namespace != d.sa.Namespace || ds.Spec.Template.Spec.ServiceAccountName != d.sa.Name {
		t.Errorf("the DaemonSet (%s) does not run as the service account %s/%s", ds.Namespace, d.sa.Namespace, d.sa.Name)
	}
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Labels[k] != v {
			t.Errorf("selector %s=%s does not match the pod template labels", k, v)
		}
	}
	pod := ds.Spec.Template.Spec
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Operator != corev1.TolerationOpExists || pod.Tolerations[0].Key != "" {
		t.Errorf("the agent must tolerate every taint, its own c8s.io/confidential included: %v", pod.Tolerations)
	}
	// The pod VMs' QEMU pids are the host's.
	if !pod.HostPID {
		t.Error("the agent does not see the host's processes (hostPID)")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	cmd := strings.Join(c.Command, " ")
	for _, w := range []string{"c8s-launcher node-agent", "--config=/etc/c8s/config.toml", "--device-plugin-dir=/var/lib/kubelet/device-plugins", "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock"} {
		if !strings.Contains(cmd, w) {
			t.Errorf("command lacks %q: %s", w, cmd)
		}
	}
	var nodeName bool
	for _, e := range c.Env {
		nodeName = nodeName || (e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName")
	}
	if !nodeName {
		t.Errorf("NODE_NAME does not come from spec.nodeName: %v", c.Env)
	}
	hostPaths := map[string]string{}
	for _, v := range pod.Volumes {
		if v.HostPath == nil {
			t.Errorf("volume %s is not a host path", v.Name)
			continue
		}
		hostPaths[v.Name] = v.HostPath.Path
	}
	mounted := map[string]string{}
	for _, m := range c.VolumeMounts {
		hp, ok := hostPaths[m.Name]
		if !ok {
			t.Errorf("mount %s names no volume", m.Name)
		}
		mounted[hp] = m.MountPath
	}
	for _, p := range []string{"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/etc/c8s", "/sys", "/dev", "/run/c8s", "/run/containerd", "/usr/local/share/c8s"} {
		if mounted[p] != p {
			t.Errorf("host %s is mounted at %q, want the same path", p, mounted[p])
		}
	}
}
