package vm

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/guest/api/verity"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/accel"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

// Names of the files Start creates in Spec.StateDir.
const (
	QMPSocketName   = "qmp.sock"
	AgentSocketName = "agent.sock"
	ConsoleLogName  = "console.log"
)

// AgentPortName is the virtio-serial port name of the guest agent channel;
// the guest finds it at /dev/virtio-ports/c8s.agent.
const AgentPortName = "c8s.agent"

// AgentVsockPort is the vsock port the guest agent listens on when the VM
// has a vhost-vsock device instead of the virtio-serial port.
const AgentVsockPort = 1024

// BaseKernelParams are always passed to the guest kernel, before the TEE's
// and the configured ones. The image build measures them (images/build.sh
// asks `c8s-launcher kernel-params`), so changing them changes every launch
// digest. no_timer_check skips x86's boot-time test of the IO-APIC timer IRQ
// ("Disables the code which tests for broken timer IRQ sources", kernel
// admin-guide/kernel-parameters.txt; the kernel sets it itself on Hyper-V):
// on a starved TCG vCPU that test times out and panics the guest with
// "IO-APIC + timer doesn't work!", and it only chooses timer IRQ routing, so
// skipping it has no bearing on what the guest trusts.
//
// initcall_blacklist skips (by name; "initcall X blacklisted" in the guest's
// log when it takes) boot work for tracing and BPF facilities no pod VM
// uses, none of which touches a mitigation, a key or a check the guest
// makes: trace_eval_init (enum names in trace output), init_kprobe_trace
// (the kprobe_events tracing interface), latency_fsnotify_init (latency
// tracer notifications), bpf_dummy_struct_ops_init (a struct_ops type for
// BPF self-tests) and bpf_tcp_ca_kfunc_init (kfuncs for BPF TCP congestion
// control programs). Measured under -icount with the pinned kernel
// (images/build.sh): kernel start to /init 1.59 s -> 1.28 s of guest time;
// a sealed sim pod's kernel start to the agent serving 3.21 s -> 2.80 s
// (issue 18). ftrace_check_for_weak_functions queues ftrace's scan of all
// of its ~42,000 function-entry records through kallsyms, which marks those
// left in the text by overridden weak functions as not traceable (so that
// the function tracer never lists or patches them); the boot waits for it
// at late_initcall_sync, and on the one vCPU it ran for 88 ms of guest time.
// Skipped, such a record stays enabled: the function tracer would list it
// under the name of the symbol before it and, told to trace everything,
// patch its call site in code nothing calls; nothing in a pod VM uses the
// function tracer.
// A sealed sim pod's kernel start to the agent's main under -icount, 3
// interleaved pairs: 1.315-1.364 s -> 1.219-1.244 s, to the agent serving
// 1.521-1.556 s -> 1.428-1.431 s; without -icount the scan itself took
// 58-79 ms of the guest's clock (workqueue trace, loaded machine), and the
// wall clock to the agent's main, too noisy there to show it pair by pair,
// came earlier in 6 of 8 interleaved pairs (issue 18). On SNP and TDX
// hardware the same initcalls are skipped; what that saves there was not
// measured (no such hardware here). The names are the pinned kernel's: a
// kernel bump must check that each is still reported as blacklisted, else
// it silently costs the time again.
//
// page_reporting.page_reporting_order=5 has a free page reporting device
// (the sim VM's balloon, launcher/vm/tee/sim.FreePageReporting) report free
// blocks from 128 KiB up instead of from 2 MiB (pageblock order): what the
// kernel's boot leaves free is fragmented below 2 MiB: a running busybox
// sim pod's QEMU keeps 98 MiB of guest RAM resident with it, 112 MiB with
// the default order, 134 MiB without reporting (hack/bench-memory.sh pods;
// order 0 reports no more than 5). Without such a device, as on SNP and
// TDX, the parameter does nothing.
//
// rootfstype=ramfs makes the initramfs a ramfs rather than a tmpfs (the
// kernel's choice when there is no root=; Documentation/filesystems/
// ramfs-rootfs-initramfs.rst). crun lives in the initramfs's runtime tree,
// which the first stage mounts read-only (guest/stage1), and on every call
// crun checks that its own binary cannot be written to (CVE-2019-5736;
// cloned_binary.c in crun 1.8.1). A file on a read-only mount passes, but
// any tmpfs file answers F_GET_SEALS like an unsealed memfd: on tmpfs,
// every create, start, kill and delete executed crun three times and
// copied its 1.7 MB into a sealed memfd on the way. On ramfs it runs once,
// from the same read-only mount: a sealed sim pod's runtime_create
// 338 -> 260 ms and runtime_start 123 -> 78 ms of guest time (medians of 5,
// issue 18). The first stage refuses to go on with the runtime tree on
// tmpfs (stage1).
const BaseKernelParams = "console=ttyS0 quiet panic=-1 no_timer_check " + RootfsRAMFS + " " + InitcallBlacklist + " " + PageReportingOrder

// RootfsRAMFS is BaseKernelParams' initramfs file system (see there).
const RootfsRAMFS = "rootfstype=ramfs"

// InitcallBlacklist is BaseKernelParams' initcall_blacklist (see there).
const InitcallBlacklist = "initcall_blacklist=trace_eval_init,init_kprobe_trace,latency_fsnotify_init,bpf_dummy_struct_ops_init,bpf_tcp_ca_kfunc_init,ftrace_check_for_weak_functions"

// PageReportingOrder is BaseKernelParams' free page reporting granularity
// (see there).
const PageReportingOrder = "page_reporting.page_reporting_order=5"

// QEMU device and node IDs used on the command line and over QMP.
const (
	scsiControllerID = "scsi0"
	rootDiskID       = "rootfs"
	scsiBus          = scsiControllerID + ".0"
	maxSCSITarget    = 255
	// maxIDLen is containerd's identifier limit.
	maxIDLen = 76
	// unixPathMax is sun_path's size minus the terminating NUL.
	unixPathMax = statedir.UnixPathMax
)

// Spec describes one VM.
type Spec struct {
	// ID names the VM (QEMU -name c8s-<ID>); usually the sandbox ID.
	ID string
	// StateDir holds the QMP and agent sockets and the console log (see
	// launcher/config/statedir for its name). Start creates it (0700) and writes
	// statedir.IndexFile into it; Stop removes it.
	StateDir string
	// Namespace, when the VM is a containerd pod's, is the pod's
	// namespace: Start records it with ID in statedir.IndexFile.
	Namespace string
	// DieWithParent has the kernel kill QEMU (SIGKILL) when the process
	// that started it dies. The shim sets it: a shim containerd kills
	// mid-create (a RunPodSandbox past its deadline) must not leave an
	// orphan VM that nothing knows of any more. serve does not: the VMs
	// it takes in are stopped through its API.
	DieWithParent bool
	// Hypervisor is the resolved configuration (annotations applied). The
	// VM gets DefaultVCPUs vCPUs and DefaultMemoryMiB MiB, and room to grow
	// to VCPUCapacity and MemoryCapacityMiB by hot-plug (resize.go).
	Hypervisor config.Hypervisor
	// Accel is "kvm" or "tcg" (see launcher/vm/accel).
	Accel string
	// Root, when not nil, is a sealed image's verity-protected root disk
	// (see RootFor).
	Root *RootDisk
	// Disks are cold-plugged at boot on the virtio-scsi controller, at
	// targets 0, 1, ... in order, LUN 0.
	Disks []Disk
	// VsockCID, when not zero, gives the VM a vhost-vsock device with this
	// guest CID instead of the virtio-serial agent port. Start fills it in
	// when the host has /dev/vhost-vsock.
	VsockCID uint32
	// Incoming starts QEMU as the destination of a live migration
	// (-incoming defer): the guest does not boot; its state arrives with
	// MigrateIncoming. Start then never picks vsock on its own: the
	// destination must have the source's devices.
	Incoming bool
	// NICs are virtio-net devices backed by taps the caller opened (pod
	// networking, see netdev.go).
	NICs []NetDevice
	// SharedFS, when set, adds a virtio-fs device (see sharedfs.go).
	SharedFS *SharedFS
	// VFIO are host PCI devices (confidential GPUs) cold-plugged at boot,
	// each on its own PCIe root port (see vfio.go).
	VFIO []VFIODevice
}

// Disk is a host file or block device given to the guest as a SCSI disk.
type Disk struct {
	// ID is the caller's name for the disk, unique within the VM.
	ID string
	// Path is the host file or block device.
	Path string
	// ReadOnly makes the disk read-only for the guest.
	ReadOnly bool
}

// DiskAddress is where the guest finds a disk on the virtio-scsi bus:
// /sys/bus/scsi/devices/<host>:0:<Target>:<LUN>.
type DiskAddress struct {
	Target, LUN int
}

// Args returns the complete QEMU argv (argv[0] is Hypervisor.Path as
// configured) for spec with the given TEE backend. It does not touch the
// file system.
func Args(spec Spec, backend tee.Backend) ([]string, error) {
	if backend == nil {
		return nil, errors.New("vm: no TEE backend")
	}
	if err := checkSpec(spec); err != nil {
		return nil, err
	}
	h := spec.Hypervisor
	pieces, err := backend.QEMU(h)
	if err != nil {
		return nil, err
	}
	vfio, err := vfioArgs("q35", h, spec.VFIO)
	if err != nil {
		return nil, err
	}
	if pieces.RequiresKVM && spec.Accel != "kvm" {
		return nil, fmt.Errorf("tee %s needs KVM but the accelerator is %s: set hypervisor.accel = \"kvm\" on a host with %s support", backend.Name(), spec.Accel, backend.Name())
	}
	for _, name := range pieces.Ports {
		if err := checkSocket(spec.StateDir, portSocket(spec.StateDir, name)); err != nil {
			return nil, err
		}
	}

	fsMachine, fsArgs := sharedFSArgs(spec.SharedFS, pieces.MachineOptions, h.DefaultMemoryMiB)
	machine := append(append([]string{"q35"}, pieces.MachineOptions...), fsMachine...)
	argv := []string{
		h.Path,
		"-name", "c8s-" + spec.ID,
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-machine", strings.Join(machine, ","),
		"-accel", accel.Option(spec.Accel),
	}
	if spec.Accel == "kvm" {
		argv = append(argv, "-cpu", "host")
	}
	argv = append(argv, "-m", memoryOption(h), "-smp", smpOption(h))
	if pieces.Firmware != "" {
		argv = append(argv, "-bios", pieces.Firmware)
	}
	params := []string{BaseKernelParams}
	if spec.Root != nil {
		// Right after the base parameters: the image build measures this
		// prefix (images/build.sh, manifest cmdline).
		params = append(params, spec.Root.KernelParams...)
	}
	// The TEE's own (c8s.tee=<name>): the image build measures each TEE's
	// command line as the prefix above followed by these.
	params = append(params, pieces.KernelParams...)
	if p := strings.TrimSpace(h.KernelParams); p != "" {
		params = append(params, p)
	}
	argv = append(argv,
		"-kernel", h.Kernel,
		"-initrd", h.Initrd,
		"-append", strings.Join(params, " "),
		"-serial", "file:"+filepath.Join(spec.StateDir, ConsoleLogName),
		"-qmp", "unix:"+filepath.Join(spec.StateDir, QMPSocketName)+",server=on,wait=off",
	)
	argv = append(argv, pieces.Args...)
	if spec.Incoming {
		argv = append(argv, "-incoming", "defer")
	}

	if spec.Root != nil {
		// The first (only) virtio-blk disk: /dev/vda in the guest.
		argv = append(argv, rootDiskArgs(rootDiskID, spec.Root.Path)...)
	}
	argv = append(argv, rngArgs("rng0", spec.Accel)...)
	argv = append(argv, scsiControllerArgs(scsiControllerID, spec.Accel)...)
	if spec.VsockCID != 0 {
		argv = append(argv, vsockArgs("vsock0", spec.VsockCID)...)
	}
	if spec.VsockCID == 0 || len(pieces.Ports) > 0 {
		ports := len(pieces.Ports)
		if spec.VsockCID == 0 {
			ports++ // the agent's
		}
		argv = append(argv, virtioSerialArgs("serial0", ports, spec.Accel)...)
	}
	for i, name := range pieces.Ports {
		argv = append(argv, serialPortArgs("serial0.0", fmt.Sprintf("port%d", i), fmt.Sprintf("charport%d", i),
			portSocket(spec.StateDir, name), name)...)
	}
	if spec.VsockCID == 0 {
		argv = append(argv, serialPortArgs("serial0.0", "agent0", "charagent0",
			filepath.Join(spec.StateDir, AgentSocketName), AgentPortName)...)
	}
	for i, d := range spec.Disks {
		bd, err := json.Marshal(blockdevOptions(d, i))
		if err != nil {
			return nil, err
		}
		argv = append(argv, "-blockdev", string(bd), "-device", scsiDeviceOption(i))
	}
	argv = append(argv, netArgs(spec.NICs)...)
	argv = append(argv, fsArgs...)
	argv = append(argv, vfio...)
	return argv, nil
}

// portSocket is the unix socket backing the virtio-serial port name.
func portSocket(stateDir, name string) string {
	return filepath.Join(stateDir, name+".sock")
}

func checkSpec(spec Spec) error {
	h := spec.Hypervisor
	var errs []error
	if !validID(spec.ID) {
		errs = append(errs, fmt.Errorf("vm: ID %q must be 1-%d letters, digits, '-', '_' or '.'", spec.ID, maxIDLen))
	}
	if !filepath.IsAbs(spec.StateDir) || strings.ContainsAny(spec.StateDir, ",\n") {
		errs = append(errs, fmt.Errorf("vm: state dir %q must be an absolute path without commas", spec.StateDir))
	} else if err := checkSocket(spec.StateDir, filepath.Join(spec.StateDir, AgentSocketName)); err != nil {
		errs = append(errs, err) // the agent's is longer than the QMP socket
	}
	if spec.Accel != "kvm" && spec.Accel != "tcg" {
		errs = append(errs, fmt.Errorf("vm: accelerator %q must be kvm or tcg (resolve \"auto\" with launcher/vm/accel first)", spec.Accel))
	}
	if h.Path == "" {
		errs = append(errs, errors.New("vm: hypervisor.path is empty"))
	}
	if h.Kernel == "" || h.Initrd == "" {
		errs = append(errs, errors.New("vm: hypervisor.kernel and hypervisor.initrd must be set (run `make image`)"))
	}
	if _, ok, _ := teeparam.FromCmdline(h.KernelParams); ok {
		// Given twice, the guest refuses to guess its TEE; given once, it
		// would contradict hypervisor.tee.
		errs = append(errs, fmt.Errorf("vm: hypervisor.kernel_params %q sets %s: the TEE backend sets it from hypervisor.tee", h.KernelParams, teeparam.Key))
	}
	for _, f := range strings.Fields(h.KernelParams) {
		if k, _, _ := strings.Cut(f, "="); verity.IsParam(k) {
			// The guest refuses a root parameter given twice.
			errs = append(errs, fmt.Errorf("vm: hypervisor.kernel_params sets %s: the image's manifest gives the dm-verity root's parameters", k))
		}
	}
	if h.DefaultVCPUs == 0 || h.DefaultMemoryMiB == 0 {
		errs = append(errs, errors.New("vm: default_vcpus and default_memory must be positive"))
	}
	if why := h.HotplugRefusal(); why != "" && (h.VCPUCapacity() > h.DefaultVCPUs || h.MemoryCapacityMiB() > h.DefaultMemoryMiB) {
		errs = append(errs, fmt.Errorf("vm: hypervisor.default_maxvcpus or default_maxmemory: %s", why))
	}
	if len(spec.Disks) > maxSCSITarget+1 {
		errs = append(errs, fmt.Errorf("vm: %d disks, at most %d", len(spec.Disks), maxSCSITarget+1))
	}
	if err := checkNetDevices(spec.NICs); err != nil {
		errs = append(errs, err)
	}
	if err := checkSharedFS(spec.SharedFS); err != nil {
		errs = append(errs, err)
	}
	if r := spec.Root; r != nil && (!filepath.IsAbs(r.Path) || strings.ContainsAny(r.Path, ",\n")) {
		errs = append(errs, fmt.Errorf("vm: root disk %q must be an absolute path without commas", r.Path))
	}
	seen := map[string]bool{}
	for _, d := range spec.Disks {
		if err := checkDisk(d); err != nil {
			errs = append(errs, err)
		}
		if seen[d.ID] {
			errs = append(errs, fmt.Errorf("vm: disk ID %q used twice", d.ID))
		}
		seen[d.ID] = true
	}
	return errors.Join(errs...)
}

// checkSocket fails when the unix socket sock in the state dir stateDir
// has too long a path.
func checkSocket(stateDir, sock string) error {
	if n := len(sock); n > unixPathMax {
		return fmt.Errorf("vm: state dir %q is too long for unix sockets (%s: %d > %d bytes): use a shorter runtime.state_dir (at most %d bytes)",
			stateDir, filepath.Base(sock), n, unixPathMax, statedir.MaxRoot)
	}
	return nil
}

func checkDisk(d Disk) error {
	if d.ID == "" {
		return fmt.Errorf("vm: disk %q has no ID", d.Path)
	}
	if !filepath.IsAbs(d.Path) {
		return fmt.Errorf("vm: disk %q: path %q must be absolute", d.ID, d.Path)
	}
	return nil
}

func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return false
		}
	}
	return true
}

// nodeName and deviceID derive QEMU identifiers from the SCSI target, so
// callers' disk IDs never need to be valid QEMU identifiers.
func nodeName(target int) string { return fmt.Sprintf("disk%d", target) }
func deviceID(target int) string { return fmt.Sprintf("scsidisk%d", target) }

// blockdevOptions is the -blockdev / blockdev-add argument for a raw disk.
func blockdevOptions(d Disk, target int) map[string]any {
	return map[string]any{
		"driver":    "raw",
		"node-name": nodeName(target),
		"read-only": d.ReadOnly,
		"file": map[string]any{
			"driver":    "file",
			"filename":  d.Path,
			"read-only": d.ReadOnly,
		},
	}
}

// scsiDeviceOption is the -device argument for a cold-plugged disk. govmm's
// BlockDevice only renders virtio-blk style -drive devices, so scsi-hd on
// the controller is rendered here (and as device_add arguments for hotplug).
func scsiDeviceOption(target int) string {
	return fmt.Sprintf("scsi-hd,bus=%s,channel=0,scsi-id=%d,lun=0,drive=%s,id=%s", scsiBus, target, nodeName(target), deviceID(target))
}
