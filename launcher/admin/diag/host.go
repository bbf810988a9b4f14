package diag

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/c8s-dev/c8s/launcher/node/discovery"
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
	switch {
	case needKVM == Fail:
		hint = "SNP and TDX need working KVM: use a bare-metal host with the TEE enabled"
	case o.Config.Hypervisor.Accel == "kvm":
		// The configuration forces KVM: pod VMs would hang or fail.
		return Result{Status: Fail, Detail: detail + "; but hypervisor.accel is \"kvm\"", Facts: facts,
			Hint: "set hypervisor.accel = \"auto\" (falls back to TCG) or \"tcg\""}
	}
	return Result{Status: needKVM, Detail: detail, Facts: facts, Hint: hint}
}

// discover runs launcher/node/discovery once for the SNP and TDX checks.
func (s *state) discover() (*discovery.Result, error) {
	if s.disc == nil && s.discErr == nil {
		opts := discovery.ConfigOptions(&s.o.Config)
		opts.Root = s.o.Root
		r, err := discovery.Discover(opts)
		s.disc, s.discErr = &r, err
	}
	return s.disc, s.discErr
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

// capacityProblems checks that capacity c (of unit, facts under factKey)
// has free units, and describes how many.
func capacityProblems(facts map[string]string, c discovery.Capacity, unit, factKey, exhaustedHint, unknownHint string) (string, []problem) {
	if !c.Known {
		return "", []problem{{"the number of " + unit + " is unknown", unknownHint}}
	}
	facts[factKey] = strconv.FormatInt(c.Total, 10)
	if !c.UsedKnown {
		return fmt.Sprintf("%d %s", c.Total, unit), nil
	}
	facts[factKey+"_used"] = strconv.FormatInt(c.Used, 10)
	free := fmt.Sprintf("%d of %d %s free", c.Total-c.Used, c.Total, unit)
	if c.Total-c.Used <= 0 {
		return free, []problem{{"no free " + unit + " (" + free + ")", exhaustedHint}}
	}
	return free, nil
}

func checkSNPHost(_ context.Context, s *state) Result {
	d, err := s.discover()
	if err != nil {
		return Result{Status: s.o.severity("snp"), Detail: "cannot inspect the host: " + s.o.unroot(err.Error()), Hint: "run as root on the node"}
	}
	snp := d.SNP
	facts := map[string]string{"enabled": strconv.FormatBool(snp.Enabled)}
	if snp.Firmware != "" {
		facts["sev_firmware"] = snp.Firmware
	}
	if !snp.Enabled {
		return enablement(s, "snp", []problem{{snp.Reason, "enable SEV-SNP (SMEE, RMP) in the BIOS, load kvm_amd with sev_snp=1 on a 6.11+ host kernel and the ccp driver"}}, "", facts)
	}
	free, probs := capacityProblems(facts, snp.ASIDs, "SEV-ES ASIDs", "sev_es_asids",
		"stop other SEV guests, or raise the SEV-ES ASID count in the BIOS (SEV-ES minimum ASID)",
		"mount the misc cgroup (cgroup v2) so that SEV-ES ASIDs can be counted")
	return enablement(s, "snp", probs, snp.Reason+", "+free, facts)
}

func checkTDXHost(ctx context.Context, s *state) Result {
	o := s.o
	d, err := s.discover()
	if err != nil {
		return Result{Status: o.severity("tdx"), Detail: "cannot inspect the host: " + o.unroot(err.Error()), Hint: "run as root on the node"}
	}
	tdx := d.TDX
	facts := map[string]string{"enabled": strconv.FormatBool(tdx.Enabled)}
	var probs []problem
	free := ""
	if !tdx.Enabled {
		probs = append(probs, problem{tdx.Reason, "enable TDX in the BIOS and load kvm_intel with tdx=1 on a 6.16+ host kernel"})
	} else {
		var more []problem
		free, more = capacityProblems(facts, tdx.Keys, "TDX keys", "tdx_keys",
			"stop other TDs, or assign more keys to TDX in the BIOS",
			"the host kernel does not count TDX keys: use a 6.16+ kernel with TDX host support")
		probs = append(probs, more...)
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
	return enablement(s, "tdx", probs, tdx.Reason+", "+free+", "+qgsOK, facts)
}
