package task

import (
	"context"
	"sync"
	"testing"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/v2/core/events"
	"github.com/containerd/containerd/v2/pkg/shutdown"
)

// sendLog is a publisher that keeps the containers of the TaskOOM events
// it is given.
type sendLog struct {
	mu     sync.Mutex
	ids    []string
	closed bool
}

func (l *sendLog) Publish(_ context.Context, _ string, e events.Event) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, e.(*eventstypes.TaskOOM).ContainerID)
	return nil
}

func (l *sendLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	return nil
}

// TestSendDuringAndAfterShutdown checks that events sent while shutdown
// closes the queue, and after, are dropped without a panic, and that the
// events queued before are published first.
func TestSendDuringAndAfterShutdown(t *testing.T) {
	pub := &sendLog{}
	ctx, sd := shutdown.WithShutdown(context.Background())
	s := newService(ctx, pub, sd, nil)
	s.send(&eventstypes.TaskOOM{ContainerID: "before"})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				s.send(&eventstypes.TaskOOM{ContainerID: "racing"})
			}
		})
	}
	sd.Shutdown()
	<-sd.Done()
	wg.Wait()
	s.send(&eventstypes.TaskOOM{ContainerID: "after"})

	pub.mu.Lock()
	defer pub.mu.Unlock()
	if !pub.closed {
		t.Error("the publisher was not closed at shutdown")
	}
	if len(pub.ids) == 0 || pub.ids[0] != "before" {
		t.Fatalf("published %d events, the first %q; want the one queued before shutdown first", len(pub.ids), pub.ids[:min(1, len(pub.ids))])
	}
	for _, id := range pub.ids[1:] {
		if id != "racing" {
			t.Fatalf("published an event for %q: sent after shutdown closed the queue", id)
		}
	}
}
