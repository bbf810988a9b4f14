package diag

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	versionapi "github.com/containerd/containerd/api/services/version/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/c8s-dev/c8s/launcher/admin/ctrdconfig"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
)

// ShimBinary is the binary containerd runs for runtime_type io.containerd.c8s.v2.
const ShimBinary = "containerd-shim-c8s-v2"

func checkImage(_ context.Context, s *state) Result {
	o := s.o
	dir := o.ImageDir
	m, err := manifest.Verify(o.path(dir))
	var verr *manifest.VerifyError
	switch {
	case errors.As(err, &verr):
		var bad []string
		for _, mm := range verr.Mismatches {
			if mm.Problem != "" {
				bad = append(bad, fmt.Sprintf("%s (%s) cannot be read", mm.Role, mm.File))
				continue
			}
			bad = append(bad, fmt.Sprintf("%s (%s) has sha256 %s, manifest says %s", mm.Role, mm.File, short(mm.GotHash), short(mm.Want.SHA256)))
		}
		return Result{Status: Fail, Detail: fmt.Sprintf("image in %s does not match its manifest: %s", dir, strings.Join(bad, "; ")),
			Hint: "reinstall the guest image (make image && c8s-launcher install)"}
	case err != nil:
		return Result{Status: Fail, Detail: fmt.Sprintf("no valid %s in %s", manifest.FileName, dir),
			Hint: "install the guest image (make image && c8s-launcher install) or set hypervisor.kernel to the installed image"}
	}
	s.manifest = m
	facts := map[string]string{
		"dir":            dir,
		"kernel_release": m.Kernel.Release,
		"kernel_sha256":  m.Artifacts[manifest.RoleKernel].SHA256,
		"initrd_sha256":  m.Artifacts[manifest.RoleInitrd].SHA256,
		"digests":        strconv.Itoa(len(m.Digests)),
	}
	detail := fmt.Sprintf("%s: kernel %s and initrd match manifest.json", dir, m.Kernel.Release)
	if m.Sealed() {
		detail = fmt.Sprintf("%s: kernel %s, initrd and dm-verity root (root hash %s) match manifest.json", dir, m.Kernel.Release, short(m.Verity.RootHash))
		facts["root_hash"] = m.Verity.RootHash
	}
	h := o.Config.Hypervisor
	for role, got := range map[string]string{manifest.RoleKernel: h.Kernel, manifest.RoleInitrd: h.Initrd, manifest.RoleRootfs: h.Rootfs} {
		if _, ok := m.Artifacts[role]; !ok {
			continue
		}
		want := path.Join(dir, m.Artifacts[role].File)
		if got != "" && got != want {
			return Result{Status: Warn, Detail: fmt.Sprintf("%s; but hypervisor.%s is %s, not the image's %s", detail, role, got, want), Facts: facts,
				Hint: fmt.Sprintf("set hypervisor.%s = %q so pods boot the verified image", role, want)}
		}
	}
	return Result{Status: Pass, Detail: detail, Facts: facts}
}

// checkImageDigest recomputes the launch digest a pod VM of the checked
// TEE gets (for a pod without annotations), from exactly the QEMU command
// line the shim would run, and compares it with the manifest's.
func checkImageDigest(_ context.Context, s *state) Result {
	o := s.o
	if o.TEE != "sim" {
		return Result{Status: Warn, Detail: fmt.Sprintf("the expected %s launch digest is not recomputed by check yet", o.TEE),
			Hint: fmt.Sprintf("compute it with c8s-measure %s from the firmware, kernel, initrd and the %s command line (manifest.json digests.%s.cmdline, which ends in c8s.tee=%s)", o.TEE, o.TEE, o.TEE, o.TEE)}
	}
	h := o.Config.Hypervisor
	h.TEE = o.TEE
	if s.manifest != nil {
		if h.Kernel == "" {
			h.Kernel = path.Join(o.ImageDir, s.manifest.Artifacts[manifest.RoleKernel].File)
		}
		if h.Initrd == "" {
			h.Initrd = path.Join(o.ImageDir, s.manifest.Artifacts[manifest.RoleInitrd].File)
		}
	}
	cannot := func(err error) Result {
		return Result{Status: Warn, Detail: "cannot recompute the sim launch digest: " + o.unroot(err.Error()),
			Hint: "fix the image and firmware checks above"}
	}
	backend, err := tee.Lookup(h.TEE)
	if err != nil {
		return cannot(err)
	}
	spec := vm.Spec{ID: "check", StateDir: path.Join(o.Config.Runtime.StateDir, "check"), Hypervisor: h, Accel: "tcg"}
	if s.manifest != nil && s.manifest.Sealed() {
		spec.Root = &vm.RootDisk{Path: path.Join(o.ImageDir, s.manifest.Artifacts[manifest.RoleRootfs].File), KernelParams: s.manifest.RootKernelParams(), RootHash: s.manifest.Verity.RootHash}
	}
	argv, err := vm.Args(spec, backend)
	if err != nil {
		return cannot(err)
	}
	l, err := sim.LaunchFromArgv(argv)
	if err != nil {
		return cannot(err)
	}
	l.Firmware, l.Kernel = o.path(l.Firmware), o.path(l.Kernel)
	if l.Initrd != "" {
		l.Initrd = o.path(l.Initrd)
	}
	d, err := sim.Measure(l)
	if err != nil {
		return cannot(err)
	}
	got := hex.EncodeToString(d[:])
	facts := map[string]string{"sim": got, "vcpus": strconv.Itoa(l.VCPUs)}
	detail := fmt.Sprintf("sim launch digest %s (firmware, kernel, initrd, command line, %d vCPU)", got, l.VCPUs)
	if s.manifest == nil {
		return Result{Status: Warn, Detail: detail + "; no verified manifest to compare with", Facts: facts, Hint: "see image"}
	}
	want, err := s.manifest.Sim()
	if err != nil {
		return Result{Status: Warn, Detail: detail + "; " + err.Error(), Facts: facts,
			Hint: "install an image built with expected digests (make image && c8s-launcher install)"}
	}
	expected, ok := want.ByVCPUs[strconv.Itoa(l.VCPUs)]
	if !ok {
		return Result{Status: Warn, Detail: fmt.Sprintf("%s; manifest.json has no digest for %d vCPUs", detail, l.VCPUs), Facts: facts,
			Hint: "set hypervisor.default_vcpus to a count the image lists, or rebuild the image for it"}
	}
	if expected == got {
		return Result{Status: Pass, Detail: detail + ", as manifest.json expects", Facts: facts}
	}
	why := "the kernel or initrd differ from the image build's"
	fw, _ := os.ReadFile(l.Firmware) // already under the root
	if sum := sha256.Sum256(fw); hex.EncodeToString(sum[:]) != want.Firmware.SHA256 {
		why = fmt.Sprintf("the firmware differs from the image build's (%s, sha256 %s)", want.Firmware.Path, short(want.Firmware.SHA256))
	} else if l.Cmdline != want.Cmdline {
		why = fmt.Sprintf("the kernel command line %q differs from the image build's %q (hypervisor.kernel_params?)", l.Cmdline, want.Cmdline)
	}
	return Result{Status: Fail, Detail: fmt.Sprintf("%s, but manifest.json expects %s: %s", detail, expected, why), Facts: facts,
		Hint: "attestation will reject these pods: boot what the image was built for, or rebuild the image on this node's firmware"}
}

// socketPath strips a unix:// scheme from a containerd address.
func socketPath(addr string) string { return strings.TrimPrefix(addr, "unix://") }

// dialContainerd opens a gRPC client for containerd's socket addr under root.
func dialContainerd(root, addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+ctrdconfig.RootJoin(root, socketPath(addr)),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// ContainerdVersion asks containerd at the unix socket address for its
// version. root is the filesystem root the socket path is under.
func ContainerdVersion(ctx context.Context, root, addr string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := dialContainerd(root, addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	resp, err := versionapi.NewVersionClient(conn).Version(ctx, &emptypb.Empty{})
	if err != nil {
		return "", err
	}
	return resp.Version, nil
}

// CRIHandlers asks containerd's CRI service at addr which runtime handlers
// it has loaded (CRI Status), sorted.
func CRIHandlers(ctx context.Context, root, addr string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := dialContainerd(root, addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := runtimeapi.NewRuntimeServiceClient(conn).Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return nil, err
	}
	names := []string{}
	for _, h := range resp.GetRuntimeHandlers() {
		if h.GetName() != "" {
			names = append(names, h.GetName())
		}
	}
	slices.Sort(names)
	return names, nil
}

func checkContainerdSocket(ctx context.Context, s *state) Result {
	o := s.o
	addr := socketPath(o.ContainerdAddress)
	if err := o.dialUnix(ctx, addr); err != nil {
		return Result{Status: Fail, Detail: fmt.Sprintf("nothing listens on %s", addr),
			Hint: "start containerd (systemctl start containerd), or pass --containerd-address"}
	}
	v, err := ContainerdVersion(ctx, o.Root, addr)
	if err != nil {
		return Result{Status: Fail, Detail: fmt.Sprintf("%s accepts connections but does not answer containerd's version API", addr),
			Hint: "check that --containerd-address is containerd's gRPC socket, not its ttrpc one"}
	}
	s.containerdUp = true
	return Result{Status: Pass, Detail: fmt.Sprintf("containerd %s on %s", v, addr),
		Facts: map[string]string{"address": addr, "version": v}}
}

// shimPath finds the c8s shim where containerd looks for it (its PATH).
func (o *Options) shimPath() string {
	if o.live() {
		if p, err := exec.LookPath(ShimBinary); err == nil {
			return p
		}
	}
	for _, dir := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		if o.exists(dir + "/" + ShimBinary) {
			return dir + "/" + ShimBinary
		}
	}
	return ""
}

func checkContainerdHandler(ctx context.Context, s *state) Result {
	o := s.o
	install := "run c8s-launcher install (then restart containerd)"
	cfg, err := ctrdconfig.Load(o.Root, o.ContainerdConfig)
	if err != nil {
		return Result{Status: Fail, Detail: o.unroot(err.Error()), Hint: "fix containerd's config; containerd itself refuses it too"}
	}
	if !cfg.Exists {
		return Result{Status: Fail, Detail: fmt.Sprintf("%s does not exist: containerd runs on its defaults, which have no c8s handler", cfg.Path), Hint: install}
	}
	handlers := cfg.C8sHandlers()
	facts := map[string]string{"config": cfg.Path, "version": strconv.Itoa(cfg.Version), "handlers": strings.Join(handlers, ",")}
	if len(handlers) == 0 {
		return Result{Status: Fail, Detail: fmt.Sprintf("no runtime handler with runtime_type %s in %s or its %d import(s)", ctrdconfig.RuntimeType, cfg.Path, len(cfg.Files)-1),
			Facts: facts, Hint: install}
	}
	var where, noConfig []string
	for _, h := range handlers {
		where = append(where, fmt.Sprintf("%s (%s)", h, cfg.Handlers[h].File))
		if p := cfg.Handlers[h].ConfigPath; p != "" && !o.exists(p) {
			noConfig = append(noConfig, fmt.Sprintf("%s's ConfigPath %s", h, p))
		}
	}
	detail := "handler " + strings.Join(where, ", ")
	if len(noConfig) > 0 {
		facts["missing_configs"] = strings.Join(noConfig, ",")
		return Result{Status: Fail, Detail: detail + "; but " + strings.Join(noConfig, ", ") + " does not exist", Facts: facts,
			Hint: "install the c8s configs (c8s-launcher install keeps existing ones) or fix the handler's ConfigPath"}
	}
	if s.containerdUp {
		loaded, err := CRIHandlers(ctx, o.Root, o.ContainerdAddress)
		if err == nil {
			facts["loaded"] = strings.Join(loaded, ",")
			var missing []string
			for _, h := range handlers {
				if !slices.Contains(loaded, h) {
					missing = append(missing, h)
				}
			}
			if len(missing) > 0 {
				return Result{Status: Fail, Detail: detail + "; but the running containerd has not loaded " + strings.Join(missing, ", "), Facts: facts,
					Hint: "restart containerd so that it reads its config again (systemctl restart containerd)"}
			}
			detail += "; loaded by containerd"
		} else {
			detail += "; containerd serves no CRI, so whether it loaded them is unknown"
		}
	}
	shim := o.shimPath()
	facts["shim"] = shim
	if shim == "" {
		return Result{Status: Fail, Detail: detail + "; but " + ShimBinary + " is not in PATH", Facts: facts,
			Hint: "install the binaries (c8s-launcher install) into a directory on containerd's PATH"}
	}
	if cfg.DiscardUnpackedLayers {
		facts["discard_unpacked_layers"] = cfg.DiscardFile
		return Result{Status: Warn, Facts: facts,
			Detail: detail + "; but " + cfg.DiscardFile + " sets discard_unpacked_layers = true: CRI deletes layer blobs once unpacked, so a pod can run only image layers c8s's layer cache already holds",
			Hint:   "set discard_unpacked_layers = false (plugins.'io.containerd.cri.v1.images') and pull the images again"}
	}
	return Result{Status: Pass, Detail: detail + "; shim " + shim, Facts: facts}
}

func checkKubelet(ctx context.Context, s *state) Result {
	o := s.o
	if err := o.dialUnix(ctx, o.KubeletSocket); err != nil {
		return Result{Status: Warn, Detail: fmt.Sprintf("nothing listens on %s: no kubelet on this node", o.KubeletSocket),
			Hint: "fine for containerd-only use; on a Kubernetes node start the kubelet"}
	}
	return Result{Status: Pass, Detail: "kubelet serves device plugin registration on " + o.KubeletSocket}
}

// short abbreviates a hex digest for one-line details.
func short(h string) string {
	if len(h) > 12 {
		return h[:12]
	}
	return h
}
