package policygen

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	evaluator "github.com/c8s-dev/c8s/guest/policy"
)

// The round trip: the generated document parses as the shim and the
// agent parse it, and the guest's evaluator allows the CreateContainer
// requests containerd 2.2 makes for the pod (built here by hand as the
// guest adapts them: host files passed by value, shares, emptyDirs in
// guest memory, namespaces joined from the sandbox), the kubelet's probe
// execs and kubectl logs, and denies the host's changes to any of them.

// mount is a mount of an adapted spec and its kind.
type mount struct {
	m    specs.Mount
	kind policyapi.MountKind
}

// podMounts are what containerd gives every container, before CRI's.
func podMounts() []mount {
	return []mount{
		{specs.Mount{Destination: "/proc", Type: "proc", Source: "proc"}, policyapi.KindProc},
		{specs.Mount{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755"}}, policyapi.KindTmpfs},
		{specs.Mount{Destination: "/dev/pts", Type: "devpts", Source: "devpts"}, policyapi.KindDevpts},
		{specs.Mount{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue"}, policyapi.KindMqueue},
		{specs.Mount{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}}, policyapi.KindSysfs},
		{specs.Mount{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"ro"}}, policyapi.KindCgroup},
	}
}

func bind(dest, src string, kind policyapi.MountKind, ro bool) mount {
	opt := "rw"
	if ro {
		opt = "ro"
	}
	return mount{specs.Mount{Destination: dest, Type: "bind", Source: src, Options: []string{"rbind", "rprivate", opt}}, kind}
}

// request is a CreateContainer request in the making.
type request struct {
	id     string
	spec   *specs.Spec
	mounts []mount
	root   evaluator.Root
}

func (r *request) create(e *evaluator.Evaluator, joined *evaluator.Container) (*evaluator.Container, error) {
	r.spec.Mounts = nil
	var kinds []policyapi.MountKind
	for _, m := range r.mounts {
		r.spec.Mounts = append(r.spec.Mounts, m.m)
		kinds = append(kinds, m.kind)
	}
	return e.CreateContainer(&evaluator.CreateContainer{ID: r.id, Spec: r.spec, MountKinds: kinds, Joined: joined, Root: r.root})
}

func defaultCaps() *specs.LinuxCapabilities {
	c := policyapi.DefaultCapabilities
	return &specs.LinuxCapabilities{Bounding: slices.Clone(c), Effective: slices.Clone(c), Permitted: slices.Clone(c)}
}

// linux is the linux section containerd writes: the sandbox's own
// namespaces, or, joined, the sandbox's network, IPC and UTS.
func linux(joined bool) *specs.Linux {
	l := &specs.Linux{
		MaskedPaths:   append(slices.Clone(policyapi.DefaultMaskedPaths), "/sys/devices/virtual/powercap"),
		ReadonlyPaths: slices.Clone(policyapi.DefaultReadonlyPaths),
		Namespaces:    []specs.LinuxNamespace{{Type: "pid"}, {Type: "network"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}},
	}
	if joined {
		for i, ns := range l.Namespaces {
			if ns.Type == "network" || ns.Type == "ipc" || ns.Type == "uts" {
				l.Namespaces[i].Path = "/run/c8s/sandbox/ns/" + string(ns.Type)
			}
		}
		l.Namespaces = append(l.Namespaces, specs.LinuxNamespace{Type: "cgroup"})
	}
	return l
}

// sandboxRequest is the pause container of a pod.
func sandboxRequest(uid, gid uint32, sysctl map[string]string) *request {
	return &request{id: "sandbox", spec: &specs.Spec{
		Annotations: map[string]string{evaluator.AnnotationContainerType: "sandbox", evaluator.AnnotationSandboxImageName: DefaultSandboxImage},
		Root:        &specs.Root{Path: "/run/c8s/containers/sandbox/rootfs", Readonly: true},
		Process: &specs.Process{
			Args: []string{"/pause"}, Cwd: "/", User: specs.User{UID: uid, GID: gid},
			Env: []string{defaultPath}, Capabilities: defaultCaps(),
		},
		Linux: func() *specs.Linux { l := linux(false); l.Sysctl = sysctl; return l }(),
	}, mounts: append(podMounts(),
		bind("/dev/shm", "/run/c8s/emptydir/.pod/shm", policyapi.KindPodShm, true),
		bind("/etc/resolv.conf", "/run/c8s/containers/sandbox/files/0-resolv.conf", policyapi.KindFile, true),
	)}
}

// containerRequest is a container of a pod, with the files CRI binds.
func containerRequest(id, name, image string, p *specs.Process, extra ...mount) *request {
	p.Capabilities = defaultCaps()
	return &request{id: id, spec: &specs.Spec{
		Annotations: map[string]string{evaluator.AnnotationContainerType: "container", evaluator.AnnotationContainerName: name, evaluator.AnnotationImageName: image},
		Root:        &specs.Root{Path: "/run/c8s/containers/" + id + "/rootfs"},
		Process:     p,
		Linux:       linux(true),
	}, mounts: append(append(podMounts(),
		bind("/etc/hosts", "/run/c8s/containers/"+id+"/files/0-hosts", policyapi.KindFile, false),
		bind("/dev/termination-log", "/run/c8s/containers/"+id+"/files/1-termination-log", policyapi.KindFile, false),
		bind("/etc/hostname", "/run/c8s/containers/"+id+"/files/2-hostname", policyapi.KindFile, false),
		bind("/etc/resolv.conf", "/run/c8s/containers/"+id+"/files/3-resolv.conf", policyapi.KindFile, false),
		bind("/dev/shm", "/run/c8s/emptydir/.pod/shm", policyapi.KindPodShm, false),
	), extra...)}
}

// kubernetesEnv is what the kubelet injects for the API server's service.
var kubernetesEnv = []string{
	"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443",
	"KUBERNETES_PORT=tcp://10.96.0.1:443", "KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
	"KUBERNETES_PORT_443_TCP_PROTO=tcp", "KUBERNETES_PORT_443_TCP_PORT=443", "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
}

// evaluatorOf is the evaluator of a testdata workload's generated policy.
func evaluatorOf(t *testing.T, file string, o Options) *evaluator.Evaluator {
	t.Helper()
	data, err := os.ReadFile("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Generate(data, o)
	if err != nil {
		t.Fatal(err)
	}
	d, err := initdata.Parse(rs[0].InitData)
	if err != nil {
		t.Fatalf("the generated init data does not parse: %v", err)
	}
	if !d.PolicyGoverns() {
		t.Fatal("no [policy]")
	}
	return evaluator.New(d.Policy, nil)
}

const appRef = "ghcr.io/example/app@sha256:9d4e4bb5b1f3b8c14b3e0a7f6e6c2a1d0e9f8a7b6c5d4e3f2a1b0c9d8e7f6a5b"

// deploymentApp is container app of a pod of testdata/deployment.yaml,
// its root the image's layers.
func deploymentApp() *request {
	r := containerRequest("app1", "app", appRef, &specs.Process{
		Args: []string{"/usr/bin/app", "serve"}, Cwd: "/srv/app",
		User: specs.User{UID: 1001, GID: 1002, AdditionalGids: []uint32{1002}},
		Env: append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOSTNAME=web-7d9f8c6b5-x2k4q", "HOME=/data", "APP_PORT=8080",
			"MODE=production", "LISTEN=:$(APP_PORT)"}, kubernetesEnv...),
		NoNewPrivileges: true,
	},
		bind("/data", "/run/c8s/emptydir/0f1e-22/data", policyapi.KindEmptyDir, false),
		bind("/etc/app/settings.yaml", "/run/c8s/containers/app1/files/5-settings.yaml", policyapi.KindFile, true),
	)
	r.root.Layers = appImage().Layers
	return r
}

func TestRoundTripDeployment(t *testing.T) {
	e := evaluatorOf(t, "deployment.yaml", deploymentOptions(t))
	sb, err := sandboxRequest(65535, 65535, map[string]string{"net.ipv4.ip_unprivileged_port_start": "0", "net.ipv4.ping_group_range": "0 2147483647"}).create(e, nil)
	if err != nil {
		t.Fatalf("the sandbox: %v", err)
	}
	migrate := containerRequest("migrate1", "migrate", appRef, &specs.Process{
		Args: []string{"/usr/bin/app", "migrate", "--to=latest"}, Cwd: "/srv/app", User: specs.User{UID: 1001, GID: 1002, AdditionalGids: []uint32{1002}},
		Env: append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOSTNAME=web-7d9f8c6b5-x2k4q", "HOME=/home/app", "APP_PORT=8080",
			"POD_NAME=web-7d9f8c6b5-x2k4q"}, kubernetesEnv...),
	})
	migrate.root.Layers = appImage().Layers
	if _, err := migrate.create(e, sb); err != nil {
		t.Fatalf("init container migrate: %v", err)
	}
	app, err := deploymentApp().create(e, sb)
	if err != nil {
		t.Fatalf("container app: %v", err)
	}
	// The kubelet's probe, the owner's --allow-exec, kubectl logs.
	probe := deploymentApp().spec.Process
	probe.Args = []string{"/usr/bin/app", "ping"}
	if err := e.Exec(app, &evaluator.Exec{ExecID: "probe", Process: probe}); err != nil {
		t.Errorf("readinessProbe: %v", err)
	}
	probe.Args = []string{"/usr/bin/app", "debug", "--level=3"}
	if err := e.Exec(app, &evaluator.Exec{ExecID: "debug", Process: probe}); err != nil {
		t.Errorf("--allow-exec: %v", err)
	}
	if err := e.ReadOutput(app, "", false); err != nil {
		t.Errorf("kubectl logs: %v", err)
	}
	if named, all := app.Secrets(); all || len(named) != 1 || named[0].Path != "/run/secrets/db-password" {
		t.Errorf("app's secrets = %+v (all %v)", named, all)
	}

	// kubectl exec of a shell is refused, and each change of the host's.
	probe.Args = []string{"sh"}
	deniedBy(t, e.Exec(app, &evaluator.Exec{ExecID: "shell", Process: probe}), "process.args")
	for field, change := range map[string]func(r *request){
		"image":        func(r *request) { r.spec.Annotations[evaluator.AnnotationImageName] = "ghcr.io/example/app:latest" },
		"process.args": func(r *request) { r.spec.Process.Args = []string{"/usr/bin/app", "serve", "--debug"} },
		"process.env[6]": func(r *request) {
			r.spec.Process.Env = append(r.spec.Process.Env[:6], append([]string{"LD_PRELOAD=/data/evil.so"}, r.spec.Process.Env[6:]...)...)
		},
		"process.env[4]": func(r *request) { r.spec.Process.Env[4] = "MODE=debug" },
		"process.env[1]": func(r *request) { r.spec.Process.Env[1] = "HOSTNAME=evil" },
		"process.cwd":    func(r *request) { r.spec.Process.Cwd = "/data" },
		"process.user.uid": func(r *request) {
			r.spec.Process.User.UID = 0
		},
		// The root group added to the process's groups.
		"process.user.additionalGids": func(r *request) {
			r.spec.Process.User.AdditionalGids = append(r.spec.Process.User.AdditionalGids, 0)
		},
		"mounts[13]": func(r *request) {
			r.mounts = append(r.mounts, bind("/loot", "/run/c8s/containers/app1/shares/app1-9", policyapi.KindShared, false))
		},
		// The pinned layers: a root disk the host built, a layer swapped,
		// another tree for a pinned layer.
		"rootfs.source":       func(r *request) { r.root = evaluator.Root{HostDisk: true} },
		"layers[1].digest":    func(r *request) { r.root.Layers[1].Digest = "sha256:" + strings.Repeat("99", 32) },
		"layers[0].root_hash": func(r *request) { r.root.Layers[0].Verity = strings.Repeat("88", 32) },
	} {
		r := deploymentApp()
		change(r)
		_, err := r.create(e, sb)
		deniedBy(t, err, field)
	}
}

// A Pod that pins itself (no image config): service links, $(VAR)
// expansion, downward API, the configMap's env, a tty sidecar.
func TestRoundTripPod(t *testing.T) {
	e := evaluatorOf(t, "pod.yaml", Options{})
	sb, err := sandboxRequest(1000, 1000, map[string]string{"net.core.somaxconn": "1024", "net.ipv4.ip_unprivileged_port_start": "0", "net.ipv4.ping_group_range": "0 2147483647"}).create(e, nil)
	if err != nil {
		t.Fatalf("the sandbox: %v", err)
	}
	links := []string{"DB_SERVICE_HOST=10.0.0.5", "DB_SERVICE_PORT=5432", "DB_SERVICE_PORT_PG=5432", "DB_PORT=tcp://10.0.0.5:5432",
		"DB_PORT_5432_TCP=tcp://10.0.0.5:5432", "DB_PORT_5432_TCP_PROTO=tcp", "DB_PORT_5432_TCP_PORT=5432", "DB_PORT_5432_TCP_ADDR=10.0.0.5"}
	app := func() *request {
		env := []string{defaultPath, "HOSTNAME=web", "CFG_log-level=debug", "CFG_mode=production", "PORT=8080", "POD_NAME=web",
			"POD_IP=10.244.1.7", "DB_PASSWORD=s3cr3t\nline2", "LOG_LEVEL=debug", "MEM_LIMIT=134217728"}
		env = append(append(env, kubernetesEnv...), links...)
		return containerRequest("app1", "app", "ghcr.io/example/web@sha256:0f6e4b9a3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f", &specs.Process{
			Args: []string{"/app/server", "--listen=:8080", "--name=web", "--db=10.0.0.5", "$(literal)"},
			Cwd:  "/app", User: specs.User{UID: 1000, GID: 1000}, Env: env, NoNewPrivileges: true,
		},
			bind("/etc/web", "/run/c8s/containers/app1/shares/app1-5", policyapi.KindShared, true),
			bind("/cache", "/run/c8s/emptydir/u/cache", policyapi.KindEmptyDir, false),
			bind("/tmp", "/run/c8s/emptydir/u/scratch", policyapi.KindEmptyDir, false),
			bind("/var/run/secrets/kubernetes.io/serviceaccount", "/run/c8s/containers/app1/shares/app1-8", policyapi.KindShared, true),
		)
	}
	r := app()
	r.spec.Root.Readonly = true
	r.spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_NET_BIND_SERVICE"}}
	if _, err := r.create(e, sb); err != nil {
		t.Fatalf("container app: %v", err)
	}
	sidecar := containerRequest("side1", "sidecar", "docker.io/library/busybox:1.36", &specs.Process{
		Terminal: true, Args: []string{"sh", "-c", "while true; do sleep 3600; done"}, Cwd: "/", User: specs.User{UID: 0, GID: 1000},
		Env: append([]string{defaultPath, "TERM=xterm", "HOSTNAME=web"}, kubernetesEnv...),
	}, bind("/var/run/secrets/kubernetes.io/serviceaccount", "/run/c8s/containers/side1/shares/side1-5", policyapi.KindShared, true))
	caps := append(slices.DeleteFunc(slices.Clone(policyapi.DefaultCapabilities), func(c string) bool { return c == "CAP_NET_RAW" }), "CAP_SYS_PTRACE")
	sidecar.spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps}
	if _, err := sidecar.create(e, sb); err != nil {
		t.Fatalf("container sidecar: %v", err)
	}
	for field, change := range map[string]func(r *request){
		"process.args":                  func(r *request) { r.spec.Process.Args[3] = "--db=evil.example" },
		"process.env[6]":                func(r *request) { r.spec.Process.Env[6] = "POD_IP=10.0.0.1;rm -rf /" },
		"process.capabilities.bounding": func(r *request) { r.spec.Process.Capabilities.Bounding = []string{"CAP_NET_RAW"} },
		"root.readonly":                 func(r *request) { r.spec.Root.Readonly = false },
		// The pod's scratch volume where the pod spec mounts cache.
		`emptydir volume "scratch"`: func(r *request) {
			for i, m := range r.mounts {
				if m.m.Destination == "/cache" {
					r.mounts[i] = bind("/cache", "/run/c8s/emptydir/u/scratch", policyapi.KindEmptyDir, false)
				}
			}
		},
		// A volume of the same name in another pod's directory.
		"another pod's emptyDir": func(r *request) {
			for i, m := range r.mounts {
				if m.m.Destination == "/cache" {
					r.mounts[i] = bind("/cache", "/run/c8s/emptydir/other-pod/cache", policyapi.KindEmptyDir, false)
				}
			}
		},
	} {
		r := app()
		r.spec.Root.Readonly = true
		r.spec.Process.Capabilities = &specs.LinuxCapabilities{Bounding: []string{"CAP_NET_BIND_SERVICE"}}
		change(r)
		_, err := r.create(e, sb)
		deniedBy(t, err, field)
	}
}

// deniedBy checks that err is a policy denial naming field.
func deniedBy(t *testing.T, err error, field string) {
	t.Helper()
	if !errdefs.IsPermissionDenied(err) {
		t.Errorf("%s: err = %v, want a policy denial", field, err)
		return
	}
	var d *evaluator.Denial
	var ds evaluator.Denials
	switch {
	case errors.As(err, &ds):
		for _, x := range ds {
			if x.Field == field {
				return
			}
		}
	case errors.As(err, &d) && d.Field == field:
		return
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("%s: the denial does not name the field: %v", field, err)
	}
}
