package spec

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// What the guest forces or refuses in every spec and exec process,
// whatever the pod's policy (and under none): from the host of a
// confidential VM these settings only ever serve an attack.
//
//   - Core dumps: RLIMIT_CORE is 0, soft and hard, for the container's
//     process and for every exec (forceNoCore). A process the host makes
//     crash (SIGQUIT, SIGSEGV) would otherwise write its memory, secrets
//     included, to its working directory, which may be a writable disk or
//     share the host reads. The guest's core_pattern (guest/initsys)
//     discards dumps as well.
//   - Annotations: only the CRI's (io.kubernetes.cri.*, by which the
//     pod's policy names containers; guest/policy) reach the OCI runtime.
//     crun acts on run.oci.* ones (run.oci.seccomp.receiver sends the
//     seccomp notify fd to a socket of the host's choice,
//     run.oci.pidfd_receiver the init's pidfd, run.oci.keep_original_groups
//     keeps the runtime's own groups), runc on org.opencontainers.runc.*.
//   - Seccomp: the notify listener (linux.seccomp.listenerPath,
//     listenerMetadata) is dropped, and the actions SCMP_ACT_NOTIFY (a
//     process outside the container decides the syscalls' results),
//     SCMP_ACT_TRACE (a tracer does) and SCMP_ACT_ERRNO with errnoRet 0
//     (the syscall is skipped and reports success: setuid, setgroups or
//     capset that "succeed" without dropping anything) are refused with
//     a ForbiddenError naming the field, under a [policy] or not, audit
//     mode included.
//   - linux.rootfsPropagation is "rprivate", whatever the host wrote: no
//     mount made in the guest after the container started propagates into
//     it ("rslave", runc's default, would let it), and none of the
//     container's propagates out ("shared", "rshared"). The agent mounts
//     nothing into running containers.
//   - Host files passed by value keep only their read and write
//     permission bits (no setuid, setgid, sticky or execute bit), and
//     their binds are nosuid, nodev, noexec (adaptMounts).

// criAnnotationPrefix marks the annotations kept: containerd's CRI ones.
const criAnnotationPrefix = "io.kubernetes.cri."

// rootfsPropagation is the rootfs propagation of every container.
const rootfsPropagation = "rprivate"

// hostFilePerm are the permission bits a guest copy of a host file keeps.
const hostFilePerm = 0o666

// hostFileBindOptions are added to every bind of a host file.
var hostFileBindOptions = []string{"nosuid", "nodev", "noexec"}

// forceNoCore returns rl with RLIMIT_CORE 0 (soft and hard) in place of
// any the host set: a hard limit of 0 cannot be raised without
// CAP_SYS_RESOURCE.
func forceNoCore(rl []specs.POSIXRlimit, warn func(string)) []specs.POSIXRlimit {
	out := slices.DeleteFunc(slices.Clone(rl), func(r specs.POSIXRlimit) bool {
		if !strings.EqualFold(r.Type, "RLIMIT_CORE") {
			return false
		}
		if (r.Soft != 0 || r.Hard != 0) && warn != nil {
			warn(fmt.Sprintf("process.rlimits: RLIMIT_CORE soft %d hard %d replaced by 0: a core dump writes the process's memory where the host may read it", r.Soft, r.Hard))
		}
		return true
	})
	return append(out, specs.POSIXRlimit{Type: "RLIMIT_CORE", Hard: 0, Soft: 0})
}

// criAnnotations returns the CRI annotations of ann, and warns of the
// others.
func criAnnotations(ann map[string]string, warn func(string)) map[string]string {
	if ann == nil {
		return nil
	}
	out := make(map[string]string, len(ann))
	var dropped []string
	for k, v := range ann {
		if strings.HasPrefix(k, criAnnotationPrefix) {
			out[k] = v
		} else {
			dropped = append(dropped, k)
		}
	}
	if len(dropped) > 0 {
		sort.Strings(dropped)
		warn(fmt.Sprintf("dropping annotations %s: only %s* reach the guest's OCI runtime", strings.Join(dropped, ", "), criAnnotationPrefix))
	}
	return out
}

// adaptSeccomp drops the notify listener and refuses the actions that
// hand the process's syscalls to someone else or make them no-ops.
func adaptSeccomp(sc *specs.LinuxSeccomp, warn func(string)) error {
	if sc == nil {
		return nil
	}
	if sc.ListenerPath != "" || sc.ListenerMetadata != "" {
		warn(fmt.Sprintf("dropping linux.seccomp.listenerPath %q and listenerMetadata: the guest sends no seccomp notify fd anywhere", sc.ListenerPath))
		sc.ListenerPath, sc.ListenerMetadata = "", ""
	}
	if err := seccompAction("linux.seccomp.defaultAction", "linux.seccomp.defaultErrnoRet", "every syscall no rule names", sc.DefaultAction, sc.DefaultErrnoRet); err != nil {
		return err
	}
	for i, s := range sc.Syscalls {
		at := fmt.Sprintf("linux.seccomp.syscalls[%d]", i)
		if err := seccompAction(at+".action", at+".errnoRet", strings.Join(s.Names, ", "), s.Action, s.ErrnoRet); err != nil {
			return err
		}
	}
	return nil
}

// seccompAction refuses action a (the field actionField) for syscalls
// where it is SCMP_ACT_NOTIFY, SCMP_ACT_TRACE, or SCMP_ACT_ERRNO with
// errnoRet (errnoField) 0. Without errnoRet, runc and crun return EPERM.
func seccompAction(actionField, errnoField, syscalls string, a specs.LinuxSeccompAction, errnoRet *uint) error {
	var why string
	switch a {
	case specs.ActNotify:
		why = "a process outside the container would decide what these syscalls return"
	case specs.ActTrace:
		why = "a tracer outside the container would decide what these syscalls do"
	case specs.ActErrno:
		if errnoRet == nil || *errnoRet != 0 {
			return nil
		}
		return &ForbiddenError{fmt.Sprintf("%s 0 with %s SCMP_ACT_ERRNO (%s) is refused: the syscalls would be skipped and report success, so that a privilege drop (setuid, setgroups, capset) silently does nothing", errnoField, actionField, syscalls)}
	default:
		return nil
	}
	return &ForbiddenError{fmt.Sprintf("%s %s (%s) is refused: %s; in a confidential VM there is no one outside the container to trust with that", actionField, a, syscalls, why)}
}

// adaptPropagation sets the rootfs propagation.
func adaptPropagation(l *specs.Linux, warn func(string)) {
	if p := l.RootfsPropagation; p != "" && p != rootfsPropagation {
		warn(fmt.Sprintf("linux.rootfsPropagation %q replaced by %q: no mount propagates between the guest and a container", p, rootfsPropagation))
	}
	l.RootfsPropagation = rootfsPropagation
}

// hostFileOptions returns the options of a bind of a host file, nosuid,
// nodev and noexec: without the options that would clear them, which
// runtimes apply in order (and the recursive ones after the mount).
func hostFileOptions(opts []string) []string {
	return withOnly(opts, hostFileBindOptions, "suid", "dev", "exec", "rsuid", "rdev", "rexec", "nosuid", "nodev", "noexec")
}

// sharedOptions returns the options of a bind of a directory shared from
// the host (virtio-fs), nosuid and nodev. The share itself is mounted so,
// but crun remounts each bind with the spec's flags alone, which clears
// them: the host, which sets every file's owner and mode there, would give
// the container setuid-root programs. Executables stay (a volume of
// scripts or tools is a volume's use).
func sharedOptions(opts []string) []string {
	return withOnly(opts, []string{"nosuid", "nodev"}, "suid", "dev", "rsuid", "rdev", "nosuid", "nodev")
}

// withOnly returns opts without drop, then add.
func withOnly(opts, add []string, drop ...string) []string {
	out := slices.DeleteFunc(slices.Clone(opts), func(o string) bool { return slices.Contains(drop, o) })
	return append(out, add...)
}
