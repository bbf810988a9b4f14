package agent

import (
	"encoding/json"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

var unlimitedCore = []specs.POSIXRlimit{{Type: "RLIMIT_CORE", Hard: ^uint64(0), Soft: ^uint64(0)}, {Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}}

// The host asks for unlimited core dumps for a container and an exec:
// under the real runtime both run with RLIMIT_CORE 0, soft and hard, so a
// SIGQUIT or a crash writes no memory image to a disk the host reads.
func TestMaliciousHostCoreDumpInContainer(t *testing.T) {
	e := newEnv(t)
	s := e.spec(t, "sh", "-c", "ulimit -c; ulimit -Hc; sleep 100000")
	s.Process.Rlimits = unlimitedCore
	e.create(t, "c1", s, pipes(), nil)
	e.start(t, "c1")

	var p specs.Process
	if err := json.Unmarshal(e.process("sh", "-c", "ulimit -c; ulimit -Hc"), &p); err != nil {
		t.Fatal(err)
	}
	p.Rlimits = unlimitedCore
	if _, err := e.agent.ExecProcess(ctxT(t), &agentapi.ExecProcessRequest{ContainerId: "c1", ExecId: "e1", Process: mustJSON(t, &p), Stdio: pipes()}); err != nil {
		t.Fatal(err)
	}
	if out := e.readAll(t, "c1", "e1", false); out != "0\n0\n" {
		t.Errorf("the exec's core limits (soft, hard) = %q, want 0 and 0", out)
	}
	e.wait(t, "c1", "e1")
	if _, err := e.agent.SignalProcess(ctxT(t), &agentapi.SignalProcessRequest{ContainerId: "c1", Signal: 9}); err != nil {
		t.Fatal(err)
	}
	e.wait(t, "c1", "")
	if out := e.readAll(t, "c1", "", false); out != "0\n0\n" {
		t.Errorf("the container's core limits (soft, hard) = %q, want 0 and 0", out)
	}
	e.remove(t, "c1")
}

// A host file passed by value as setuid root and executable: the
// container sees a plain rw-r--r-- file on a nosuid, nodev, noexec bind.
func TestMaliciousHostFileModeInContainer(t *testing.T) {
	e := newEnv(t)
	s := e.spec(t, "sh", "-c", "ls -ln /etc/hosts; grep ' /etc/hosts ' /proc/self/mountinfo")
	s.Mounts = append(s.Mounts, specs.Mount{Destination: "/etc/hosts", Type: "bind", Source: "/var/lib/host-only/hosts", Options: []string{"rbind", "suid", "exec", "rw"}})
	e.create(t, "c1", s, pipes(), func(r *agentapi.CreateContainerRequest) {
		r.Files = []*agentapi.File{{Source: "/var/lib/host-only/hosts", Content: []byte("#!/bin/sh\n"), Mode: 0o6755}}
	})
	e.start(t, "c1")
	e.wait(t, "c1", "")
	out := e.readAll(t, "c1", "", false)
	if !strings.HasPrefix(out, "-rw-r--r--") {
		t.Errorf("ls -l /etc/hosts = %q, want -rw-r--r--", out)
	}
	for _, flag := range []string{"nosuid", "nodev", "noexec"} {
		if !strings.Contains(out, flag) {
			t.Errorf("the /etc/hosts bind is not %s: %q", flag, out)
		}
	}
	e.remove(t, "c1")
}

// Seccomp that hands a container's syscalls to someone outside it is
// refused without any policy: PermissionDenied, naming the field, and
// nothing of the container is left.
func TestMaliciousHostSeccompNotifyRefused(t *testing.T) {
	e := newEnv(t)
	s := e.spec(t, "true")
	s.Linux.Seccomp = &specs.LinuxSeccomp{DefaultAction: specs.ActAllow, ListenerPath: "/run/host.sock",
		Syscalls: []specs.LinuxSyscall{{Names: []string{"openat"}, Action: specs.ActNotify}}}
	_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes()})
	assertCode(t, err, codes.PermissionDenied)
	if err == nil || !strings.Contains(err.Error(), "linux.seccomp.syscalls[0].action SCMP_ACT_NOTIFY") {
		t.Errorf("error %v does not name the seccomp action", err)
	}
	e.assertGone(t, "evil")
}
