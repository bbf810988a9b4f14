package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeEvents records each wait and ends it when the test sends an event,
// or after the wait's own duration when quiet is set.
type fakeEvents struct {
	mu     sync.Mutex
	waits  []time.Duration
	events chan struct{}
	quiet  bool
}

func (f *fakeEvents) Wait(d time.Duration) {
	f.mu.Lock()
	f.waits = append(f.waits, d)
	f.mu.Unlock()
	if f.quiet {
		time.Sleep(d)
		return
	}
	select {
	case <-f.events:
	case <-time.After(10 * time.Second): // a hung test, not a pass
	}
}

func (f *fakeEvents) Close() error { return nil }

func (f *fakeEvents) recorded() []time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Duration(nil), f.waits...)
}

func fakeRoot(t *testing.T) (sys, dev string) {
	t.Helper()
	root := t.TempDir()
	sys, dev = filepath.Join(root, "sys"), filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	return sys, dev
}

// A disk that comes while the guest waits is looked for again when the
// kernel's event arrives, not at the end of a poll interval.
func TestFindSCSIDiskWokenByEvent(t *testing.T) {
	sys, dev := fakeRoot(t)
	ev := &fakeEvents{events: make(chan struct{})}
	done := make(chan error, 1)
	var got string
	go func() {
		var err error
		got, err = findSCSIDisk(context.Background(), sys, dev, 2, 0, time.Minute, ev)
		done <- err
	}()
	send := func() {
		t.Helper()
		select {
		case ev.events <- struct{}{}:
		case err := <-done:
			t.Fatalf("stopped waiting before the disk came: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("not waiting for an event")
		}
	}
	// An event for another device: it looks again, finds nothing, waits.
	send()
	fakeSCSI(t, sys, dev, "0:0:2:0", "sde")
	send()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if filepath.Base(got) != "sde" {
		t.Errorf("disk = %s, want sde", got)
	}
	if n := len(ev.recorded()); n != 2 {
		t.Errorf("%d waits, want 2 (one per event)", n)
	}
}

// Without events (no uevent socket, or one that dropped them) the looks
// back off from minPoll to maxPoll, and a late disk is still found.
func TestFindSCSIDiskBacksOffWithoutEvents(t *testing.T) {
	sys, dev := fakeRoot(t)
	ev := &fakeEvents{quiet: true}
	go func() {
		time.Sleep(150 * time.Millisecond)
		fakeSCSI(t, sys, dev, "0:0:3:1", "sdf")
	}()
	got, err := findSCSIDisk(context.Background(), sys, dev, 3, 1, time.Minute, ev)
	if err != nil || filepath.Base(got) != "sdf" {
		t.Fatalf("disk = %s, %v; want sdf", got, err)
	}
	waits := ev.recorded()
	if len(waits) < 5 {
		t.Fatalf("waits %v: want at least 5 over 150ms", waits)
	}
	want := minPoll
	for i, d := range waits {
		if d != want {
			t.Fatalf("wait %d = %v, want %v (all: %v)", i, d, want, waits)
		}
		want = min(2*want, maxPoll)
	}
}

// A cancelled request stops waiting.
func TestFindSCSIDiskCancelled(t *testing.T) {
	sys, dev := fakeRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	ev := &fakeEvents{quiet: true}
	go func() {
		time.Sleep(30 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	if _, err := findSCSIDisk(ctx, sys, dev, 1, 0, time.Minute, ev); err != context.Canceled {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("returned %v after the cancel", d)
	}
}

// The guest's own source: a uevent socket whose wait ends by its time
// when nothing happens (the test machine may send an event of its own,
// which ends it sooner, never later).
func TestUeventsWait(t *testing.T) {
	u, err := openUevents()
	if err != nil {
		t.Fatalf("open the uevent socket: %v", err)
	}
	defer u.Close()
	start := time.Now()
	u.Wait(30 * time.Millisecond)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Wait(30ms) took %v", d)
	}
}

func fakeHost(t *testing.T, sys, name string) string {
	t.Helper()
	dir := filepath.Join(sys, "class/scsi_host", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	scan := filepath.Join(dir, "scan")
	if err := os.WriteFile(scan, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return scan
}

// Every SCSI host is asked, once, to scan the address looked for: one
// there from the start, and one that comes while the guest waits (with
// scsi_mod's scan=manual nothing else would find the disk).
func TestFindSCSIDiskAsksEachHostToScan(t *testing.T) {
	sys, dev := fakeRoot(t)
	scan0 := fakeHost(t, sys, "host0")
	ev := &fakeEvents{events: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := findSCSIDisk(context.Background(), sys, dev, 7, 2, time.Minute, ev)
		done <- err
	}()
	send := func() {
		t.Helper()
		select {
		case ev.events <- struct{}{}:
		case err := <-done:
			t.Fatalf("stopped waiting before the disk came: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("not waiting for an event")
		}
	}
	send() // a look that finds nothing: host0 is not asked again
	if err := os.WriteFile(scan0, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	scan1 := fakeHost(t, sys, "host1")
	send()
	// The disk comes once host1 was asked for it (the look after that
	// event runs concurrently with this test).
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if b, _ := os.ReadFile(scan1); string(b) != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("host1 was not asked to scan")
		}
	}
	fakeSCSI(t, sys, dev, "1:0:7:2", "sdg")
	send()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for scan, want := range map[string]string{scan0: "", scan1: "0 7 2"} {
		got, err := os.ReadFile(scan)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != want {
			t.Errorf("%s = %q, want %q", scan, got, want)
		}
	}
}

// A scan the kernel refuses is named when no disk comes.
func TestFindSCSIDiskNamesAFailedScan(t *testing.T) {
	sys, dev := fakeRoot(t)
	if err := os.MkdirAll(filepath.Join(sys, "class/scsi_host/host3/scan"), 0o755); err != nil { // a directory: the write fails
		t.Fatal(err)
	}
	_, err := findSCSIDisk(context.Background(), sys, dev, 1, 0, 20*time.Millisecond, &fakeEvents{quiet: true})
	if err == nil || !strings.Contains(err.Error(), "asking for a scan") || !strings.Contains(err.Error(), "host3") {
		t.Errorf("err = %v, want one naming the failed scan on host3", err)
	}
}
