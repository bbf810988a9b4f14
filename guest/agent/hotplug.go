package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/containerd/log"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/guest/spec"
)

// Bounds of OnlineCPUMem's wait for the host's hot-plug to arrive.
const (
	defaultOnlineTimeout = 10 * time.Second
	maxOnlineTimeout     = time.Minute
	onlinePoll           = 50 * time.Millisecond
)

// OnlineCPUMem brings hot-plugged vCPUs and memory blocks online (the
// guest kernel onlines hot-added memory by itself, CPUs it leaves offline)
// and waits until the guest has what the host says it added. It writes
// only the sysfs "online" switches of CPUs and memory blocks the kernel
// lists, so a host can make the guest use no more than the vCPUs and
// memory it gave the VM anyway.
func (s *Service) OnlineCPUMem(ctx context.Context, req *agentapi.OnlineCPUMemRequest) (*agentapi.OnlineCPUMemResponse, error) {
	if err := s.requirePolicy(ctx, "bringing hot-plugged vCPUs and memory online"); err != nil {
		return nil, err
	}
	// In an SNP or TDX guest the host cannot add vCPUs, and memory it adds
	// was never validated or accepted by the guest: never online it.
	if s.confidential() {
		return nil, fmt.Errorf("bringing hot-plugged vCPUs and memory online is refused in a confidential VM: the guest has not accepted memory the host added: %w", errdefs.ErrFailedPrecondition)
	}
	timeout := time.Duration(req.GetTimeoutMs()) * time.Millisecond
	if timeout <= 0 {
		timeout = defaultOnlineTimeout
	}
	timeout = min(timeout, maxOnlineTimeout)
	deadline := time.Now().Add(timeout)
	sys := s.cfg.SysDir
	for {
		cpus, cerr := onlineCPUs(sys)
		mem, merr := onlineMemory(sys)
		possible, perr := possibleCPUs(sys)
		if err := errors.Join(cerr, merr, perr); err != nil {
			return nil, err
		}
		resp := &agentapi.OnlineCPUMemResponse{Vcpus: uint32(cpus), MemoryMib: mem >> 20, PossibleVcpus: uint32(possible)}
		if resp.Vcpus >= req.GetVcpus() && resp.MemoryMib >= req.GetMemoryMib() {
			log.G(ctx).WithField("vcpus", resp.Vcpus).WithField("memory_mib", resp.MemoryMib).Info("vCPUs and memory online")
			return resp, nil
		}
		if time.Now().After(deadline) {
			return resp, fmt.Errorf("the guest has %d vCPUs and %d MiB of memory online after %s, the host added up to %d vCPUs and %d MiB (has the guest kernel seen the hot-plug? see its console): %w",
				resp.Vcpus, resp.MemoryMib, timeout, req.GetVcpus(), req.GetMemoryMib(), errdefs.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return resp, ctx.Err()
		case <-time.After(onlinePoll):
		}
	}
}

// onlineCPUs onlines every offline CPU the kernel lists and returns how
// many are online.
func onlineCPUs(sys string) (int, error) {
	dir := filepath.Join(sys, "devices/system/cpu")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("list CPUs: %w", err)
	}
	// A CPU without a switch (the boot CPU) counts when the kernel lists
	// it online; one the kernel is still adding has no switch yet either.
	raw, err := os.ReadFile(filepath.Join(dir, "online"))
	if err != nil {
		return 0, fmt.Errorf("online CPUs: %w", err)
	}
	listed, err := spec.ParseList(string(raw))
	if err != nil {
		return 0, fmt.Errorf("online CPUs %q: %w", raw, err)
	}
	n := 0
	for _, e := range entries {
		if !isNumbered(e.Name(), "cpu") {
			continue
		}
		sw := filepath.Join(dir, e.Name(), "online")
		data, err := os.ReadFile(sw)
		if errors.Is(err, fs.ErrNotExist) {
			if id, _ := strconv.Atoi(strings.TrimPrefix(e.Name(), "cpu")); slices.Contains(listed, id) {
				n++
			}
			continue
		}
		if err != nil {
			return 0, err
		}
		if strings.TrimSpace(string(data)) != "1" {
			if err := os.WriteFile(sw, []byte("1"), 0); err != nil {
				log.L.WithError(err).WithField("cpu", e.Name()).Warn("cannot bring a hot-plugged CPU online")
				continue
			}
		}
		n++
	}
	return n, nil
}

// possibleCPUs counts the CPUs the kernel can ever use.
func possibleCPUs(sys string) (int, error) {
	data, err := os.ReadFile(filepath.Join(sys, "devices/system/cpu/possible"))
	if err != nil {
		return 0, fmt.Errorf("possible CPUs: %w", err)
	}
	cpus, err := spec.ParseList(string(data))
	if err != nil {
		return 0, fmt.Errorf("possible CPUs %q: %w", data, err)
	}
	return len(cpus), nil
}

// onlineMemory onlines every offline memory block and returns the bytes of
// memory in online blocks.
func onlineMemory(sys string) (uint64, error) {
	dir := filepath.Join(sys, "devices/system/memory")
	raw, err := os.ReadFile(filepath.Join(dir, "block_size_bytes"))
	if err != nil {
		return 0, fmt.Errorf("memory block size: %w", err)
	}
	block, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 16, 64)
	if err != nil || block == 0 {
		return 0, fmt.Errorf("memory block size %q is not a hexadecimal number", strings.TrimSpace(string(raw)))
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("list memory blocks: %w", err)
	}
	var total uint64
	for _, e := range entries {
		if !isNumbered(e.Name(), "memory") {
			continue
		}
		sw := filepath.Join(dir, e.Name(), "state")
		data, err := os.ReadFile(sw)
		if errors.Is(err, fs.ErrNotExist) {
			continue // the kernel is still adding it: the next look counts it
		}
		if err != nil {
			return 0, err
		}
		switch strings.TrimSpace(string(data)) {
		case "online":
		case "offline":
			if err := os.WriteFile(sw, []byte("online"), 0); err != nil {
				log.L.WithError(err).WithField("block", e.Name()).Warn("cannot bring a hot-plugged memory block online")
				continue
			}
		default: // going offline
			continue
		}
		total += block
	}
	return total, nil
}

// isNumbered reports whether name is prefix followed by a decimal number.
func isNumbered(name, prefix string) bool {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}
