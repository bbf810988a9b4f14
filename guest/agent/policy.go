package agent

import (
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	policyapi "github.com/c8s-dev/c8s/guest/api/policy"
	"github.com/c8s-dev/c8s/guest/policy"
	"github.com/c8s-dev/c8s/guest/spec"
)

// Where the pod's measured policy ([policy] of its init data, evaluated by
// guest/policy) is consulted:
//
//	CreateContainer   the adapted spec: image, args, env, user, caps,
//	                  the root's image layers (layers.go),
//	                  namespaces, mounts, sysctls, ... (container.go)
//	ExecProcess       the exec's argv on the container's list, its
//	                  process (cwd and user the container's unless the
//	                  rule says otherwise; filled in when the host
//	                  leaves them out), stdin (process.go)
//	ReadStdout/Err    logs (service.go); a no-logs container's output is
//	                  discarded in the guest (newProcess)
//	WriteStdin        stdin, exec_stdin (service.go)
//	SignalProcess     signals (process.go)
//	Stats, ListPids   policy.stats (container.go)
//	UpdateContainer   policy.update_resources (update.go)
//	secrets           mounted only where a rule names them (secrets.go)
//
// StartContainer, WaitProcess, DeleteProcess, RemoveContainer,
// CloseStdin, ResizePty and Shutdown only drive or stop what the
// policy let the host create (the host can stop the VM anyway), and are
// not policy decisions; GetInfo, GetEvidence and SetInitData are checked
// by their own rules (initdata.go).

// evaluator returns the pod's policy evaluator: nil until SetInitData put
// a policy in force, which allows everything (requirePolicy keeps a VM
// launched with measured init data from serving before, and puts the
// built-in default in force in an snp or tdx VM launched without).
func (s *Service) evaluator() *policy.Evaluator {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eval
}

// logDenial reports a policy denial in the guest's log: a refusal, or in
// audit mode what would have been refused.
func logDenial(d *policy.Denial, enforced bool) {
	l := log.L.WithField("request", d.Request).WithField("container", d.Container).WithField("field", d.Field).WithField("rule", d.Rule)
	if enforced {
		l.Warn(d.Error())
	} else {
		l.Warn("audit (not enforced): " + d.Error())
	}
}

// policy returns what the evaluator recorded of the container at create.
func (c *container) policy() *policy.Container {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.grant
}

// mountKinds says for the policy what the source of each mount of an
// adapted spec is.
func mountKinds(mounts []specs.Mount, origins []spec.MountOrigin) []policyapi.MountKind {
	kinds := make([]policyapi.MountKind, len(mounts))
	for i, m := range mounts {
		origin := spec.OriginGuest // the strictest, should origins not cover it
		if i < len(origins) {
			origin = origins[i]
		}
		switch origin {
		case spec.OriginFS:
			kinds[i] = policyapi.FSKind(m.Type)
		case spec.OriginHostFile:
			kinds[i] = policyapi.KindFile
		case spec.OriginShared:
			kinds[i] = policyapi.KindShared
		case spec.OriginEmptyDir:
			kinds[i] = policyapi.KindEmptyDir
		case spec.OriginPodShm:
			kinds[i] = policyapi.KindPodShm
		default:
			kinds[i] = policyapi.KindGuest
		}
	}
	return kinds
}

// checkRead decides whether the host may read a process's stdout or
// stderr.
func (s *Service) checkRead(c *container, execID string, stderr bool) error {
	return s.evaluator().ReadOutput(c.policy(), execID, stderr)
}

// checkStdin decides whether the host may write to a process's stdin.
func (s *Service) checkStdin(c *container, execID string) error {
	return s.evaluator().WriteStdin(c.policy(), execID)
}
