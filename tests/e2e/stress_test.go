package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Network of TestCRIStressForkingPods, apart from the other tests'.
const (
	stressBridge  = "c8se2estr0"
	stressSubnet  = "10.231.8.0/24"
	stressGateway = "10.231.8.1"
)

// TestCRIStressForkingPods runs stressPods CNI-networked pods through CRI,
// stressParallel at a time, each with a container whose main process
// forks, and stops each container with a one-second timeout, as the
// kubelet does when it tears pods down in bulk. Every stop and removal
// completes (no hang), and afterwards nothing is left: no QEMU, shim, VM
// state, mount, network namespace, veth or pod IP.
func TestCRIStressForkingPods(t *testing.T) {
	const (
		stressPods     = 50
		stressParallel = 10
		// A hang (the bug this guards against) never ends; a slow step
		// does. Ten TCG VMs booting at once on two cores take 45-90 s
		// to answer when the machine has other work (measured: agent
		// ready after 43-86 s, QEMU's own start up to 37 s, at load
		// 17), which is what failed the first wave at 90 s in CI.
		stepLimit = 3 * time.Minute
	)
	e, ipam := setupCRIWithCNI(t, stressBridge, stressSubnet, stressGateway)
	netnsBefore := listDir("/var/run/netns")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()

	var (
		mu       sync.Mutex
		failures []string
		slowest  time.Duration
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, args...))
	}
	step := func(name string, f func(context.Context) error) bool {
		c, cancel := context.WithTimeout(ctx, stepLimit)
		defer cancel()
		t0 := time.Now()
		err := f(c)
		took := time.Since(t0)
		mu.Lock()
		slowest = max(slowest, took)
		mu.Unlock()
		if err != nil {
			fail("%s after %s: %v", name, took.Round(time.Millisecond), err)
			return false
		}
		return true
	}

	rt := criClient(t, e)
	start := time.Now()
	work := make(chan int)
	var wg sync.WaitGroup
	for range stressParallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				name := fmt.Sprintf("stress-%02d", i)
				cfg := &cri.PodSandboxConfig{
					Metadata: &cri.PodSandboxMetadata{Name: name, Namespace: "default", Uid: "uid-" + name},
					Hostname: name,
				}
				var pod, ctr string
				if !step(name+": RunPodSandbox", func(c context.Context) error {
					r, err := rt.RunPodSandbox(c, &cri.RunPodSandboxRequest{Config: cfg, RuntimeHandler: "c8s"})
					if err == nil {
						pod = r.PodSandboxId
					}
					return err
				}) {
					continue
				}
				ok := step(name+": create and start", func(c context.Context) error {
					r, err := rt.CreateContainer(c, &cri.CreateContainerRequest{PodSandboxId: pod, SandboxConfig: cfg,
						Config: shellContainer("app", cri.NamespaceMode_POD, "sleep 1000 & sleep 1000")})
					if err != nil {
						return err
					}
					ctr = r.ContainerId
					_, err = rt.StartContainer(c, &cri.StartContainerRequest{ContainerId: ctr})
					return err
				})
				if ok {
					step(name+": StopContainer --timeout 1", func(c context.Context) error {
						_, err := rt.StopContainer(c, &cri.StopContainerRequest{ContainerId: ctr, Timeout: 1})
						return err
					})
					step(name+": RemoveContainer", func(c context.Context) error {
						_, err := rt.RemoveContainer(c, &cri.RemoveContainerRequest{ContainerId: ctr})
						return err
					})
				}
				step(name+": StopPodSandbox", func(c context.Context) error {
					_, err := rt.StopPodSandbox(c, &cri.StopPodSandboxRequest{PodSandboxId: pod})
					return err
				})
				step(name+": RemovePodSandbox", func(c context.Context) error {
					_, err := rt.RemovePodSandbox(c, &cri.RemovePodSandboxRequest{PodSandboxId: pod})
					return err
				})
			}
		}()
	}
	for i := range stressPods {
		work <- i
	}
	close(work)
	wg.Wait()
	t.Logf("%d pods, %d at a time: %s in all; slowest CRI step %s", stressPods, stressParallel,
		time.Since(start).Round(time.Second), slowest.Round(time.Millisecond))
	for _, f := range failures {
		t.Error(f)
	}
	if len(failures) > 0 {
		t.Logf("containerd log:\n%s", e.d.Log())
	}

	e.assertNothingLeft(t)
	if left := slices.DeleteFunc(listDir("/var/run/netns"), func(n string) bool { return slices.Contains(netnsBefore, n) }); len(left) > 0 {
		t.Errorf("network namespaces left: %v", left)
	}
	if out, _ := exec.Command("ip", "-o", "link", "show", "master", stressBridge).Output(); len(strings.TrimSpace(string(out))) > 0 {
		t.Errorf("veths left on %s:\n%s", stressBridge, out)
	}
	entries, _ := os.ReadDir(filepath.Join(ipam, "c8s-e2e-"+stressBridge))
	for _, en := range entries {
		if net.ParseIP(en.Name()) != nil {
			t.Errorf("pod IP %s still allocated", en.Name())
		}
	}
}

// criClient connects to e's CRI runtime service.
func criClient(t *testing.T, e *env) cri.RuntimeServiceClient {
	t.Helper()
	p := &criPod{e: e}
	p.connect(t)
	return p.rt
}

// listDir lists the names in dir (none if it does not exist).
func listDir(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, en := range entries {
		names = append(names, en.Name())
	}
	return names
}
