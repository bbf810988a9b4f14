package sandbox

import (
	"testing"
	"time"
)

func TestParseGuestBoot(t *testing.T) {
	console := []byte("SeaBIOS\n" +
		`time="2026-01-01T00:00:01Z" level=info msg="c8s-agent starting" guest_uptime=1.5s pid1=true` + "\n" +
		`time="2026-01-01T00:00:02Z" level=info msg=serving address=/dev/vport0p3 boot_agent=1.1s boot_root=1.3s channel=virtio-serial guest_uptime=1.75s` + "\n" +
		`time="2026-01-01T00:00:03Z" level=info msg="loaded 12 kernel modules"` + "\n")
	got := parseGuestBoot(console)
	want := GuestBoot{Agent: 1100 * time.Millisecond, Root: 1300 * time.Millisecond, Serving: 1750 * time.Millisecond}
	if got != want {
		t.Fatalf("parseGuestBoot = %+v, want %+v", got, want)
	}
	f := BootTimes{Guest: got, AgentReady: 2600 * time.Millisecond}.Fields()
	for k, v := range map[string]int64{"outside_guest_clock_ms": 850, "guest_kernel_to_agent_ms": 1100, "guest_stage1_work_ms": 200, "guest_agent_to_serving_ms": 450, "guest_uptime_serving_ms": 1750} {
		if f[k] != v {
			t.Errorf("field %s = %v, want %d", k, f[k], v)
		}
	}
}

// TestParseGuestBootUnsealed checks the trace of a guest without a first
// stage (the unsealed initramfs): no first-stage phase, and the agent's
// start-up counts from its main.
func TestParseGuestBootUnsealed(t *testing.T) {
	got := parseGuestBoot([]byte(`msg=serving boot_agent=1.2s guest_uptime=1.5s` + "\n"))
	if want := (GuestBoot{Agent: 1200 * time.Millisecond, Serving: 1500 * time.Millisecond}); got != want {
		t.Fatalf("parseGuestBoot = %+v, want %+v", got, want)
	}
	f := BootTimes{Guest: got}.Fields()
	if f["guest_kernel_to_agent_ms"] != int64(1200) || f["guest_agent_to_serving_ms"] != int64(300) {
		t.Errorf("fields %v: want guest_kernel_to_agent_ms 1200, guest_agent_to_serving_ms 300", f)
	}
	if _, ok := f["guest_stage1_work_ms"]; ok {
		t.Errorf("a guest without a first stage has guest_stage1_work_ms: %v", f)
	}
}

func TestParseGuestBootRejectsDisorder(t *testing.T) {
	// The guest is not trusted: times that go backwards are not shown.
	for _, line := range []string{
		`msg=serving boot_agent=2s guest_uptime=1s`,
		`msg=serving boot_agent=-1s guest_uptime=3s`,
		`msg=serving guest_uptime=3s`,
		`msg="c8s-agent starting" guest_uptime=3s`,
	} {
		if g := parseGuestBoot([]byte(line + "\n")); g != (GuestBoot{}) {
			t.Errorf("%q: got %+v, want nothing", line, g)
		}
	}
	// A first stage's time outside the agent's start-up is dropped, the
	// rest kept.
	for _, line := range []string{
		`msg=serving boot_agent=2s boot_root=1s guest_uptime=3s`,
		`msg=serving boot_agent=1s boot_root=4s guest_uptime=3s`,
	} {
		if g := parseGuestBoot([]byte(line + "\n")); g.Root != 0 || g.Serving != 3*time.Second {
			t.Errorf("%q: got %+v, want no first stage and serving at 3s", line, g)
		}
	}
	if f := (BootTimes{AgentReady: time.Second}).Fields(); f["guest_uptime_serving_ms"] != nil || f["outside_guest_clock_ms"] != nil {
		t.Errorf("no guest times, yet fields %v", f)
	}
}
