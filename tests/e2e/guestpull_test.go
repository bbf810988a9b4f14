package e2e

// Guest pull end to end (issue 16): a container whose measured policy
// names a digest-pinned image, and for which the node offers no layer
// disks, runs from the image the guest pulled itself over the pod's CNI
// network, verifying every digest; a blob the network changed is refused.

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	kbs "github.com/c8s-dev/c8s/launcher/broker"
	"github.com/c8s-dev/c8s/tests/internal/containerdtest"
	"github.com/c8s-dev/c8s/tests/internal/layerimage"
)

// Network of TestGuestPull: its own bridge and subnet.
const (
	pullBridge  = "c8se2epull0"
	pullSubnet  = "10.231.13.0/24"
	pullGateway = "10.231.13.1"
	pullHandler = "c8s-pull"
	// pullNeverHandler is the same runtime with runtime.guest_pull =
	// "never": a host that offers the node's layer disks whatever the
	// policy says.
	pullNeverHandler = "c8s-pull-never"
)

// pullRegistry is go-containerregistry's in-memory registry on every
// address of the host (the pods reach it at the CNI bridge's gateway),
// with a switch that flips one byte of one blob as it is served.
type pullRegistry struct {
	port   int
	reg    http.Handler           // the in-memory registry, which authRegistry fronts too
	tamper atomic.Pointer[string] // the blob path to flip, or nil
	served atomic.Int64           // blobs served flipped
}

func startPullRegistry(t *testing.T) *pullRegistry {
	t.Helper()
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r := &pullRegistry{reg: reg}
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	r.port = l.Addr().(*net.TCPAddr).Port
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if p := r.tamper.Load(); p != nil && req.Method == http.MethodGet && req.URL.Path == *p {
			rec := &captureWriter{header: http.Header{}}
			reg.ServeHTTP(rec, req)
			if len(rec.body) > 0 {
				rec.body[len(rec.body)/2] ^= 0x01
				r.served.Add(1)
			}
			for k, v := range rec.header {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.status)
			w.Write(rec.body)
			return
		}
		reg.ServeHTTP(w, req)
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return r
}

// captureWriter holds a response for the tampering proxy.
type captureWriter struct {
	header http.Header
	status int
	body   []byte
}

func (c *captureWriter) Header() http.Header { return c.header }
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	c.body = append(c.body, b...)
	return len(b), nil
}
func (c *captureWriter) WriteHeader(s int) { c.status = s }

// setupPullCRI is a CRI containerd with the CNI bridge network and the
// pullHandler runtime, which passes the io.c8s.* pod annotations (the
// pods' init data) to the shim, with a c8s config and state dir of its
// own (as the sim TEE, runtime.allow_host_rootfs not set). e.stateDir is
// that state dir, so that assertNothingLeft looks at its pod VMs. The
// pullNeverHandler runtime shares it, with runtime.guest_pull = "never".
func setupPullCRI(t *testing.T, extraHypervisor string) *env {
	t.Helper()
	cniBin, cniConf := bridgeNetwork(t, pullBridge, pullSubnet, pullGateway)
	root, err := containerdtest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	imageDir := filepath.Join(root, "_output", "image")
	dir, err := os.MkdirTemp("", "c8s-pull-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	state := filepath.Join(dir, "c8s")
	config := filepath.Join(dir, "c8s.toml")
	doc := fmt.Sprintf("[hypervisor]\nkernel = %q\ninitrd = %q\n%s[runtime]\nstate_dir = %q\n",
		filepath.Join(imageDir, "vmlinuz"), filepath.Join(imageDir, "initrd.img"), extraHypervisor, state)
	if err := os.WriteFile(config, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	never := filepath.Join(dir, "c8s-never.toml")
	if err := os.WriteFile(never, []byte(doc+"guest_pull = \"never\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	e := setupCRIWith(t, fmt.Sprintf(`
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = [%q]
  conf_dir = %q
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s]
  runtime_type = 'io.containerd.c8s.v2'
  pod_annotations = ['io.c8s.*']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s.options]
    ConfigPath = %q
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s]
  runtime_type = 'io.containerd.c8s.v2'
  pod_annotations = ['io.c8s.*']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%s.options]
    ConfigPath = %q
`, cniBin, cniConf, pullHandler, pullHandler, config, pullNeverHandler, pullNeverHandler, never))
	e.stateDir, e.config = state, config
	return e
}

// pushImage writes an image of layers (above the busybox layer), imports
// it into the daemon, pushes it to the registry and returns it and its
// digest reference on the host's side (127.0.0.1).
func (r *pullRegistry) pushImage(t *testing.T, e *env, name string, layers [][]layerimage.Entry) (layerimage.Image, string) {
	t.Helper()
	tarball := filepath.Join(e.d.Dir, name+".tar")
	local := "docker.io/c8s/" + name + ":test"
	img, err := layerimage.WriteFile(tarball, layerimage.Options{Name: local, Cmd: []string{"sleep", "600"}, Layers: layers, ScratchDir: e.d.Dir})
	if err != nil {
		t.Fatal(err)
	}
	e.d.Ctr(t, "images", "import", tarball)
	tag := fmt.Sprintf("127.0.0.1:%d/c8s/%s:test", r.port, name)
	e.d.Ctr(t, "images", "push", "--plain-http", tag, local)
	ref := fmt.Sprintf("127.0.0.1:%d/c8s/%s@%s", r.port, name, img.Manifest)
	e.d.Ctr(t, "images", "pull", "--plain-http", ref)
	return img, ref
}

// guestRef is the reference the guest pulls: the registry at the pod
// network's gateway.
func (r *pullRegistry) guestRef(name string, img layerimage.Image) string {
	return fmt.Sprintf("%s:%d/c8s/%s@%s", pullGateway, r.port, name, img.Manifest)
}

// pullRule is a [policy] rule of CRI container name running repository
// repo's image (as CRI names it, by tag or digest), which the guest pulls
// from pullRef over plain HTTP, with execs.
func pullRule(name, repo, pullRef string, execs ...[]string) string {
	return pullRuleWith(name, repo, pullRef, "pull_plain_http = true\n", execs...)
}

// pullRuleWith is pullRule with the rule's other pull fields (TOML lines)
// in place of pull_plain_http.
func pullRuleWith(name, repo, pullRef, pullFields string, execs ...[]string) string {
	var ex []string
	for _, e := range execs {
		ex = append(ex, tomlStrings(e...))
	}
	return fmt.Sprintf(`
[policy.containers.%s]
image = "re:.*/c8s/%s[:@].*"
args = ["sleep", "600"]
env = [%q, "re:HOSTNAME=.*"]
working_dir = "/"
uid = 0
gid = 0
logs = true
exec = [%s]
pull = %q
%s`, name, repo, imagePath, strings.Join(ex, ", "), pullRef, pullFields)
}

// startRetrying creates and starts a container as the kubelet does (CRI
// creates the container's task at StartContainer): a start that fails
// while the guest reports its pull's progress is removed and retried,
// until ctx ends. It returns the container's id, or the last error, and
// the progress messages seen.
func startRetrying(ctx context.Context, p *criPod, cfg *cri.ContainerConfig) (string, []string, error) {
	var progress []string
	for {
		resp, err := p.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: p.id, Config: cfg, SandboxConfig: p.cfg})
		if err != nil {
			return "", progress, err
		}
		_, err = p.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: resp.ContainerId})
		if err == nil {
			return resp.ContainerId, progress, nil
		}
		p.rt.RemoveContainer(context.WithoutCancel(ctx), &cri.RemoveContainerRequest{ContainerId: resp.ContainerId})
		if !strings.Contains(err.Error(), "pulling ") || ctx.Err() != nil {
			return "", progress, err
		}
		progress = append(progress, err.Error())
		time.Sleep(2 * time.Second)
	}
}

// TestGuestPull runs, in one sim pod with an enforced policy and a CNI
// network, a container of a three-layer digest-pinned image that the node
// offers no disks for (its rule names only the pull reference): the guest
// pulls it from the registry over the pod network, checks each digest and
// runs it (the files of each layer, the whiteout applied, the root an
// overlay over the pulled image). A second image, one of whose layer
// blobs the network flips a byte of, is refused naming that blob, and
// once the network serves it intact the next create pulls it and runs.
// Its subtests pull from an HTTPS registry that requires credentials
// (guestpullauth_test.go): with the key broker's, verified against the
// rule's pull_ca, leaving no trace of them on the host; with credentials
// the owner's resource policy keeps from the pod, refused naming the
// resource; without pull_ca, refused at the TLS handshake.
func TestGuestPull(t *testing.T) {
	var hv string
	if pullBenchMiB > 0 {
		// The bench's image is kept in guest memory.
		hv = fmt.Sprintf("default_memory = %d\n", 768+2*pullBenchMiB)
	}
	e := setupPullCRI(t, hv)
	reg := startPullRegistry(t)
	good, goodRef := reg.pushImage(t, e, "pull", [][]layerimage.Entry{
		{{Name: "etc/c8s", Dir: true}, {Name: "etc/c8s/two", Data: []byte("layer two\n")}, {Name: "etc/c8s/gone", Data: []byte("deleted above\n")}},
		{{Name: "etc/c8s/gone", Whiteout: true}, {Name: "etc/c8s/three", Data: []byte("layer three\n")}},
	})
	bad, badRef := reg.pushImage(t, e, "pullbad", [][]layerimage.Entry{
		{{Name: "etc/c8s", Dir: true}, {Name: "etc/c8s/blob", Random: 256 << 10}, {Name: "etc/c8s/two", Data: []byte("the other image\n")}},
	})
	goodHex := strings.TrimPrefix(good.Manifest.String(), "sha256:")
	script := "cat /etc/c8s/two /etc/c8s/three; test -e /etc/c8s/gone && echo gone-is-visible; grep ' / overlay ' /proc/self/mounts | grep -c " + goodHex
	badCheck := "cat /etc/c8s/two"
	// An image on a registry that requires credentials, over HTTPS with
	// a certificate of the registry's own CA, which the rules name
	// (pull_ca); the credentials are the key broker's (pull_auth).
	areg := startAuthRegistry(t, reg)
	authImg, authRef := reg.pushImage(t, e, "pullauth", [][]layerimage.Entry{
		{{Name: "etc/c8s", Dir: true}, {Name: "etc/c8s/auth", Data: []byte("pulled with the broker's credentials\n")}},
	})
	if st := areg.anonymousStatus(t, "c8s/pullauth", authImg.Manifest.String()); st != http.StatusUnauthorized {
		t.Fatalf("the authenticating registry answers an anonymous request %d, want 401", st)
	}
	authGuestRef := fmt.Sprintf("%s:%d/c8s/pullauth@%s", pullGateway, areg.port, authImg.Manifest)
	authFields := func(resource string, ca bool) string {
		f := fmt.Sprintf("pull_auth = %q\n", "kbs:///"+resource)
		if ca {
			f += fmt.Sprintf("pull_ca = '''\n%s'''\n", areg.caPEM)
		}
		return f
	}
	authCheck := "cat /etc/c8s/auth"
	var doc string
	b := startBroker(t, e.stateDir, e.imageDir, func(b *broker, kb *kbs.Broker) {
		doc = withKBS(pullSandboxRule()+
			pullRule("app", "pull", reg.guestRef("pull", good), []string{"sh", "-c", script})+
			pullRule("other", "pullbad", reg.guestRef("pullbad", bad), []string{"sh", "-c", badCheck})+
			// The broker's credentials, the registry's CA.
			pullRuleWith("auth", "pullauth", authGuestRef, authFields(pullCredsResource, true), []string{"sh", "-c", authCheck})+
			// The same image with credentials the broker keeps from
			// this pod.
			pullRuleWith("denied", "pullauth", authGuestRef, authFields(otherCredsResource, true))+
			// The pod's credentials, but no pull_ca: the guest image's
			// public bundle, which did not sign the registry's
			// certificate.
			pullRuleWith("noca", "pullauth", authGuestRef, authFields(pullCredsResource, false)),
			pullKBSSection(b))
		kb.Resources = kbs.Map{pullCredsResource: areg.creds(), otherCredsResource: []byte(`{"username": "other", "password": "other-team-registry-password"}`)}
		kb.InitData = [][]byte{[]byte(doc)}
		kb.ResourcePolicy = pullResourcePolicy(t, doc)
	})
	if _, err := initdata.Parse([]byte(doc)); err != nil {
		t.Fatalf("init data: %v\n%s", err, doc)
	}
	// The network flips a byte of the second image's layer blob from the
	// start: the guest starts both pulls as soon as the pod network is up.
	tampered := bad.Layers[len(bad.Layers)-1].Blob
	path := fmt.Sprintf("/v2/c8s/pullbad/blobs/%s", tampered)
	reg.tamper.Store(&path)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	p := runPullPod(ctx, t, e, "pullpod", doc)
	ctrCfg := pullCtrConfig
	execIn := func(id string, argv ...string) string {
		t.Helper()
		res, err := p.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: argv, Timeout: 60})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %v in %s: %v, %+v", argv, id, err, res)
		}
		return string(res.Stdout)
	}

	// The good image: pulled in the guest, verified, run.
	t0 := time.Now()
	app, progress, err := startRetrying(ctx, p, ctrCfg("app", goodRef))
	if err != nil {
		t.Fatalf("app: %v\ncontainerd log:\n%s", err, e.d.Log())
	}
	t.Logf("app started in %s after %d progress reports %q", time.Since(t0).Round(time.Millisecond), len(progress), progress)
	if out := execIn(app, "sh", "-c", script); out != "layer two\nlayer three\n1\n" {
		t.Fatalf("app: %q, want the files of each layer, the whiteout applied, and the root over the pulled image %s", out, goodHex)
	}
	// No layer disk was built for the pulled image on the node.
	if ls, _ := filepath.Glob(filepath.Join(e.stateDir, "cache", "layers", good.Layers[len(good.Layers)-1].DiffID.Encoded()+"*")); len(ls) != 0 {
		t.Errorf("the node converted a layer of the guest-pulled image: %v", ls)
	}

	// The tampered image: refused, naming the blob.
	_, _, err = startRetrying(ctx, p, ctrCfg("other", badRef))
	if err == nil || !strings.Contains(err.Error(), tampered.String()) {
		t.Fatalf("the image whose blob %s the network changed: %v, want an error naming the blob", tampered, err)
	}
	if reg.served.Load() == 0 {
		t.Fatal("the tampered blob was never served")
	}
	t.Logf("tampered blob refused: %v", err)

	// Served intact, the next create pulls again and runs: nothing of the
	// refused pull is in the way.
	reg.tamper.Store(nil)
	other, _, err := startRetrying(ctx, p, ctrCfg("other", badRef))
	if err != nil {
		t.Fatalf("other, blob intact: %v", err)
	}
	if out := execIn(other, "sh", "-c", badCheck); out != "the other image\n" {
		t.Fatalf("other: %q", out)
	}

	// The registry that requires credentials: pulled with the broker's,
	// over TLS verified against the rule's CA.
	var authID string
	t.Run("CredentialsFromTheBroker", func(t *testing.T) {
		id, _, err := startRetrying(ctx, p, ctrCfg("auth", authRef))
		if err != nil {
			t.Fatalf("auth: %v\nbroker:\n%s", err, b.Log())
		}
		if out := execIn(id, "sh", "-c", authCheck); out != "pulled with the broker's credentials\n" {
			t.Fatalf("auth: %q", out)
		}
		if areg.tokens.Load() == 0 || areg.bearers.Load() == 0 {
			t.Fatalf("the registry issued %d tokens and served %d requests with one: the pull did not authenticate", areg.tokens.Load(), areg.bearers.Load())
		}
		if !strings.Contains(b.Log(), "released "+pullCredsResource) {
			t.Fatalf("the broker did not log the credentials' release:\n%s", b.Log())
		}
		t.Logf("pulled with the broker's credentials: %d tokens, %d authenticated requests", areg.tokens.Load(), areg.bearers.Load())
		// While the pod runs: neither the password nor the token the
		// registry gave for it is anywhere on the host.
		assertNotOnHost(t, e, pullCredsResource, areg.password, areg.token)
		authID = id
	})

	// Credentials the owner's resource policy keeps from this pod: the
	// pull fails, naming the resource, and the registry got nothing.
	t.Run("CredentialsTheBrokerRefuses", func(t *testing.T) {
		refused := areg.refused.Load()
		_, _, err := startRetrying(ctx, p, ctrCfg("denied", authRef))
		if err == nil || !strings.Contains(err.Error(), otherCredsResource) || !strings.Contains(err.Error(), "key broker") {
			t.Fatalf("denied: %v, want the pull refused naming %s", err, otherCredsResource)
		}
		if !strings.Contains(b.Log(), "refused "+otherCredsResource) {
			t.Fatalf("the broker did not refuse %s:\n%s", otherCredsResource, b.Log())
		}
		if areg.refused.Load() != refused {
			t.Fatal("the registry's token service got credentials for the refused pull")
		}
		t.Logf("refused: %v", err)
	})

	// No pull_ca: the guest verifies the registry against its image's
	// public bundle only, never the host's roots or none, and the pull
	// fails at the TLS handshake.
	t.Run("RegistryCertificateNotInTheTrustedRoots", func(t *testing.T) {
		_, _, err := startRetrying(ctx, p, ctrCfg("noca", authRef))
		if err == nil || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("noca: %v, want the registry's certificate refused", err)
		}
		if areg.handshakeErrors.Load() == 0 {
			t.Error("the registry saw no failed TLS handshake")
		}
		t.Logf("refused: %v", err)
	})
	if t.Failed() {
		return
	}
	p.remove(t, app, other, authID)
	t.Run("NoTraceOnTheHostAfterwards", func(t *testing.T) { assertNotOnHost(t, e, "", areg.password, areg.token) })

	// A host that offers its layer disks for a container whose rule
	// binds the image only by its pull reference: refused by the policy,
	// naming the rule, and nothing is left.
	h := runPullPodWith(ctx, t, e, pullNeverHandler, "pullnever", doc)
	_, _, err = startRetrying(ctx, h, ctrCfg("app", goodRef))
	if err == nil || !strings.Contains(err.Error(), "policy.containers.app.pull") || !strings.Contains(err.Error(), "rootfs") {
		t.Fatalf("the node's layer disks under a pull-only rule: %v, want a denial naming policy.containers.app.pull", err)
	}
	t.Logf("host disks under a pull-only rule refused: %v", err)
	h.remove(t)
	if pullBenchMiB > 0 {
		benchGuestPull(t, e, reg)
	}
}

// runPullPod runs a pod of the pull runtime with init data doc, removed
// at cleanup.
func runPullPod(ctx context.Context, t *testing.T, e *env, name, doc string) *criPod {
	return runPullPodWith(ctx, t, e, pullHandler, name, doc)
}

// runPullPodWith is runPullPod with the runtime handler.
func runPullPodWith(ctx context.Context, t *testing.T, e *env, handler, name, doc string) *criPod {
	t.Helper()
	cfg := &cri.PodSandboxConfig{
		Metadata:    &cri.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
		Hostname:    name,
		Annotations: map[string]string{initdata.Annotation: base64.StdEncoding.EncodeToString([]byte(doc))},
	}
	p := &criPod{e: e, ctx: ctx, cfg: cfg}
	p.connect(t)
	resp, err := p.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: handler})
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v\ncontainerd log:\n%s", name, err, e.d.Log())
	}
	p.id = resp.PodSandboxId
	t.Cleanup(func() {
		p.rt.StopPodSandbox(context.Background(), &cri.StopPodSandboxRequest{PodSandboxId: p.id})
		p.rt.RemovePodSandbox(context.Background(), &cri.RemovePodSandboxRequest{PodSandboxId: p.id})
	})
	return p
}

// pullSandboxRule is the [policy] preamble and sandbox rule of the pull
// pods.
func pullSandboxRule() string {
	return fmt.Sprintf(`version = "0.1"

[policy.sandbox]
image = %q
args = %s
env = %s
working_dir = "/"
uid = 0
gid = 0
sysctls = %s
`, pauseImage, tomlStrings(pauseCmd...), tomlStrings(imagePath), tomlStrings(criSandboxSysctls...))
}

// pullCtrConfig is the CRI config of container name of image ref, with
// the runtime's default masked and read-only paths as the kubelet passes
// them.
func pullCtrConfig(name, ref string) *cri.ContainerConfig {
	return &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: ref},
		Command:  []string{"sleep", "600"},
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			MaskedPaths: policyapi.DefaultMaskedPaths, ReadonlyPaths: policyapi.DefaultReadonlyPaths,
			// Its own PID namespace, as the kubelet asks for a pod that does
			// not share its process namespace (CRI's zero value is POD).
			NamespaceOptions: &cri.NamespaceOption{Pid: cri.NamespaceMode_CONTAINER},
		}},
	}
}
