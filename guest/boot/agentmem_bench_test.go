package boot_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/internal/newc"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// BenchmarkAgentMemory measures the memory of c8s-agent binaries while
// they serve a pod, for `make bench` (hack/bench-policy.sh): each agent is
// booted as /init of the guest image (appended to its initramfs, as
// TestAgentInVM does) under QEMU TCG, 1 vCPU and 512 MiB like a pod VM,
// with the sim TEE's attestation port served here, and driven through the
// same requests:
//
//	SetInitData   the pod's init data, whose digest is the HOST_DATA the
//	              sim reports: with a [policy] section governing both
//	              containers, or without one
//	app           CreateContainer, StartContainer (sleep, 20 env entries,
//	              2 tmpfs mounts), an exec of cat with its output read
//	rss           a container in the VM's pid namespace (allowed by the
//	              policy's vm_namespaces) that reads /proc/1/status
//
// It reports PID 1's VmRSS and VmHWM (peak) at that point, their RssAnon,
// RssFile and RssShmem parts, in KiB, and the binary's size in bytes. The
// kernel command line names no TEE (c8s.tee), so that the agents run the
// same code paths apart from the policy (writable layers on the disk, as
// the host asks); the sim evidence still binds the init data.
//
// The agents are static binaries named by C8S_BENCH_AGENT_BEFORE
// (sub-benchmark "before": init data without [policy], which an agent
// that predates it refuses) and C8S_BENCH_AGENT_AFTER ("after": with it;
// "after-nopolicy": the same binary with before's document, to tell the
// larger binary from the policy in force). It skips without them.
// C8S_IMAGE_DIR overrides the image (default _output/image). Run it with
// -benchtime 1x: each iteration boots a VM (about 8 s here).
func BenchmarkAgentMemory(b *testing.B) {
	before, after := os.Getenv("C8S_BENCH_AGENT_BEFORE"), os.Getenv("C8S_BENCH_AGENT_AFTER")
	if after == "" {
		b.Skip("set C8S_BENCH_AGENT_AFTER (and C8S_BENCH_AGENT_BEFORE) to agent binaries to boot (hack/bench-policy.sh does)")
	}
	imgDir := os.Getenv("C8S_IMAGE_DIR")
	if imgDir == "" {
		imgDir = filepath.Join("..", "..", "_output", "image")
	}
	imgDir, err := filepath.Abs(imgDir)
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	// The image's kernel and its whole root tree, copied once, so that an
	// image rebuilt meanwhile changes neither run.
	kernel := filepath.Join(dir, "vmlinuz")
	base := filepath.Join(imgDir, "initrd-plain.img")
	benchSh(b, dir, fmt.Sprintf("cp %s %s && zstd -q -dc %s > base.cpio", filepath.Join(imgDir, "vmlinuz"), kernel, base))
	benchSh(b, dir, `mkdir -p rootfs/bin rootfs/proc rootfs/dev rootfs/sys rootfs/etc rootfs/tmp rootfs/cache
cp /bin/busybox rootfs/bin/busybox
for a in sh cat sleep grep; do ln -s busybox rootfs/bin/$a; done
echo image > rootfs/etc/hosts
mkfs.ext4 -q -F -d rootfs disk.ext4 32M`)
	sp, err := sim.Open(filepath.Join(dir, "sp"))
	if err != nil {
		b.Fatal(err)
	}
	for _, a := range []struct {
		name, path string
		policy     bool
	}{{"before", before, false}, {"after-nopolicy", after, false}, {"after", after, true}} {
		if a.path == "" {
			continue
		}
		b.Run(a.name, func(b *testing.B) {
			var m agentMemory
			for b.Loop() {
				m = measureAgent(b, dir, kernel, a.path, sp, a.policy)
			}
			b.ReportMetric(float64(m.size), "bytes")
			b.ReportMetric(float64(m.rss), "VmRSS-KiB")
			b.ReportMetric(float64(m.hwm), "VmHWM-KiB")
			b.ReportMetric(float64(m.anon), "RssAnon-KiB")
			b.ReportMetric(float64(m.file), "RssFile-KiB")
			b.ReportMetric(float64(m.shmem), "RssShmem-KiB")
		})
	}
}

// agentMemory is what measureAgent read.
type agentMemory struct {
	size                        int64
	rss, hwm, anon, file, shmem int64
}

// benchMemInitData is the pod's init data; withPolicy adds the [policy]
// section, which governs the two containers.
func benchMemInitData(withPolicy bool) []byte {
	doc := `version = "0.1"
`
	if !withPolicy {
		return []byte(doc)
	}
	return []byte(doc + `
[policy]

[policy.containers.app]
image = "docker.io/library/busybox:1.36"
args = ["sleep", "100000"]
env = [
  "PATH=/bin",
  "re:HOSTNAME=web-[a-z0-9]+-[a-z0-9]{5}",
  "HOME=/tmp",
  "MODE=production",
  "re:POD_IP=[0-9a-f.:]+",
  "re:[A-Z][A-Z0-9_]*_SERVICE_HOST=[0-9a-f.:]+",
  "re:[A-Z][A-Z0-9_]*_SERVICE_PORT(_[A-Z0-9_]+)?=[0-9]{1,5}",
  're:[A-Z][A-Z0-9_]*_PORT(_[0-9]{1,5}_(TCP|UDP|SCTP))?=(tcp|udp|sctp)://([0-9a-f.:]+|\[[0-9a-f.:]+\]):[0-9]{1,5}',
  "re:[A-Z][A-Z0-9_]*_PORT_[0-9]{1,5}_(TCP|UDP|SCTP)_PROTO=(tcp|udp|sctp)",
  "re:[A-Z][A-Z0-9_]*_PORT_[0-9]{1,5}_(TCP|UDP|SCTP)_PORT=[0-9]{1,5}",
  "re:[A-Z][A-Z0-9_]*_PORT_[0-9]{1,5}_(TCP|UDP|SCTP)_ADDR=[0-9a-f.:]+",
]
working_dir = "/"
uid = 1000
gid = 1000
no_new_privileges = true
read_only_root = true
mounts = [
  { destination = "/cache", kind = "tmpfs" },
  { destination = "/tmp", kind = "tmpfs" },
]
exec = [["cat", "/etc/hosts"], ["re:/bin/(true|false)"]]

[policy.containers.rss]
image = "docker.io/library/busybox:1.36"
args = ["grep", "-E", "^(VmRSS|VmHWM|RssAnon|RssFile|RssShmem):", "/proc/1/status"]
env = ["PATH=/bin"]
working_dir = "/"
uid = 0
gid = 0
read_only_root = true
vm_namespaces = ["pid"]
logs = true
`)
}

// benchMemSpec is the spec of one of the benchmark's containers.
func benchMemSpec(id string) []byte {
	nss := []specs.LinuxNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network"}}
	s := specs.Spec{
		Version:     specs.Version,
		Annotations: map[string]string{"io.kubernetes.cri.image-name": "docker.io/library/busybox:1.36"},
		Root:        &specs.Root{Path: "rootfs", Readonly: true},
		Process: &specs.Process{
			Env: []string{"PATH=/bin"}, Cwd: "/",
			Capabilities: &specs.LinuxCapabilities{Bounding: []string{"CAP_KILL"}, Effective: []string{"CAP_KILL"}, Permitted: []string{"CAP_KILL"}},
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/etc/hosts", Type: "bind", Source: "/host/hosts", Options: []string{"rbind", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath:   "kubepods.slice:cri:" + id,
			Namespaces:    nss,
			MaskedPaths:   []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
	}
	switch id {
	case "app":
		s.Process.Args = []string{"sleep", "100000"}
		s.Process.Env = []string{
			"PATH=/bin", "HOSTNAME=web-6d5f7c9b8d-x2k4q", "HOME=/tmp", "MODE=production", "POD_IP=10.244.1.17",
			"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443",
			"KUBERNETES_PORT=tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
			"KUBERNETES_PORT_443_TCP_PROTO=tcp", "KUBERNETES_PORT_443_TCP_PORT=443", "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
			"WEB_SERVICE_HOST=10.96.23.9", "WEB_SERVICE_PORT=8080", "WEB_PORT=tcp://10.96.23.9:8080",
			"WEB_PORT_8080_TCP=tcp://10.96.23.9:8080", "WEB_PORT_8080_TCP_PROTO=tcp", "WEB_PORT_8080_TCP_PORT=8080",
			"WEB_PORT_8080_TCP_ADDR=10.96.23.9",
		}
		s.Process.User = specs.User{UID: 1000, GID: 1000}
		s.Process.NoNewPrivileges = true
		s.Mounts = append(s.Mounts,
			specs.Mount{Destination: "/cache", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "size=16m"}},
			specs.Mount{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}},
		)
	case "rss":
		s.Process.Args = []string{"grep", "-E", "^(VmRSS|VmHWM|RssAnon|RssFile|RssShmem):", "/proc/1/status"}
		s.Linux.Namespaces = nss[1:] // the VM's pid namespace: PID 1 is the agent
	}
	raw, err := json.Marshal(&s)
	if err != nil {
		panic(err)
	}
	return raw
}

// measureAgent boots the agent at path and drives it (BenchmarkAgentMemory).
func measureAgent(b *testing.B, dir, kernel, path string, sp *sim.SP, withPolicy bool) agentMemory {
	b.Helper()
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	m := agentMemory{size: st.Size()}
	run, err := os.MkdirTemp(dir, "vm-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(run)
	initrd := filepath.Join(run, "initrd.img")
	benchSh(b, dir, "cp base.cpio "+initrd)
	agent, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(initrd, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		b.Fatal(err)
	}
	w := newc.NewWriter(f)
	if err := w.Write(newc.Entry{Name: "init", Mode: newc.ModeRegular | 0o755, Body: agent}); err != nil {
		b.Fatal(err)
	}
	if err := w.Close(); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}

	doc := benchMemInitData(withPolicy)
	svc := &sim.Service{SP: sp, HostData: initdata.Digest(doc)}
	agentSock, attestSock := filepath.Join(run, "agent.sock"), filepath.Join(run, "attest.sock")
	qemu := exec.Command("qemu-system-x86_64", "-accel", "tcg", "-m", "512", "-smp", "1",
		"-kernel", kernel, "-initrd", initrd, "-append", vm.BaseKernelParams,
		"-nographic", "-no-reboot", "-nodefaults", "-serial", "file:"+filepath.Join(run, "console.log"),
		"-object", "rng-random,id=rng0,filename=/dev/urandom", "-device", "virtio-rng-pci,rng=rng0",
		"-device", "virtio-serial",
		"-chardev", "socket,id=agent,path="+agentSock+",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=c8s.agent",
		"-chardev", "socket,id=attest,path="+attestSock+",server=on,wait=off",
		"-device", "virtserialport,chardev=attest,name="+sim.AttestPort,
		"-device", "virtio-scsi-pci,id=scsi0",
		"-drive", "file="+filepath.Join(dir, "disk.ext4")+",format=raw,if=none,id=d0,readonly=on",
		"-device", "scsi-hd,drive=d0,bus=scsi0.0,channel=0,scsi-id=2,lun=1",
	)
	if err := qemu.Start(); err != nil {
		b.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- qemu.Wait() }()
	defer func() {
		_ = qemu.Process.Kill()
		<-exited
		if b.Failed() {
			out, _ := os.ReadFile(filepath.Join(run, "console.log"))
			b.Logf("guest console:\n%s", out)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	attestConn := benchDial(b, attestSock)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = sim.Serve(ctx, attestConn, svc)
	}()
	defer func() {
		cancel()
		<-served
		attestConn.Close()
	}()

	booted := time.Now()
	var client *ttrpc.Client
	var ag agentapi.AgentService
	for {
		client = ttrpc.NewClient(benchDial(b, agentSock))
		ag = agentapi.NewAgentClient(client)
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := ag.GetInfo(cctx, &agentapi.GetInfoRequest{})
		ccancel()
		if err == nil {
			break
		}
		client.Close()
		if ctx.Err() != nil {
			b.Fatalf("the agent never answered GetInfo: %v", err)
		}
	}
	defer client.Close()
	io := agentapi.NewIOClient(client)
	b.Logf("%s: GetInfo after %s", filepath.Base(path), time.Since(booted).Round(time.Millisecond))

	if _, err := ag.SetInitData(ctx, &agentapi.SetInitDataRequest{InitData: doc}); err != nil {
		b.Fatalf("SetInitData: %v", err)
	}
	rootfs := &agentapi.Rootfs{Fstype: "ext4", Options: []string{"ro"},
		Source: &agentapi.Rootfs_Scsi{Scsi: &agentapi.ScsiDisk{Target: 2, Lun: 1}}}
	files := []*agentapi.File{{Source: "/host/hosts", Content: []byte("10.244.1.17 web-6d5f7c9b8d-x2k4q\n"), Mode: 0o644}}
	create := func(id string, stdout bool) {
		if _, err := ag.CreateContainer(ctx, &agentapi.CreateContainerRequest{ContainerId: id, Spec: benchMemSpec(id), Rootfs: rootfs,
			Files: files, Stdio: &agentapi.Stdio{Stdout: stdout}}); err != nil {
			b.Fatalf("create %s: %v", id, err)
		}
		if _, err := ag.StartContainer(ctx, &agentapi.StartContainerRequest{ContainerId: id}); err != nil {
			b.Fatalf("start %s: %v", id, err)
		}
	}
	read := func(id, execID string) string {
		var out bytes.Buffer
		for {
			r, err := io.ReadStdout(ctx, &agentapi.ReadStreamRequest{ContainerId: id, ExecId: execID})
			if err != nil {
				b.Fatalf("read %s/%s: %v", id, execID, err)
			}
			out.Write(r.GetData())
			if r.GetEof() {
				return out.String()
			}
		}
	}
	create("app", false)
	proc, _ := json.Marshal(&specs.Process{Args: []string{"cat", "/etc/hosts"}, Env: []string{"PATH=/bin"}, Cwd: "/",
		User: specs.User{UID: 1000, GID: 1000}, NoNewPrivileges: true})
	if _, err := ag.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "app", ExecId: "x", Process: proc, Stdio: &agentapi.Stdio{Stdout: true}}); err != nil {
		b.Fatalf("exec: %v", err)
	}
	if out := read("app", "x"); !strings.Contains(out, "web-6d5f7c9b8d") {
		b.Fatalf("exec output %q", out)
	}
	if _, err := ag.WaitProcess(ctx, &agentapi.ProcessRequest{ContainerId: "app", ExecId: "x"}); err != nil {
		b.Fatal(err)
	}
	create("rss", true)
	status := read("rss", "")
	for sc := bufio.NewScanner(strings.NewReader(status)); sc.Scan(); {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kib, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			m.rss = kib
		case "VmHWM":
			m.hwm = kib
		case "RssAnon":
			m.anon = kib
		case "RssFile":
			m.file = kib
		case "RssShmem":
			m.shmem = kib
		}
	}
	if m.rss == 0 || m.hwm == 0 {
		b.Fatalf("PID 1's status: %q", status)
	}
	b.Logf("%s: PID 1 %s", filepath.Base(path), strings.Join(strings.Fields(status), " "))
	if withPolicy {
		// After the reading: the policy was in force (an exec off the
		// list is refused), so "after" measured an agent enforcing it.
		proc, _ := json.Marshal(&specs.Process{Args: []string{"sh"}, Env: []string{"PATH=/bin"}, Cwd: "/", User: specs.User{UID: 1000, GID: 1000}, NoNewPrivileges: true})
		_, err := ag.ExecProcess(ctx, &agentapi.ExecProcessRequest{ContainerId: "app", ExecId: "off-list", Process: proc, Stdio: &agentapi.Stdio{}})
		if !errdefs.IsPermissionDenied(errgrpc.ToNative(err)) {
			b.Fatalf("an exec off the policy's list: %v, want a policy denial", err)
		}
	}
	_, _ = ag.Shutdown(ctx, &agentapi.Empty{})
	return m
}

// benchDial connects to a QEMU chardev socket, waiting for QEMU to create
// it.
func benchDial(b *testing.B, sock string) net.Conn {
	b.Helper()
	for i := 0; ; i++ {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			return conn
		}
		if i > 400 {
			b.Fatalf("dial %s: %v", sock, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func benchSh(b *testing.B, dir, script string) {
	b.Helper()
	c := exec.Command("/bin/sh", "-ec", script)
	c.Dir = dir
	if out, err := c.CombinedOutput(); err != nil {
		b.Fatalf("%s: %v\n%s", script, err, out)
	}
}
