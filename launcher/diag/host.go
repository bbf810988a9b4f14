package diag

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// cpuFlags returns the flags of the first CPU in /proc/cpuinfo.
func (o *Options) cpuFlags() (map[string]bool, error) {
	data, err := o.readFile("/proc/cpuinfo")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "flags" {
			flags := map[string]bool{}
			for _, f := range strings.Fields(v) {
				flags[f] = true
			}
			return flags, nil
		}
	}
	return nil, fmt.Errorf("/proc/cpuinfo has no flags line")
}

// kvmModules lists the loaded KVM modules.
func (o *Options) kvmModules() []string {
	var mods []string
	for _, m := range []string{"kvm_intel", "kvm_amd", "kvm_pvm"} {
		if o.exists("/sys/module/" + m) {
			mods = append(mods, m)
		}
	}
	return mods
}

func checkCPU(_ context.Context, s *state) Result {
	o := s.o
	flags, err := o.cpuFlags()
	if err != nil {
		return Result{Status: o.severity("snp", "tdx"), Detail: "cannot read CPU flags: " + err.Error(),
			Hint: "run on Linux with /proc mounted"}
	}
	facts := map[string]string{}
	for _, f := range []string{"vmx", "svm", "hypervisor", "sev", "sev_es", "sev_snp", "tdx_host_platform"} {
		facts[f] = strconv.FormatBool(flags[f])
	}
	switch {
	case flags["vmx"]:
		return Result{Status: Pass, Detail: "Intel VT-x (vmx) present", Facts: facts}
	case flags["svm"]:
		return Result{Status: Pass, Detail: "AMD-V (svm) present", Facts: facts}
	}
	detail := "no vmx or svm flag: the CPU offers no hardware virtualization to this host"
	if flags["hypervisor"] {
		detail += " (it runs as a guest itself)"
	}
	if mods := o.kvmModules(); len(mods) > 0 {
		detail += "; KVM here comes from " + strings.Join(mods, ", ")
	}
	return Result{Status: o.severity("snp", "tdx"), Detail: detail, Facts: facts,
		Hint: "enable VT-x/AMD-V in the BIOS, or nested virtualization on the VM host; without it sim pod VMs run under TCG and SNP/TDX cannot run"}
}

func checkKVMDevice(_ context.Context, s *state) Result {
	o := s.o
	mods := o.kvmModules()
	facts := map[string]string{"modules": strings.Join(mods, ",")}
	if !o.exists("/dev/kvm") {
		return Result{Status: o.severity("snp", "tdx"), Detail: "/dev/kvm does not exist: pod VMs run under TCG", Facts: facts,
			Hint: "load kvm_intel or kvm_amd (modprobe kvm_intel / kvm_amd) after enabling virtualization in the BIOS"}
	}
	detail := "/dev/kvm present"
	if len(mods) > 0 {
		detail += " (" + strings.Join(mods, ", ") + ")"
	}
	return Result{Status: Pass, Detail: detail, Facts: facts}
}

func checkKVMProbe(ctx context.Context, s *state) Result {
	o := s.o
	needKVM := o.severity("snp", "tdx")
	if !o.exists("/dev/kvm") {
		return Result{Status: needKVM, Detail: "not probed: /dev/kvm does not exist",
			Hint: "see kvm.device"}
	}
	if o.Probe == nil {
		return Result{Status: Warn, Detail: "not probed: the probe boots a VM and runs only on the live host",
			Hint: "run c8s-launcher check on the node itself"}
	}
	qemu := s.qemuPath()
	if qemu == "" {
		return Result{Status: needKVM, Detail: "not probed: QEMU is missing", Hint: "see qemu.binary"}
	}
	kernel := o.Config.Hypervisor.Kernel
	if kernel == "" && o.exists(o.ImageDir+"/vmlinuz") {
		kernel = o.ImageDir + "/vmlinuz"
	}
	if kernel == "" || !o.exists(kernel) {
		return Result{Status: Warn, Detail: fmt.Sprintf("not probed: no guest kernel to boot (hypervisor.kernel %q)", kernel),
			Hint: "install the guest image (c8s-launcher install) or set hypervisor.kernel"}
	}
	cache := o.Config.CachePath()
	if o.NoCache {
		cache = ""
	}
	res, err := o.Probe(ctx, o.path(qemu), o.path(kernel), cache)
	if err != nil {
		return Result{Status: needKVM, Detail: "probe could not run: " + err.Error(),
			Hint: "check that QEMU and the guest kernel work: c8s-launcher probe-accel --no-cache"}
	}
	facts := map[string]string{"accel": res.Accel, "cached": strconv.FormatBool(res.Cached)}
	detail := res.Reason
	if res.Cached {
		detail += " (cached result; --no-cache probes again)"
	}
	if res.Accel == "kvm" {
		return Result{Status: Pass, Detail: detail, Facts: facts}
	}
	hint := "KVM does not run guests here: sim pod VMs fall back to TCG (slow); fix nested virtualization or use a bare-metal host"
	if needKVM == Fail {
		hint = "SNP and TDX need working KVM: use a bare-metal host with the TEE enabled"
	}
	return Result{Status: needKVM, Detail: detail, Facts: facts, Hint: hint}
}

// misc reads the root misc cgroup's capacity and usage of resource key.
// ok is false when the host has no misc controller or no such resource.
func (o *Options) misc(key string) (capacity, current int64, ok bool) {
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/misc"} {
		capData, err := o.readFile(dir + "/misc.capacity")
		if err != nil {
			continue
		}
		capacity, ok = flatKey(string(capData), key)
		if !ok {
			return 0, 0, false
		}
		if curData, err := o.readFile(dir + "/misc.current"); err == nil {
			current, _ = flatKey(string(curData), key)
		}
		return capacity, current, true
	}
	return 0, 0, false
}

// flatKey reads key from a cgroup flat-keyed file ("key value" lines).
func flatKey(data, key string) (int64, bool) {
	for _, line := range strings.Split(data, "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == key {
			n, err := strconv.ParseInt(f[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// moduleParam reports whether a boolean module parameter is on.
func (o *Options) moduleParam(module, param string) (on, present bool) {
	data, err := o.readFile("/sys/module/" + module + "/parameters/" + param)
	if err != nil {
		return false, false
	}
	v := strings.TrimSpace(string(data))
	return v == "Y" || v == "1", true
}

// problem is one missing piece of a host enablement check, with its fix.
type problem struct{ what, hint string }

func enablement(s *state, tee string, probs []problem, ok string, facts map[string]string) Result {
	if len(probs) == 0 {
		return Result{Status: Pass, Detail: ok, Facts: facts}
	}
	whats := make([]string, len(probs))
	for i, p := range probs {
		whats[i] = p.what
	}
	detail := strings.Join(whats, "; ")
	if s.o.TEE != tee {
		detail += fmt.Sprintf(" (needed only for tee=%s)", tee)
	}
	return Result{Status: s.o.severity(tee), Detail: detail, Hint: probs[0].hint, Facts: facts}
}

func checkSNPHost(_ context.Context, s *state) Result {
	o := s.o
	var probs []problem
	facts := map[string]string{}
	on, present := o.moduleParam("kvm_amd", "sev_snp")
	facts["kvm_amd.sev_snp"] = strconv.FormatBool(on)
	if !on {
		what := "kvm_amd is not loaded"
		if present {
			what = "kvm_amd sev_snp is off"
		}
		probs = append(probs, problem{what, "enable SEV-SNP (and SMEE/RMP) in the BIOS and load kvm_amd with sev_snp=1 on a 6.11+ host kernel"})
	}
	if !o.exists("/dev/sev") {
		probs = append(probs, problem{"/dev/sev is missing", "load the ccp module with the AMD SEV firmware available (modprobe ccp)"})
	}
	free := ""
	if capacity, current, ok := o.misc("sev_es"); ok {
		facts["sev_es_asids"], facts["sev_es_asids_used"] = strconv.FormatInt(capacity, 10), strconv.FormatInt(current, 10)
		free = fmt.Sprintf("%d of %d SEV-ES ASIDs free", capacity-current, capacity)
		if capacity-current <= 0 {
			probs = append(probs, problem{"no free SEV-ES ASIDs (" + free + ")", "stop other SEV guests, or raise the SEV-ES ASID count in the BIOS (SEV-ES minimum ASID)"})
		}
	} else {
		probs = append(probs, problem{"no sev_es resource in the misc cgroup's misc.capacity", "SNP needs SEV-ES ASIDs: enable SEV-ES in the BIOS and mount cgroup v2 (or the misc controller)"})
	}
	return enablement(s, "snp", probs, "kvm_amd sev_snp on, /dev/sev present, "+free, facts)
}

func checkTDXHost(ctx context.Context, s *state) Result {
	o := s.o
	var probs []problem
	facts := map[string]string{}
	on, present := o.moduleParam("kvm_intel", "tdx")
	facts["kvm_intel.tdx"] = strconv.FormatBool(on)
	if !on {
		what := "kvm_intel is not loaded"
		if present {
			what = "kvm_intel tdx is off"
		}
		probs = append(probs, problem{what, "enable TDX in the BIOS and load kvm_intel with tdx=1 on a 6.16+ host kernel"})
	}
	free := ""
	if capacity, current, ok := o.misc("tdx"); ok {
		facts["tdx_keys"], facts["tdx_keys_used"] = strconv.FormatInt(capacity, 10), strconv.FormatInt(current, 10)
		free = fmt.Sprintf("%d of %d TDX keys free", capacity-current, capacity)
		if capacity-current <= 0 {
			probs = append(probs, problem{"no free TDX keys (" + free + ")", "stop other TDs, or assign more keys to TDX in the BIOS"})
		}
	} else {
		probs = append(probs, problem{"no tdx resource in the misc cgroup's misc.capacity", "the host kernel does not manage TDX keys: use a 6.16+ kernel with TDX host support"})
	}
	qgs := o.Config.Hypervisor.TDX.QuoteGenerationSocket
	if qgs == "" {
		qgs = DefaultQGSSocket
	}
	facts["qgs"] = qgs
	qgsOK := "QGS " + qgs + " reachable"
	if strings.HasPrefix(qgs, "vsock:") {
		qgsOK = "QGS at " + qgs + " (not checked: vsock)"
	} else if err := o.dialUnix(ctx, qgs); err != nil {
		probs = append(probs, problem{"quote generation service socket " + qgs + " is not reachable", "start the Intel DCAP quote generation service (qgsd) or set hypervisor.tdx.quote_generation_socket"})
	}
	return enablement(s, "tdx", probs, "kvm_intel tdx on, "+free+", "+qgsOK, facts)
}
