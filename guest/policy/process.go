package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
)

// MinOOMScoreAdj is the lowest process.oomScoreAdj a container may have:
// the kubelet's for a pod's sandbox. Lower (-999, -1000: never killed),
// the guest's OOM killer would take the agent before the container.
const MinOOMScoreAdj = -998

// schedulers are the process.scheduler policies a container may have:
// not the real-time ones (SCHED_FIFO, SCHED_RR, SCHED_DEADLINE), which
// starve the agent of the VM's CPUs.
var schedulers = []specs.LinuxSchedulerPolicy{specs.SchedOther, specs.SchedBatch, specs.SchedIdle}

// ioClasses are the process.ioPriority classes a container may have: not
// IOPRIO_CLASS_RT, which starves the agent's I/O.
var ioClasses = []specs.IOPriorityClass{specs.IOPRIO_CLASS_BE, specs.IOPRIO_CLASS_IDLE}

// capabilities checks process.capabilities against the rule. The
// bounding, effective and permitted sets are bounded by it; the
// inheritable and ambient sets are refused outright: containerd sets
// neither (no inheritable set since CVE-2022-24769), and an ambient set
// gives its capabilities to a process that is not root, past the uid
// the rule pins (crun raises them at exec, noNewPrivileges or not).
func (k *checker) capabilities(rule *policyapi.Container, c *specs.LinuxCapabilities) {
	if c == nil {
		return // none: crun and runc start the process with none
	}
	allowed := rule.AllowedCapabilities()
	for _, set := range []struct {
		name string
		caps []string
	}{{"bounding", c.Bounding}, {"effective", c.Effective}, {"permitted", c.Permitted}} {
		var extra, hints []string
		for _, capName := range set.caps {
			if !slices.Contains(allowed, capName) && !slices.Contains(extra, capName) {
				extra = append(extra, capName)
				if h := capHints[capName]; h != "" {
					hints = append(hints, h)
				}
			}
		}
		if len(extra) > 0 {
			d := k.deny("process.capabilities."+set.name, quoted(extra), k.key+".capabilities", listed(allowed))
			d.Hint = strings.Join(hints, "; ")
			if rule.Capabilities == nil && !rule.Privileged {
				d.Expected += " (containerd's defaults: the rule lists none)"
			}
		}
	}
	for _, set := range []struct {
		name string
		caps []string
	}{{"inheritable", c.Inheritable}, {"ambient", c.Ambient}} {
		if len(set.caps) > 0 {
			d := k.deny("process.capabilities."+set.name, quoted(set.caps), "", "none")
			d.Reason = "never allowed"
			d.Hint = "inheritable and ambient capabilities survive execve: a process that is not root would keep them (CAP_SETUID: root; CAP_DAC_OVERRIDE: every file)"
		}
	}
}

// execHeld holds an exec's process to what the container's was created
// with where containerd's CRI copies it unchanged into each exec: each
// capability set within the container's, no_new_privileges if the
// container's had it, and the container's supplementary groups where
// the rule does not pin them (additional_gids). An exec is then no more
// than another process of the container; its cwd, uid and gid are
// Exec's.
func (k *checker) execHeld(c *Container, p *specs.Process) {
	if p.Capabilities != nil {
		var own specs.LinuxCapabilities
		if c.caps != nil {
			own = *c.caps
		}
		for _, set := range []struct {
			name      string
			exec, own []string
		}{{"bounding", p.Capabilities.Bounding, own.Bounding}, {"effective", p.Capabilities.Effective, own.Effective}, {"permitted", p.Capabilities.Permitted, own.Permitted}} {
			var extra []string
			for _, capName := range set.exec {
				if !slices.Contains(set.own, capName) && !slices.Contains(extra, capName) {
					extra = append(extra, capName)
				}
			}
			if len(extra) > 0 {
				d := k.deny("process.capabilities."+set.name, quoted(extra), "", "within the container's: "+listed(set.own))
				d.Reason = "not the container's"
				d.Hint = "an exec runs with the capabilities its container was created with"
			}
		}
	}
	if c.noNewPrivileges && !p.NoNewPrivileges {
		d := k.deny("process.noNewPrivileges", "false", "", "true (the container's)")
		d.Reason = "not the container's"
		d.Hint = "without it a setuid file in the container's image runs as its owner"
	}
	if c.rule.AdditionalGIDs == nil && !sameSet(p.User.AdditionalGids, c.user.AdditionalGids) {
		d := k.deny("process.user.additionalGids", fmt.Sprint(p.User.AdditionalGids), k.key+".additional_gids", fmt.Sprint(c.user.AdditionalGids)+" (the container's; the rule has no additional_gids)")
		d.Hint = "a supplementary group opens what that group owns: files in the image, and the pod's shared volumes"
	}
}

// limits checks what process adds to the user, args and capabilities:
// the umask, the resource limits, the OOM score, the scheduler and the
// I/O priority, for a container's process and an exec's alike.
func (k *checker) limits(rule *policyapi.Container, p *specs.Process) {
	umask := uint32(policyapi.DefaultUmask)
	if p.User.Umask != nil {
		umask = *p.User.Umask
	}
	switch {
	case rule.Umask != nil && umask != *rule.Umask:
		k.deny("process.user.umask", fmt.Sprintf("%#o", umask), k.key+".umask", fmt.Sprintf("%#o", *rule.Umask))
	case rule.Umask == nil && umask&policyapi.DefaultUmask != policyapi.DefaultUmask:
		d := k.deny("process.user.umask", fmt.Sprintf("%#o", umask), k.key+".umask", fmt.Sprintf("%#o or stricter (the rule has no umask)", policyapi.DefaultUmask))
		d.Hint = "files the process creates would be writable by other users: in an emptyDir, by the pod's other containers"
	}
	allowed := rule.AllowedRlimits()
	var bounds []string
	for _, r := range allowed {
		bounds = append(bounds, fmt.Sprintf("%s ≤ %d", r.Type, r.Max))
	}
	for i, r := range p.Rlimits {
		if r.Type == "RLIMIT_CORE" && r.Hard == 0 && r.Soft == 0 {
			continue // guest/spec's own
		}
		field := fmt.Sprintf("process.rlimits[%d]", i)
		actual := fmt.Sprintf("%s soft %d hard %d", r.Type, r.Soft, r.Hard)
		j := slices.IndexFunc(allowed, func(a policyapi.Rlimit) bool { return a.Type == r.Type })
		switch {
		case r.Soft > r.Hard:
			k.deny(field, actual, "", "").Reason = "soft above hard"
		case j < 0:
			d := k.deny(field, actual, k.key+".rlimits", strings.Join(bounds, ", "))
			d.Hint = "a limit the rule does not bound: raised, RLIMIT_MEMLOCK, RLIMIT_NPROC or RLIMIT_RTPRIO let a container take the VM from the agent, and RLIMIT_STACK unlimited weakens its address space randomization"
			if rule.Rlimits == nil {
				d.Expected += " (the defaults: the rule lists none)"
			}
		case r.Hard > allowed[j].Max:
			k.deny(field, actual, k.key+".rlimits", fmt.Sprintf("hard ≤ %d", allowed[j].Max)).Reason = "above the bound"
		}
	}
	if a := p.OOMScoreAdj; a != nil && *a < MinOOMScoreAdj {
		d := k.deny("process.oomScoreAdj", strconv.Itoa(*a), "", fmt.Sprintf("%d to 1000", MinOOMScoreAdj))
		d.Reason = "below the kubelet's lowest"
		d.Hint = "the guest's OOM killer would take the agent before the container"
	}
	if s := p.Scheduler; s != nil {
		if !slices.Contains(schedulers, s.Policy) || s.Nice < 0 || s.Priority != 0 {
			d := k.deny("process.scheduler", fmt.Sprintf("%s nice %d priority %d", s.Policy, s.Nice, s.Priority), "", "SCHED_OTHER, SCHED_BATCH or SCHED_IDLE, nice ≥ 0, priority 0")
			d.Reason = "never allowed"
			d.Hint = "a real-time or raised priority starves the agent of the VM's CPUs"
		}
	}
	if io := p.IOPriority; io != nil && !slices.Contains(ioClasses, io.Class) {
		d := k.deny("process.ioPriority.class", string(io.Class), "", "IOPRIO_CLASS_BE, IOPRIO_CLASS_IDLE")
		d.Reason = "never allowed"
		d.Hint = "real-time I/O starves the agent's"
	}
}

// linux checks the parts of linux no rule names but the user namespace:
// they are refused whatever the rule.
func (k *checker) linux(rule *policyapi.Container, s *specs.Spec) {
	l := s.Linux
	if l == nil {
		return
	}
	never := func(field, actual, hint string) {
		d := k.deny(field, actual, "", "")
		d.Reason, d.Hint = "never allowed", hint
	}
	userNS := slices.ContainsFunc(l.Namespaces, func(ns specs.LinuxNamespace) bool { return ns.Type == specs.UserNamespace })
	mapped := len(l.UIDMappings) > 0 || len(l.GIDMappings) > 0
	for _, m := range s.Mounts {
		mapped = mapped || len(m.UIDMappings) > 0 || len(m.GIDMappings) > 0
	}
	if !rule.UserNamespace && (userNS || mapped) {
		d := k.deny("linux.namespaces.user", fmt.Sprintf("user namespace %v, id mappings %v", userNS, mapped), k.key+".user_namespace", "")
		d.Hint = "the id mappings decide which guest user the rule's uid is, and a user namespace gives the container capabilities over the kernel's namespaced interfaces (hostUsers: false needs user_namespace = true)"
	}
	if rule.UserNamespace {
		k.rootMapped("linux.uidMappings", l.UIDMappings)
		k.rootMapped("linux.gidMappings", l.GIDMappings)
		for i, m := range s.Mounts {
			k.rootMapped(fmt.Sprintf("mounts[%d].uidMappings", i), m.UIDMappings)
			k.rootMapped(fmt.Sprintf("mounts[%d].gidMappings", i), m.GIDMappings)
		}
	}
	if len(l.TimeOffsets) > 0 {
		clocks := make([]string, 0, len(l.TimeOffsets))
		for c := range l.TimeOffsets {
			clocks = append(clocks, c)
		}
		slices.Sort(clocks)
		never("linux.timeOffsets", quoted(clocks), "the host would move the container's monotonic and boot clocks: timeouts, leases and token lifetimes measured on them")
	}
	if p := l.Personality; p != nil && (p.Domain != specs.PerLinux || len(p.Flags) > 0) {
		never("linux.personality", fmt.Sprintf("%s %v", p.Domain, p.Flags), "a personality changes what the kernel gives the process (32-bit uname, flags such as ADDR_NO_RANDOMIZE, which turns off address space randomization)")
	}
	if l.IntelRdt != nil {
		never("linux.intelRdt", fmt.Sprintf("%q", l.IntelRdt.ClosID), "cache and memory-bandwidth partitions are the host's to share out, not a container's")
	}
}

// rootMapped refuses an id mapping that maps the guest's root (id 0).
func (k *checker) rootMapped(field string, ms []specs.LinuxIDMapping) {
	for i, m := range ms {
		if m.Size > 0 && uint64(m.HostID) <= 0 && 0 < uint64(m.HostID)+uint64(m.Size) {
			d := k.deny(fmt.Sprintf("%s[%d]", field, i), fmt.Sprintf("%d→%d size %d", m.ContainerID, m.HostID, m.Size), k.key+".user_namespace", "mappings above the guest's root")
			d.Reason = "maps the guest's root (id 0)"
			d.Hint = "the container's user would own the guest's files as root"
		}
	}
}
