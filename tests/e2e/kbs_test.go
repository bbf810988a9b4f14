package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/launcher/attest"
	kbs "github.com/c8s-dev/c8s/launcher/broker"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
)

// kbsSecret is the value the broker holds; it must reach the container
// and appear nowhere on the host.
const kbsSecret = "e2e-db-password-5d41402abc4b2a76"

// otherTeamSecret is another workload's resource on the same broker: no
// kbs pod may get it.
const otherTeamSecret = "e2e-other-team-token-7c6a180b36896a0a"

// broker is an in-process key broker over TLS on 127.0.0.1, with a log of
// its decisions.
type broker struct {
	addr    string
	certPEM []byte
	mu      sync.Mutex
	log     bytes.Buffer
}

// Write collects the broker's log lines.
func (b *broker) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.log.Write(p)
}

func (b *broker) Log() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.log.String()
}

// startBroker serves default/key/db-password to pods whose sim evidence
// (from the sim TEE of the node state dir stateDir) shows the launch
// digest for one vCPU of the image manifest in imageDir: the owner's
// reference values, read as c8s-launcher kbs --reference-values reads
// them (the test plays the owner, who holds the image's manifest).
// configure sets what the owner pins (kbs.Broker's InitData; the broker
// refuses every pod without) and may add a resource policy, given the
// broker's address and certificate, which the pods' init data names,
// before it serves.
func startBroker(t *testing.T, stateDir, imageDir string, configure func(b *broker, kb *kbs.Broker)) *broker {
	t.Helper()
	spDir := statedir.SimSP(stateDir)
	if _, err := sim.Open(spDir); err != nil {
		t.Fatal(err)
	}
	trust, err := attest.SimTrust(spDir)
	if err != nil {
		t.Fatal(err)
	}
	v, err := attest.NewVerifier(trust)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := kbs.LoadReferenceValues(filepath.Join(imageDir, manifest.FileName), "sim", nil)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := kbs.SelfSigned([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	b := &broker{addr: l.Addr().String(), certPEM: certPEM}
	logger := logrus.New()
	logger.SetOutput(b)
	logCtx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
	kb := &kbs.Broker{
		Verifier:   v,
		Policy:     attest.Policy{VCPUs: 1},
		References: []kbs.Reference{ref},
		Resources:  kbs.Map{"default/key/db-password": []byte(kbsSecret), "default/key/other-team-token": []byte(otherTeamSecret)},
	}
	configure(b, kb)
	srv := &http.Server{Handler: kb, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return logCtx }}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return b
}

// The kbs pods run with ctr, one container each: its process, as ctr
// writes it from the image, and what its [policy] rule pins.
var (
	kbsReadArgs  = []string{"sh", "-c", "cat /run/secrets/db-password; echo; if (echo x > /run/secrets/db-password) 2>/dev/null; then echo writable; fi; grep ' /run/secrets/db-password ' /proc/mounts"}
	kbsCatArgs   = []string{"cat", "/run/secrets/db-password"}
	kbsSleepArgs = []string{"sleep", "600"}
)

// kbsImage is the image annotation the kbs pods are run with: ctr writes
// no CRI annotations, so it is passed as CRI passes it, and the [policy]
// checks it (a container without CRI annotations is matched by its id).
var kbsImage = policy.AnnotationImageName + "=" + image

// kbsPolicy is the [policy] of the kbs pods: a rule per container id that
// may run (ctr run IMAGE ID ARGS...), pinning what ctr writes (the
// image's PATH, its working directory "/", root, a tmpfs on /run) and the
// test image's layer, with the broker's secret and its output for the
// test to read. Without an enforced [policy] the broker releases nothing:
// the host could create a container of its own, which would get the
// secret; without the layer the host would supply the root file system,
// and its own /bin/sh would run under the rule's argv.
func kbsPolicy(entry string) string {
	rule := func(id string, args []string) string {
		return fmt.Sprintf(`
[policy.containers.%s]
image = %q
args = %s
env = %s
working_dir = "/"
uid = 0
gid = 0
logs = true
mounts = [{ destination = "/run", kind = "tmpfs" }]
secrets = [{ resource = %q }]
%s`, id, image, tomlStrings(args...), tomlStrings(imagePath), entry, testImageLayers())
	}
	return "\n[policy]\n" + rule("kbs1", kbsReadArgs) + rule("kbs2", kbsCatArgs) + rule("kbs4", kbsSleepArgs) + rule("kbs5", kbsCatArgs) + rule("kbs7", kbsCatArgs)
}

// podInitDoc asks for the secret from the broker that certPEM pins, under
// kbsPolicy; extra names more [[kbs.secrets]] entries.
func podInitDoc(addr string, certPEM []byte, extra ...string) []byte {
	var more string
	for _, r := range extra {
		more += fmt.Sprintf("\n[[kbs.secrets]]\nresource = %q\npath = \"/run/secrets/%s\"\n", "kbs:///"+r, filepath.Base(r))
	}
	doc := fmt.Sprintf(`version = "0.1"

[kbs]
url = "https://%s"
cert = '''
%s'''

[[kbs.secrets]]
resource = "kbs:///default/key/db-password"
path = "/run/secrets/db-password"
%s%s`, addr, certPEM, more, kbsPolicy("kbs:///default/key/db-password"))
	if _, err := initdata.Parse([]byte(doc)); err != nil {
		panic(err)
	}
	return []byte(doc)
}

// podInitData is podInitDoc for the pod annotation (base64).
func podInitData(addr string, certPEM []byte) string {
	return base64.StdEncoding.EncodeToString(podInitDoc(addr, certPEM))
}

// podCoCoInitDoc is podInitDoc in CoCo's init data format, as Trustee
// reads it: sha384 over the whole document (its first 32 bytes are
// HOST_DATA), c8s's settings in data."c8s.toml", the broker in CoCo's own
// cdh.toml.
func podCoCoInitDoc(addr string, certPEM []byte) []byte {
	doc := fmt.Sprintf(`version = "0.1.0"
algorithm = "sha384"

[data]
"c8s.toml" = '''
[[kbs.secrets]]
resource = "kbs:///default/key/db-password"
path = "/run/secrets/db-password"
%s'''

"cdh.toml" = '''
[kbc]
name = "cc_kbc"
url = "https://%s"
kbs_cert = """
%s"""
'''
`, kbsPolicy("kbs:///default/key/db-password"), addr, certPEM)
	if d, err := initdata.Parse([]byte(doc)); err != nil || d.Format != initdata.FormatCoCo {
		panic(fmt.Sprint(d, err))
	}
	return []byte(doc)
}

// noPolicyInitDoc is init data without a [policy]: exec refused
// (allow_exec = false), but CreateContainer unrestricted, so the host
// could create a container of its own, which gets the pod's secrets, and
// read its output. The broker must refuse it.
func noPolicyInitDoc(addr string, certPEM []byte) []byte {
	doc := fmt.Sprintf(`version = "0.1"

[agent_policy]
allow_exec = false

[kbs]
url = "https://%s"
cert = '''
%s'''

[[kbs.secrets]]
resource = "kbs:///default/key/db-password"
path = "/run/secrets/db-password"
`, addr, certPEM)
	if _, err := initdata.Parse([]byte(doc)); err != nil {
		panic(err)
	}
	return []byte(doc)
}

// pinPods pins the kbs pods' init data (both formats, the document
// without a [policy], which the broker then refuses for that, not for
// being unpinned, and one that also asks for another team's resource):
// the owner's broker knows its pods' documents.
func pinPods(b *broker, kb *kbs.Broker) {
	kb.InitData = [][]byte{podInitDoc(b.addr, b.certPEM), podCoCoInitDoc(b.addr, b.certPEM), noPolicyInitDoc(b.addr, b.certPEM), greedyInitDoc(b), hostRootfsInitDoc(b)}
}

// hostRootfsInitDoc is podInitDoc whose rules pin no layers: enforced,
// but the host supplies the containers' root file systems, so its own
// /bin/sh would run under the owner's argv. Pinned, so that the broker
// refuses it for that.
func hostRootfsInitDoc(b *broker) []byte {
	doc := strings.ReplaceAll(string(podInitDoc(b.addr, b.certPEM)), testImageLayers(), "")
	if d, err := initdata.Parse([]byte(doc)); err != nil || len(d.HostRootfsRules()) == 0 {
		panic(fmt.Sprint(d, err))
	}
	return []byte(doc)
}

// greedyInitDoc is a kbs pod's init data that also names another team's
// resource: pinned, so it attests, but the owner's resource policy gives
// that resource to another workload.
func greedyInitDoc(b *broker) []byte {
	return podInitDoc(b.addr, b.certPEM, "default/key/other-team-token")
}

// ownerResourcePolicy is the owner's resource policy over the kbs pods
// (c8s-launcher kbs --resource-policy reads the same TOML): db-password
// goes to the kbs pods' documents on the image's launch measurement,
// other-team-token to another team's document only.
func ownerResourcePolicy(t *testing.T, b *broker, kb *kbs.Broker) *kbs.ResourcePolicy {
	t.Helper()
	hexDigest := func(doc []byte) string { d := initdata.Digest(doc); return fmt.Sprintf("%x", d[:]) }
	kbsPods := []string{hexDigest(podInitDoc(b.addr, b.certPEM)), hexDigest(podCoCoInitDoc(b.addr, b.certPEM)),
		hexDigest(noPolicyInitDoc(b.addr, b.certPEM)), hexDigest(greedyInitDoc(b))}
	otherTeam := hexDigest([]byte("version = \"0.1\"\n# the other team's pod\n"))
	p, err := kbs.ParseResourcePolicy([]byte(fmt.Sprintf(`
[workloads.kbs-pods]
tee = ["sim"]
init_data = %s
measurements = [%q]

[workloads.other-team]
tee = ["sim"]
init_data = [%q]

[[resources]]
name = "db-password"
path = "default/key/db-password"
workloads = ["kbs-pods"]

[[resources]]
name = "other-team-token"
path = "default/key/other-team-token"
workloads = ["other-team"]
`, tomlStrings(kbsPods...), kb.References[0].Measurements[1], otherTeam)), false, "")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKBSSecrets: a pod gets its secret from the key broker only when
// its evidence verifies, sees it read-only at the path its init data
// chose, and the value never appears on the host.
func TestKBSSecrets(t *testing.T) {
	e := setup(t)
	b := startBroker(t, e.stateDir, e.imageDir, func(b *broker, kb *kbs.Broker) {
		pinPods(b, kb)
		kb.ResourcePolicy = ownerResourcePolicy(t, b, kb)
	})
	good := podInitData(b.addr, b.certPEM)

	t.Run("SecretReachesTheAttestedPod", func(t *testing.T) {
		stdout, stderr, code := result(t, e.run(ctx(t), e.config, append([]string{"--rm", "--annotation", kbsImage, "--annotation", initdata.Annotation + "=" + good, image, "kbs1"}, kbsReadArgs...)...))
		lines := strings.Split(strings.TrimSpace(stdout), "\n")
		if code != 0 || len(lines) != 2 || lines[0] != kbsSecret {
			t.Fatalf("exit %d, stdout %q: want the secret, then its mount\nstderr: %s\nbroker:\n%s\ncontainerd log:\n%s", code, stdout, stderr, b.Log(), e.d.Log())
		}
		if f := strings.Fields(lines[1]); len(f) < 4 || f[2] != "tmpfs" || !strings.HasPrefix(f[3], "ro,") {
			t.Fatalf("the secret's mount is %q: want a read-only tmpfs", lines[1])
		}
		if !strings.Contains(b.Log(), "released default/key/db-password") {
			t.Fatalf("the broker did not log the release:\n%s", b.Log())
		}
		e.assertNothingLeft(t)
	})

	t.Run("CoCoInitData", func(t *testing.T) {
		coco := base64.StdEncoding.EncodeToString(podCoCoInitDoc(b.addr, b.certPEM))
		stdout, stderr, code := result(t, e.run(ctx(t), e.config, append([]string{"--rm", "--annotation", kbsImage, "--annotation", initdata.Annotation + "=" + coco, image, "kbs5"}, kbsCatArgs...)...))
		if code != 0 || strings.TrimSpace(stdout) != kbsSecret {
			t.Fatalf("exit %d, stdout %q: want the secret\nstderr: %s\nbroker:\n%s", code, stdout, stderr, b.Log())
		}
		e.assertNothingLeft(t)
	})

	t.Run("AnotherWorkloadsResourceRefused", func(t *testing.T) {
		// The pod's init data also names another team's resource: the
		// broker releases the pod's own secret under the owner's resource
		// policy, then refuses the other (403, naming the rule and the
		// init data digest that is not the other team's), and the pod
		// does not start.
		before := strings.Count(b.Log(), "kbs: released")
		greedy := base64.StdEncoding.EncodeToString(greedyInitDoc(b))
		stdout, stderr, code := result(t, e.run(ctx(t), e.config, append([]string{"--rm", "--annotation", kbsImage, "--annotation", initdata.Annotation + "=" + greedy, image, "kbs7"}, kbsCatArgs...)...))
		if code == 0 || strings.Contains(stdout, kbsSecret) || strings.Contains(stdout+stderr, otherTeamSecret) {
			t.Fatalf("a pod asking for another workload's resource started (exit %d, stdout %q)", code, stdout)
		}
		digest := initdata.Digest(greedyInitDoc(b))
		for _, want := range []string{"key broker", "403", "resource default/key/other-team-token refused", fmt.Sprintf("init data digest %x", digest[:]), `not in resource policy rule "other-team-token"`} {
			if !strings.Contains(stderr, want) {
				t.Errorf("ctr's error does not say %q:\n%s", want, stderr)
			}
		}
		logs := b.Log()
		if strings.Count(logs, "kbs: released default/key/db-password") != before+1 || strings.Contains(logs, "released default/key/other-team-token") {
			t.Fatalf("want the pod's own secret released once more and the other team's never:\n%s", logs)
		}
		if !strings.Contains(logs, "kbs: refused default/key/other-team-token") {
			t.Fatalf("the broker's log does not show the refusal:\n%s", logs)
		}
		e.d.CtrCommand(ctx(t), "container", "delete", "kbs7").Run()
		e.assertNothingLeft(t)
	})

	t.Run("NoTraceOnTheHostWhileRunning", func(t *testing.T) {
		c := ctx(t)
		if _, stderr, code := result(t, e.run(c, e.config, append([]string{"-d", "--annotation", kbsImage, "--annotation", initdata.Annotation + "=" + good, image, "kbs4"}, kbsSleepArgs...)...)); code != 0 {
			t.Fatalf("exit %d: %s\nbroker:\n%s", code, stderr, b.Log())
		}
		// The pod's VM state dir (console log, sockets), its container
		// disk, containerd's root and state, the logs.
		assertNoSecretOnHost(t, e)
		e.d.Ctr(t, "task", "kill", "-s", "KILL", "kbs4")
		waitStopped(t, e, "kbs4")
		e.d.Ctr(t, "task", "delete", "kbs4")
		e.d.Ctr(t, "container", "delete", "kbs4")
		e.assertNothingLeft(t)
	})

	t.Run("NoPolicyRefusedByTheBroker", func(t *testing.T) {
		// allow_exec = false alone: the host could still create a
		// container that prints the secret, so the broker refuses the pod
		// though its evidence verifies, and the pod does not start.
		before := strings.Count(b.Log(), "kbs: released")
		noPolicy := base64.StdEncoding.EncodeToString(noPolicyInitDoc(b.addr, b.certPEM))
		stdout, stderr, code := result(t, e.run(ctx(t), e.config, append([]string{"--rm", "--annotation", initdata.Annotation + "=" + noPolicy, image, "kbs6"}, kbsCatArgs...)...))
		if code == 0 || strings.Contains(stdout, kbsSecret) {
			t.Fatalf("a pod without a [policy] started (exit %d, stdout %q)", code, stdout)
		}
		for _, want := range []string{"key broker", "401", "no [policy] section", "add a [policy] section (c8s-measure policy can generate one)"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("ctr's error does not say %q:\n%s", want, stderr)
			}
		}
		if after := strings.Count(b.Log(), "kbs: released"); after != before {
			t.Fatalf("the broker released a secret to a pod without a [policy]:\n%s", b.Log())
		}
		if !strings.Contains(b.Log(), "attestation refused") {
			t.Fatalf("the broker's log does not show the refusal:\n%s", b.Log())
		}
		e.d.CtrCommand(ctx(t), "container", "delete", "kbs6").Run()
		e.assertNothingLeft(t)
	})

	t.Run("HostRootfsRefusedByTheBroker", func(t *testing.T) {
		// An enforced [policy] whose rule pins no layers: the host
		// attaches the root file system, so the broker refuses the pod
		// though its evidence verifies, naming the rule, and the pod does
		// not start.
		before := strings.Count(b.Log(), "kbs: released")
		doc := base64.StdEncoding.EncodeToString(hostRootfsInitDoc(b))
		stdout, stderr, code := result(t, e.run(ctx(t), e.config, append([]string{"--rm", "--annotation", kbsImage, "--annotation", initdata.Annotation + "=" + doc, image, "kbs2"}, kbsCatArgs...)...))
		if code == 0 || strings.Contains(stdout, kbsSecret) {
			t.Fatalf("a pod whose rule pins no layers started (exit %d, stdout %q)", code, stdout)
		}
		for _, want := range []string{"key broker", "401", `"kbs2"`, "do not pin their images' layers", "[[policy.containers.kbs2.layers]]", "the host supplies their root file systems", "allow_host_rootfs"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("ctr's error does not say %q:\n%s", want, stderr)
			}
		}
		if after := strings.Count(b.Log(), "kbs: released"); after != before {
			t.Fatalf("the broker released a secret to a pod whose rule pins no layers:\n%s", b.Log())
		}
		e.d.CtrCommand(ctx(t), "container", "delete", "kbs2").Run()
		e.assertNothingLeft(t)
	})

	t.Run("AlteredInitrdRefusedByTheBroker", func(t *testing.T) {
		before := strings.Count(b.Log(), "released")
		testKBSAlteredInitrd(t, e, good)
		if after := strings.Count(b.Log(), "released"); after != before {
			t.Fatalf("the broker released a secret to the altered pod:\n%s", b.Log())
		}
		if !regexp.MustCompile(`attestation refused" error="measurement mismatch`).MatchString(b.Log()) {
			t.Fatalf("the broker's log does not show the refusal:\n%s", b.Log())
		}
	})

	t.Run("WrongBrokerCertificate", func(t *testing.T) {
		other, _, err := kbs.SelfSigned([]string{"127.0.0.1"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		before := b.Log()
		_, stderr, code := result(t, e.run(ctx(t), e.config, "--rm", "--annotation", kbsImage, "--annotation", initdata.Annotation+"="+podInitData(b.addr, other), image, "kbs3", "true"))
		if code == 0 || !strings.Contains(stderr, "certificate") || !strings.Contains(stderr, "key broker") {
			t.Fatalf("exit %d: want the pod to fail on the broker's certificate:\n%s", code, stderr)
		}
		if b.Log() != before {
			t.Fatalf("the agent reached the broker's protocol despite a wrong certificate:\n%s", b.Log())
		}
		e.d.CtrCommand(ctx(t), "container", "delete", "kbs3").Run()
		e.assertNothingLeft(t)
	})

	t.Run("NoTraceOnTheHostAfterwards", func(t *testing.T) { assertNoSecretOnHost(t, e) })
}

// assertNoSecretOnHost searches every file under the test's node dirs
// (containerd's root and state, c8s's state with the VMs' console logs and
// container disks) and containerd's log, with the shims' logs in it.
func assertNoSecretOnHost(t *testing.T, e *env) {
	t.Helper()
	if strings.Contains(e.d.Log(), kbsSecret) {
		t.Fatal("the secret is in containerd's or the shims' log")
	}
	files, size := 0, int64(0)
	err := filepath.WalkDir(e.d.Dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil
		}
		files++
		size += int64(len(data))
		if bytes.Contains(data, []byte(kbsSecret)) {
			t.Errorf("the secret is in %s", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no files under the node's dirs: the search proved nothing")
	}
	t.Logf("searched %d files (%d MiB) under %s", files, size>>20, e.d.Dir)
}

// testKBSAlteredInitrd boots the pod from an altered initrd on a host that
// also doctored its own manifest, so the host's gate lets it through: the
// broker, which holds the real digests, must refuse it.
func testKBSAlteredInitrd(t *testing.T, e *env, initData string) {
	dir := alteredInitrd(t, e, "kbs-altered")
	config := func(manifestPath string) string {
		return e.writeConfig(t, "kbs-altered.toml", fmt.Sprintf(`
[hypervisor]
kernel = %q
initrd = %q
rootfs = %q
[attestation]
manifest = %q
[runtime]
state_dir = %q
`, filepath.Join(e.imageDir, "vmlinuz"), filepath.Join(dir, "initrd.img"), filepath.Join(e.imageDir, "rootfs.img"), manifestPath, e.stateDir))
	}
	// The real manifest: the host's gate refuses, naming the initrd event
	// of the sim TEE's modelled RTMR2.
	_, stderr, code := result(t, e.run(ctx(t), config(filepath.Join(e.imageDir, manifest.FileName)), "--rm", image, "kbs2", "true"))
	if code == 0 || !strings.Contains(stderr, "Linux initrd) mismatch") {
		t.Fatalf("exit %d: want the host's gate to refuse the altered initrd's RTMR2 event:\n%s", code, stderr)
	}
	e.d.CtrCommand(ctx(t), "container", "delete", "kbs2").Run()
	// The host doctors its manifest: no measured boot, so that its gate
	// names the launch digest, then that digest.
	raw, err := os.ReadFile(filepath.Join(e.imageDir, manifest.FileName))
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	simDigests := doc["digests"].(map[string]any)["sim"].(map[string]any)
	delete(simDigests, "boot")
	doctor := func() {
		doctored, _ := json.Marshal(doc)
		if err := os.WriteFile(filepath.Join(dir, manifest.FileName), doctored, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	doctor()
	_, stderr, code = result(t, e.run(ctx(t), config(filepath.Join(dir, manifest.FileName)), "--rm", image, "kbs2", "true"))
	got := regexp.MustCompile(`measurement mismatch: expected [0-9a-f]+, got ([0-9a-f]{96})`).FindStringSubmatch(stderr)
	if code == 0 || got == nil {
		t.Fatalf("exit %d: want the host's gate to refuse the altered initrd and name its digest:\n%s", code, stderr)
	}
	e.d.CtrCommand(ctx(t), "container", "delete", "kbs2").Run()
	// A doctored manifest that expects the altered digest.
	simDigests["by_vcpus"].(map[string]any)["1"] = got[1]
	doctor()
	c, cancel := context.WithTimeout(ctx(t), 5*time.Minute)
	defer cancel()
	stdout, stderr, code := result(t, e.run(c, config(filepath.Join(dir, manifest.FileName)), append([]string{"--rm", "--annotation", kbsImage, "--annotation", initdata.Annotation + "=" + initData, image, "kbs2"}, kbsCatArgs...)...))
	if code == 0 || strings.Contains(stdout, kbsSecret) {
		t.Fatalf("a pod booted from an altered initrd started (exit %d, stdout %q)", code, stdout)
	}
	for _, want := range []string{"key broker", "401", "measurement mismatch"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("ctr's error does not say %q:\n%s", want, stderr)
		}
	}
	e.d.CtrCommand(ctx(t), "container", "delete", "kbs2").Run()
	e.assertNothingLeft(t)
}

// alteredInitrd writes the image's initrd with trailing zeros to
// e.d.Dir/name/initrd.img and returns that dir: the kernel ignores the
// zeros, the measurement does not.
func alteredInitrd(t *testing.T, e *env, name string) string {
	t.Helper()
	dir := filepath.Join(e.d.Dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	initrd, err := os.ReadFile(filepath.Join(e.imageDir, "initrd.img"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "initrd.img"), append(initrd, make([]byte, 4096)...), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
