package sandbox

import (
	"testing"
	"time"
)

func TestParseGuestBoot(t *testing.T) {
	console := []byte("SeaBIOS\n" +
		`time="2026-01-01T00:00:01Z" level=info msg="c8s-agent starting" guest_uptime=1.5s pid1=true` + "\n" +
		`time="2026-01-01T00:00:02Z" level=info msg=serving address=/dev/vport0p3 boot_agent=1.5s boot_exec=1.3s boot_stage1=1.1s channel=virtio-serial guest_uptime=1.75s` + "\n" +
		`time="2026-01-01T00:00:03Z" level=info msg="loaded 12 kernel modules"` + "\n")
	got := parseGuestBoot(console)
	want := GuestBoot{Stage1: 1100 * time.Millisecond, Exec: 1300 * time.Millisecond, Agent: 1500 * time.Millisecond, Serving: 1750 * time.Millisecond}
	if got != want {
		t.Fatalf("parseGuestBoot = %+v, want %+v", got, want)
	}
	f := BootTimes{Guest: got, AgentReady: 2600 * time.Millisecond}.Fields()
	for k, v := range map[string]int64{"outside_guest_clock_ms": 850, "guest_kernel_to_stage1_ms": 1100, "guest_stage1_to_agent_ms": 400, "guest_agent_to_serving_ms": 250, "guest_uptime_serving_ms": 1750, "guest_stage1_work_ms": 200, "guest_agent_exec_to_main_ms": 200} {
		if f[k] != v {
			t.Errorf("field %s = %v, want %d", k, f[k], v)
		}
	}
}

func TestParseGuestBootRejectsDisorder(t *testing.T) {
	// The guest is not trusted: times that go backwards are not shown.
	for _, line := range []string{
		`msg=serving boot_agent=2s boot_stage1=1s guest_uptime=1s`,
		`msg=serving boot_agent=1s boot_stage1=2s guest_uptime=3s`,
		`msg=serving boot_agent=-1s boot_stage1=1s guest_uptime=3s`,
		`msg="c8s-agent starting" guest_uptime=3s`,
	} {
		if g := parseGuestBoot([]byte(line + "\n")); g != (GuestBoot{}) {
			t.Errorf("%q: got %+v, want nothing", line, g)
		}
	}
	if f := (BootTimes{AgentReady: time.Second}).Fields(); f["guest_uptime_serving_ms"] != nil || f["outside_guest_clock_ms"] != nil {
		t.Errorf("no guest times, yet fields %v", f)
	}
}
