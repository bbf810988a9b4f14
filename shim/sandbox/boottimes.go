package sandbox

import (
	"bufio"
	"bytes"
	"os"
	"strings"
	"time"

	"github.com/containerd/log"
)

// BootTimes is how long each step of Start took, for the pod's start trace
// (shim/task). Host durations are the shim's own clock. Guest holds what
// the guest says of its own boot; the host displays it and trusts it for
// nothing else.
type BootTimes struct {
	// Prepare is the host work before QEMU runs: the accelerator, the
	// root disk, the sim TEE's measurement of the launch.
	Prepare time.Duration
	// Spawn is QEMU's start until QMP answers.
	Spawn time.Duration
	// HostSide is the host services the VM needs (the sim TEE's secure
	// processor, the key broker relay, the pid file).
	HostSide time.Duration
	// AgentReady is QEMU's start until the agent answered GetInfo.
	AgentReady time.Duration
	// Guest is the guest's own account of its boot, if it gave one.
	Guest GuestBoot
}

// GuestBoot is the guest's uptime at the boot steps the agent logs on the
// console (guest/boot, "serving"): its main's start (the kernel ran it as
// /init; the Go runtime has started), the verified root in place (the
// sealed image's first stage, guest/stage1, which runs in the agent's
// process), and the agent serving its channel. Untrusted: display only.
type GuestBoot struct {
	// Root is zero for a guest without a first stage (an unsealed
	// initramfs).
	Agent, Root, Serving time.Duration
}

// Fields returns the times as log fields, in milliseconds.
func (b BootTimes) Fields() log.Fields {
	f := log.Fields{
		"vm_prepare_ms":  ms(b.Prepare),
		"qemu_spawn_ms":  ms(b.Spawn),
		"host_side_ms":   ms(b.HostSide),
		"agent_ready_ms": ms(b.AgentReady),
	}
	if g := b.Guest; g.Serving > 0 {
		// Guest clock (CLOCK_BOOTTIME, from the kernel's timekeeping
		// start): firmware and decompression come before it.
		f["guest_kernel_to_agent_ms"] = ms(g.Agent)
		up := g.Agent // the agent's own start-up begins
		if g.Root > 0 {
			f["guest_stage1_work_ms"] = ms(g.Root - g.Agent)
			up = g.Root
		}
		f["guest_agent_to_serving_ms"] = ms(g.Serving - up)
		f["guest_uptime_serving_ms"] = ms(g.Serving)
		// The rest of the wait for the agent is what the guest clock
		// does not see: the firmware, loading and decompressing the
		// kernel (the bare boot pays those too), and the first
		// answer's round trip on the channel.
		if b.AgentReady > g.Serving {
			f["outside_guest_clock_ms"] = ms(b.AgentReady - g.Serving)
		}
	}
	return f
}

func ms(d time.Duration) int64 { return d.Milliseconds() }

// BootTimes returns how the VM's start went.
func (s *Sandbox) BootTimes() BootTimes { return s.boot }

// readGuestBoot reads the agent's "serving" line from the console log at
// path. A console without one (or an agent that predates it) gives zeros.
func readGuestBoot(path string) GuestBoot {
	data, err := os.ReadFile(path)
	if err != nil {
		return GuestBoot{}
	}
	return parseGuestBoot(data)
}

// parseGuestBoot finds the last "serving" line of the agent's console log
// (logrus text format) and reads its boot_agent, boot_root and
// guest_uptime fields. Anything malformed reads as zero, and so does a
// line whose times go backwards.
func parseGuestBoot(console []byte) GuestBoot {
	var g GuestBoot
	sc := bufio.NewScanner(bytes.NewReader(console))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "msg=serving") {
			continue
		}
		var n GuestBoot
		for _, tok := range strings.Fields(line) {
			k, v, ok := strings.Cut(tok, "=")
			if !ok {
				continue
			}
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				continue
			}
			switch k {
			case "boot_agent":
				n.Agent = d
			case "boot_root":
				n.Root = d
			case "guest_uptime":
				n.Serving = d
			}
		}
		if n.Root != 0 && (n.Root < n.Agent || n.Root > n.Serving) {
			n.Root = 0
		}
		if n.Agent > 0 && n.Serving >= n.Agent {
			g = n
		}
	}
	return g
}
