package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/ociimage"
)

// policyDeployment is the workload of TestK8sGeneratedPolicy as its owner
// writes it: the test image by digest (%s), a command, an env var, an
// emptyDir, an exec readiness probe, and the default service account's
// token (automountServiceAccountToken unset). Host networking and the
// not-ready toleration are the cluster harness's (no CNI).
const policyDeployment = `# A Deployment whose pod runs under a policy c8s-measure measured from it.
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  namespace: default
spec:
  replicas: 1
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      runtimeClassName: c8s
      hostNetwork: true
      terminationGracePeriodSeconds: 1
      tolerations:
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoSchedule}
      containers:
      - name: app
        image: %s
        imagePullPolicy: Never
        command:
        - sh
        - -c
        - echo "$GREETING"; test -s /var/run/secrets/kubernetes.io/serviceaccount/token && echo service account token mounted; date > /cache/ready; exec sleep 3600
        env:
        - {name: GREETING, value: hello from a measured pod}
        readinessProbe:
          exec:
            command: [cat, /cache/ready]
          periodSeconds: 2
          timeoutSeconds: 30
        volumeMounts:
        - {name: cache, mountPath: /cache}
      volumes:
      - name: cache
        emptyDir: {}
`

// TestK8sGeneratedPolicy runs a pod whose policy `c8s-measure policy`
// generated from its Deployment through the real kubelet, unchanged: a
// one-node cluster (kube-controller-manager's deployment, replicaset,
// service account and root CA controllers included, and the
// ServiceAccount admission plugin) on containerd with the packaged c8s
// handler (attestation required, virtio-fs on), and a RuntimeClass c8s.
//
// The Deployment (policyDeployment) goes through `c8s-measure policy
// --patch` with --image for the busybox test image's OCI layout and
// --sandbox-image for the node's pinned pause image, and the patched
// YAML, with its io.c8s.initdata annotation, is created through the API.
// Then:
//   - the pod becomes Ready: the kubelet's exec readiness probe is on the
//     policy's allowlist, the emptyDir and the token's projected volume
//     pass its mount rules;
//   - its log through the API (logs allowed by default) shows the env
//     var's value and that the service account token was mounted;
//   - the shim logged the init data the agent accepted, with the
//     HOST_DATA the generator printed and the policy enforced;
//   - an exec of the probe's command through the API's exec subresource
//     (kubectl exec) runs, and one not on the allowlist (reading the
//     token) is refused by name, policy.containers.app.exec, there and
//     through CRI ExecSync (the kubelet's call for probes), which also
//     gets the code: PermissionDenied;
//   - the same Deployment with one arg changed and the old annotation
//     never starts its container: the kubelet's Warning event and the
//     container's waiting state (RunContainerError: containerd creates
//     the task at StartContainer) name the refused field and
//     policy.containers.app.args.
//
// Two VMs in all, one at a time; each is gone, with its state, once its
// Deployment is deleted.
func TestK8sGeneratedPolicy(t *testing.T) {
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	e := &env{root: root, imageDir: filepath.Join(root, "_output", "image")}
	measure := filepath.Join(root, "bin", "c8s-measure")
	for _, f := range []string{filepath.Join(root, "bin", "containerd-shim-c8s-v2"), measure, filepath.Join(e.imageDir, "initrd.img")} {
		if _, err := os.Stat(f); err != nil {
			containerdtest.SkipOrFail(t, "%s is missing: run make build image", f)
		}
	}
	if _, err := os.Stat(virtiofsd); err != nil {
		containerdtest.SkipOrFail(t, "%s: %v (Debian package qemu-system-common): the service account token is a host share", virtiofsd, err)
	}
	dir, err := os.MkdirTemp("", "c8s-k8sp-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e.stateDir = filepath.Join(dir, "c8s")
	dropIn := installHandlers(t, dir, e)
	// The node's default handler (RuntimeClass c8s), sharing host volumes
	// (the token, /dev/shm) over virtio-fs.
	nodeConfig := filepath.Join(dir, "etc", "c8s", "config.toml")
	cfg, err := os.ReadFile(nodeConfig)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(cfg, []byte("[hypervisor]\n")) {
		t.Fatalf("%s has no [hypervisor] table:\n%s", nodeConfig, cfg)
	}
	cfg = []byte(strings.Replace(string(cfg), "[hypervisor]\n", "[hypervisor]\nvirtio_fs_daemon = \""+virtiofsd+"\"\n", 1))
	if err := os.WriteFile(nodeConfig, cfg, 0o644); err != nil {
		t.Fatal(err)
	}
	e.d = containerdtest.Start(t, containerdtest.Options{
		PathPrefix: []string{filepath.Join(root, "bin")},
		CRI:        true,
		Namespace:  "k8s.io",
		ExtraConfig: dropIn + fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = %q
`, pauseImage),
	})
	// The images, imported into containerd, are also the OCI layouts
	// (tarballs) the generator reads their configs from.
	layouts := map[string]string{}
	for _, img := range []ociimage.Options{{Name: image}, {Name: pauseImage, Cmd: pauseCmd}} {
		tarball := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(img.Name)+".tar")
		if err := ociimage.WriteFile(tarball, img); err != nil {
			t.Fatal(err)
		}
		e.d.Ctr(t, "images", "import", tarball)
		layouts[img.Name] = tarball
	}
	// The pod names the test image by digest, as an owner pins it.
	digest := layoutManifestDigest(t, layouts[image])
	byDigest := image[:strings.LastIndex(image, ":")] + "@" + digest
	e.d.Ctr(t, "images", "tag", image, byDigest)

	// The owner's side: measure the Deployment.
	yamlPath := filepath.Join(dir, "web.yaml")
	if err := os.WriteFile(yamlPath, fmt.Appendf(nil, policyDeployment, byDigest), 0o644); err != nil {
		t.Fatal(err)
	}
	patchedPath := filepath.Join(dir, "web.annotated.yaml")
	cmd := exec.Command(measure, "policy", "--patch", patchedPath, "--output-format", "json",
		"--image", byDigest+"="+layouts[image], "--image", pauseImage+"="+layouts[pauseImage],
		"--sandbox-image", pauseImage, yamlPath)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\n%s%s", strings.Join(cmd.Args, " "), err, stdout.String(), stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("c8s-measure policy warned:\n%s", stderr.String())
	}
	var measured []struct {
		InitData   string            `json:"initdata"`
		Annotation map[string]string `json:"annotation"`
		HostData   string            `json:"host_data"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &measured); err != nil || len(measured) != 1 {
		t.Fatalf("c8s-measure policy --output-format json: %v, %d workloads, want 1:\n%s", err, len(measured), stdout.String())
	}
	if !strings.Contains(measured[0].InitData, "[policy.containers.app]") {
		t.Fatalf("the generated init data has no rule for container app:\n%s", measured[0].InitData)
	}
	patched, err := os.ReadFile(patchedPath)
	if err != nil {
		t.Fatal(err)
	}
	var web appsv1.Deployment
	if err := sigsyaml.UnmarshalStrict(patched, &web); err != nil {
		t.Fatalf("the patched YAML: %v\n%s", err, patched)
	}
	if got, want := web.Spec.Template.Annotations[initdata.Annotation], measured[0].Annotation[initdata.Annotation]; got == "" || got != want {
		t.Fatalf("the patched pod template's %s annotation is %.40q…, want the generator's %.40q…", initdata.Annotation, got, want)
	}

	c := startClusterWith(t, dir, e.d.Address, clusterOptions{controllers: []string{
		"deployment-controller", "replicaset-controller", "garbage-collector-controller",
		"serviceaccount-controller", "root-ca-certificate-publisher-controller",
	}})
	ctx := context.Background()
	pods := c.cs.CoreV1().Pods("default")
	deployments := c.cs.AppsV1().Deployments("default")
	c.wait(t, "the kubelet's Node, the default service account and kube-root-ca.crt", 2*time.Minute, func(ctx context.Context) (bool, error) {
		if _, err := c.cs.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{}); err != nil {
			return false, err
		}
		if _, err := c.cs.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, err
		}
		_, err := c.cs.CoreV1().ConfigMaps("default").Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, err
	}, func() string {
		return "kubelet log:\n" + c.logTail("kubelet", 20) + "\nkube-controller-manager log:\n" + c.logTail("kube-controller-manager", 30)
	})
	if _, err := c.cs.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "c8s"}, Handler: "c8s"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// webPod returns the Deployment's one pod.
	webPod := func(ctx context.Context) (*corev1.Pod, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return nil, err
		}
		if len(l.Items) != 1 {
			return nil, fmt.Errorf("%d pods with app=web, want 1", len(l.Items))
		}
		return &l.Items[0], nil
	}
	podEvents := func(ctx context.Context, name string) []corev1.Event {
		evs, err := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return nil
		}
		return evs.Items
	}
	diag := func() string {
		var b strings.Builder
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			fmt.Fprintf(&b, "pods: %v\n", err)
		} else {
			for _, p := range l.Items {
				fmt.Fprintf(&b, "pod %s: phase %s node %q conditions %v\n", p.Name, p.Status.Phase, p.Spec.NodeName, p.Status.Conditions)
				for _, cs := range p.Status.ContainerStatuses {
					fmt.Fprintf(&b, "  container %s: %+v\n", cs.Name, cs.State)
				}
				for _, ev := range podEvents(ctx, p.Name) {
					fmt.Fprintf(&b, "  event %s %s: %s\n", ev.Type, ev.Reason, ev.Message)
				}
			}
		}
		for _, kind := range []string{"Deployment", "ReplicaSet"} {
			evs, _ := c.cs.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=" + kind})
			for _, ev := range evs.Items {
				fmt.Fprintf(&b, "%s %s event %s %s: %s\n", kind, ev.InvolvedObject.Name, ev.Type, ev.Reason, ev.Message)
			}
		}
		return b.String() + "kubelet log:\n" + c.logTail("kubelet", 30) + "\nkube-controller-manager log:\n" + c.logTail("kube-controller-manager", 10) +
			"\ncontainerd log:\n" + tail(e.d.Log(), 30)
	}
	// deleteWeb deletes the Deployment and waits until its ReplicaSet,
	// its pod and the pod's VM are gone.
	deleteWeb := func() {
		t.Helper()
		fg := metav1.DeletePropagationForeground
		if err := deployments.Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
			t.Fatalf("delete Deployment web: %v", err)
		}
		c.wait(t, "Deployment web, its ReplicaSet and its pod deleted", 3*time.Minute, func(ctx context.Context) (bool, error) {
			if _, err := deployments.Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, err
			}
			rs, err := c.cs.AppsV1().ReplicaSets("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil || len(rs.Items) > 0 {
				return false, err
			}
			l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			return err == nil && len(l.Items) == 0, err
		}, diag)
		e.assertNothingLeft(t)
	}

	// The patched Deployment, unchanged, through the API.
	if _, err := deployments.Create(ctx, &web, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the patched Deployment: %v", err)
	}
	t0 := time.Now()
	var pod *corev1.Pod
	c.wait(t, "the Deployment's pod Ready (its exec readiness probe allowed)", 6*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := webPod(ctx)
		if err != nil {
			return false, err
		}
		// A refusal (of the container, or of the probe's exec) fails
		// at once rather than at the deadline.
		for _, cs := range p.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && strings.Contains(w.Message, "policy") {
				t.Fatalf("container %s of the measured pod was refused: %s: %s\n%s", cs.Name, w.Reason, w.Message, diag())
			}
		}
		for _, ev := range podEvents(ctx, p.Name) {
			if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "policy") {
				t.Fatalf("the measured pod: %s: %s\n%s", ev.Reason, ev.Message, diag())
			}
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				pod = p
				return true, nil
			}
		}
		return false, nil
	}, diag)
	t.Logf("pod %s Ready %v after the Deployment was created", pod.Name, time.Since(t0).Round(time.Second))
	if pod.Annotations[initdata.Annotation] != measured[0].Annotation[initdata.Annotation] {
		t.Fatalf("pod %s does not carry the generated annotation", pod.Name)
	}
	if q := e.qemus(t); len(q) != 1 {
		t.Fatalf("QEMU processes with pod %s running: %v, want 1", pod.Name, q)
	}
	var mounted bool
	for _, v := range pod.Spec.Volumes {
		mounted = mounted || v.Projected != nil && strings.HasPrefix(v.Name, "kube-api-access-")
	}
	if !mounted {
		t.Fatalf("pod %s has no service account token volume (kube-api-access-*): %+v", pod.Name, pod.Spec.Volumes)
	}

	// kubectl logs: the policy lets the host read the container's output.
	logs, err := pods.GetLogs(pod.Name, &corev1.PodLogOptions{Container: "app"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("pod %s's log through the API: %v: %s", pod.Name, err, logs)
	}
	for _, want := range []string{"hello from a measured pod", "service account token mounted"} {
		if !strings.Contains(string(logs), want) {
			t.Errorf("pod %s's log through the API: %q, want %q in it", pod.Name, logs, want)
		}
	}

	// The agent took the measured init data the generator wrote: the
	// sandbox attested with its HOST_DATA, and the policy is enforced.
	accepted := ""
	for _, l := range strings.Split(e.d.Log(), "\n") {
		if strings.Contains(l, "measured init data accepted") {
			accepted = l
		}
	}
	if !strings.Contains(accepted, "host_data="+measured[0].HostData) || !strings.Contains(accepted, "policy=enforced") {
		t.Fatalf("the shim's last \"measured init data accepted\" line: %q, want host_data=%s policy=enforced", accepted, measured[0].HostData)
	}

	// kubectl exec through the API server and the kubelet: the probe's
	// command is on the allowlist, reading the token is not.
	restCfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	execIn := func(argv ...string) (string, error) {
		req := c.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace("default").Name(pod.Name).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: "app", Command: argv, Stdout: true, Stderr: true}, scheme.ParameterCodec)
		ws, err := remotecommand.NewWebSocketExecutor(restCfg, "GET", req.URL().String())
		if err != nil {
			return "", err
		}
		spdy, err := remotecommand.NewSPDYExecutor(restCfg, "POST", req.URL())
		if err != nil {
			return "", err
		}
		ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
			return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
		})
		if err != nil {
			return "", err
		}
		ectx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		var out strings.Builder
		err = ex.StreamWithContext(ectx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
		return out.String(), err
	}
	if out, err := execIn("cat", "/cache/ready"); err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("exec of the probe's command (on the allowlist) through the API: %v, output %q\n%s", err, out, diag())
	}
	out, err := execIn("cat", "/var/run/secrets/kubernetes.io/serviceaccount/token")
	if err == nil {
		t.Fatalf("exec of `cat TOKEN` (not on the allowlist) through the API ran: %q", out)
	}
	refusedExec := []string{`process.args ["cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"]`, "not allowed by policy.containers.app.exec", `(allowed: ["cat", "/cache/ready"])`}
	for _, want := range refusedExec {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("exec of `cat TOKEN` through the API: %v\nwant %q in the error", err, want)
		}
	}
	if strings.Contains(out, "eyJ") { // a JWT's header
		t.Errorf("the refused exec printed the token: %.20q…", out)
	}
	t.Logf("refused exec, as kubectl exec sees it: %v", err)
	// The streaming protocol carries only a message (an internal error
	// to the API client); the kubelet's own CRI call (probes use
	// ExecSync) gets the code: PermissionDenied.
	crip := &criPod{e: e}
	crip.connect(t)
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	res, err := crip.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: []string{"cat", "/var/run/secrets/kubernetes.io/serviceaccount/token"}, Timeout: 60})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("CRI ExecSync of `cat TOKEN`: %v (code %v), %v; want PermissionDenied", err, status.Code(err), res)
	}
	for _, want := range refusedExec {
		if !strings.Contains(status.Convert(err).Message(), want) {
			t.Errorf("CRI ExecSync of `cat TOKEN`: %v\nwant %q in the error", err, want)
		}
	}
	deleteWeb()

	// The same Deployment with one arg changed, not measured again: the
	// old annotation's policy refuses the container, by name.
	tampered := web.DeepCopy()
	tampered.ResourceVersion = ""
	app := &tampered.Spec.Template.Spec.Containers[0]
	app.Command[2] = strings.Replace(app.Command[2], "exec sleep 3600", "exec sleep 3601", 1)
	if app.Command[2] == web.Spec.Template.Spec.Containers[0].Command[2] {
		t.Fatalf("the test did not change the arg: %q", app.Command[2])
	}
	if _, err := deployments.Create(ctx, tampered, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the changed Deployment: %v", err)
	}
	var refusal string
	c.wait(t, "the changed pod's container refused by the policy, in an event", 6*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := webPod(ctx)
		if err != nil {
			return false, err
		}
		for _, cs := range p.Status.ContainerStatuses {
			if ran(cs.State) || ran(cs.LastTerminationState) {
				t.Fatalf("the changed pod's container ran: %+v\n%s", cs, diag())
			}
		}
		for _, ev := range podEvents(ctx, p.Name) {
			if ev.Type == corev1.EventTypeWarning && strings.Contains(ev.Message, "policy.containers.app.args") {
				refusal = ev.Reason + ": " + ev.Message
				pod = p
				return true, nil
			}
		}
		return false, nil
	}, diag)
	t.Logf("the kubelet's event for the changed pod: %s", refusal)
	// Its VM was launched with, attested with and enforces the same
	// measured init data: the refusal is the agent's, under the old policy.
	if pod.Annotations[initdata.Annotation] != measured[0].Annotation[initdata.Annotation] {
		t.Fatalf("the changed pod %s does not carry the old annotation", pod.Name)
	}
	if n := strings.Count(e.d.Log(), "host_data="+measured[0].HostData+" "); n != 2 {
		t.Errorf("the shim logged the generated init data accepted %d times, want 2 (one per VM)", n)
	}
	for _, want := range []string{"process.args", "exec sleep 3601", "not allowed by policy.containers.app.args"} {
		if !strings.Contains(refusal, want) {
			t.Errorf("the changed pod's event: %s\nwant %q in it", refusal, want)
		}
	}
	// containerd creates the task (and the shim the container in the
	// VM) at StartContainer: the kubelet reports RunContainerError, then
	// backs off (CrashLoopBackOff), and records each try as a StartError.
	c.wait(t, "the changed pod's container waiting with the refusal", 2*time.Minute, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Ready || ran(cs.State) || ran(cs.LastTerminationState) {
				t.Fatalf("the changed pod's container %s ran: %+v", cs.Name, cs)
			}
			msg := ""
			if w := cs.State.Waiting; w != nil {
				msg = w.Reason + ": " + w.Message
			}
			if lt := cs.LastTerminationState.Terminated; lt != nil && !strings.Contains(msg, "policy.") {
				msg += " (last: " + lt.Reason + ": " + lt.Message + ")"
			}
			if strings.Contains(msg, "not allowed by policy.containers.app.args") {
				t.Logf("the changed pod's container %s: %s", cs.Name, msg)
				return true, nil
			}
		}
		return false, nil
	}, diag)
	deleteWeb()
	if err := c.cs.NodeV1().RuntimeClasses().Delete(ctx, "c8s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// layoutManifestDigest returns the digest of the one image manifest of
// the OCI layout tarball at path (its index.json's entry).
func layoutManifestDigest(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s has no %s", path, ocispec.ImageIndexFile)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name != ocispec.ImageIndexFile {
			continue
		}
		var idx ocispec.Index
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			t.Fatal(err)
		}
		if len(idx.Manifests) != 1 {
			t.Fatalf("%s of %s lists %d manifests, want 1", ocispec.ImageIndexFile, path, len(idx.Manifests))
		}
		return idx.Manifests[0].Digest.String()
	}
}

// ran reports whether a container state shows the container running or
// having run; a StartError (the runtime never started it) is not a run.
func ran(s corev1.ContainerState) bool {
	return s.Running != nil || s.Terminated != nil && s.Terminated.Reason != "StartError"
}
