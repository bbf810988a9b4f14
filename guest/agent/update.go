package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/spec"
)

// maxResourcesSize bounds the resources document of an update.
const maxResourcesSize = 64 << 10

// updateResources is all of an OCI linux.resources document that an update
// may carry: cgroup limits on CPU, memory and pids. It is decoded strictly,
// so that a document with any other member (devices, hugepageLimits,
// unified, rdma, blockIO, network, realtime CPU, kernel memory, ...) is
// refused: the host may change how much a container uses, never what it
// can reach.
type updateResources struct {
	CPU    *updateCPU    `json:"cpu"`
	Memory *updateMemory `json:"memory"`
	Pids   *updatePids   `json:"pids"`
}

type updateCPU struct {
	Shares *uint64 `json:"shares"`
	Quota  *int64  `json:"quota"`
	Period *uint64 `json:"period"`
	Cpus   string  `json:"cpus"`
	Mems   string  `json:"mems"`
}

type updateMemory struct {
	Limit       *int64 `json:"limit"`
	Reservation *int64 `json:"reservation"`
	Swap        *int64 `json:"swap"`
}

type updatePids struct {
	Limit *int64 `json:"limit"`
}

// parseUpdate decodes and checks the resources of an update and returns
// them as OCI resources holding nothing else.
func parseUpdate(raw []byte) (*specs.LinuxResources, error) {
	if len(raw) > maxResourcesSize {
		return nil, fmt.Errorf("the resources document has %d bytes, at most %d", len(raw), maxResourcesSize)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var u updateResources
	if err := dec.Decode(&u); err != nil {
		return nil, fmt.Errorf("an update may change only cpu (shares, quota, period, cpus, mems), memory (limit, reservation, swap) and pids (limit): %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("the resources document has data after its object")
	}
	var errs []error
	out := &specs.LinuxResources{}
	if c := u.CPU; c != nil {
		if c.Shares != nil && *c.Shares != 0 && (*c.Shares < 2 || *c.Shares > 262144) {
			errs = append(errs, fmt.Errorf("cpu.shares %d is out of range 2..262144", *c.Shares))
		}
		if c.Quota != nil && *c.Quota != 0 && *c.Quota != -1 && *c.Quota < 1000 {
			errs = append(errs, fmt.Errorf("cpu.quota %d: want -1 (no limit) or at least 1000 µs", *c.Quota))
		}
		if c.Period != nil && *c.Period != 0 && (*c.Period < 1000 || *c.Period > 1000000) {
			errs = append(errs, fmt.Errorf("cpu.period %d is out of range 1000..1000000 µs", *c.Period))
		}
		for _, l := range []struct{ name, list string }{{"cpu.cpus", c.Cpus}, {"cpu.mems", c.Mems}} {
			if _, err := spec.ParseList(l.list); err != nil {
				errs = append(errs, fmt.Errorf("%s %q: %w", l.name, l.list, err))
			}
		}
		out.CPU = &specs.LinuxCPU{Shares: c.Shares, Quota: c.Quota, Period: c.Period, Cpus: c.Cpus, Mems: c.Mems}
	}
	if m := u.Memory; m != nil {
		for _, f := range []struct {
			name string
			v    *int64
		}{{"memory.limit", m.Limit}, {"memory.reservation", m.Reservation}, {"memory.swap", m.Swap}} {
			if f.v != nil && *f.v < -1 {
				errs = append(errs, fmt.Errorf("%s %d: want -1 (no limit) or a number of bytes", f.name, *f.v))
			}
		}
		out.Memory = &specs.LinuxMemory{Limit: m.Limit, Reservation: m.Reservation, Swap: m.Swap}
	}
	if p := u.Pids; p != nil && p.Limit != nil {
		if *p.Limit < -1 {
			errs = append(errs, fmt.Errorf("pids.limit %d: want -1 (no limit) or a number of processes", *p.Limit))
		}
		out.Pids = &specs.LinuxPids{Limit: *p.Limit}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// UpdateContainer changes the container's cgroup resources with the OCI
// runtime's update (cgroup v2 in the guest; v1 where the tests run).
func (s *Service) UpdateContainer(ctx context.Context, req *agentapi.UpdateContainerRequest) (*agentapi.Empty, error) {
	// Before the lookup: until the policy is in force the host is refused
	// whether or not the container exists.
	if err := s.requirePolicy(ctx, fmt.Sprintf("update of container %q", req.GetContainerId())); err != nil {
		return nil, err
	}
	c, p, err := s.process(req.GetContainerId(), "")
	if err != nil {
		return nil, err
	}
	if err := s.evaluator().Update(c.policy()); err != nil {
		return nil, err
	}
	res, err := parseUpdate(req.GetResources())
	if err != nil {
		return nil, fmt.Errorf("update of container %q refused: %w: %w", c.id, err, errdefs.ErrInvalidArgument)
	}
	if cpu := res.CPU; cpu != nil && (cpu.Cpus != "" || cpu.Mems != "") {
		// As at create: a cpuset the guest does not have is refused clearly.
		if cpus, mems, err := spec.ReadOnline(s.cfg.SysDir); err == nil {
			if err := spec.CheckCPUSet(cpu.Cpus, cpu.Mems, cpus, mems); err != nil {
				return nil, fmt.Errorf("update of container %q refused: %w: %w", c.id, err, errdefs.ErrInvalidArgument)
			}
		}
	}
	if p.exited() {
		return nil, fmt.Errorf("container %q has exited: %w", c.id, errdefs.ErrFailedPrecondition)
	}
	if err := c.byID(func() error { return s.cfg.Runtime.Update(ctx, c.id, c.bundle, res) }); errors.Is(err, errRemoved) {
		return nil, err
	} else if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	log.G(ctx).WithField("container", c.id).WithField("resources", string(mustMarshal(res))).Info("container resources updated")
	return &agentapi.Empty{}, nil
}

func mustMarshal(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
