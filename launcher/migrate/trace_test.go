package migrate

import (
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/log"
	"github.com/sirupsen/logrus"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// logResume ends, and drops its subscription, at the VM's RESUME event,
// or when the VM stops or its host context ends before one.
func TestLogResumeEnds(t *testing.T) {
	for name, end := range map[string]func(ev chan vm.Event, done chan struct{}, cancel context.CancelFunc){
		"RESUME": func(ev chan vm.Event, _ chan struct{}, _ context.CancelFunc) {
			e := vm.Event{Event: "RESUME"}
			e.Timestamp.Seconds = 1700000000
			ev <- e
		},
		"the VM stopped":   func(_ chan vm.Event, done chan struct{}, _ context.CancelFunc) { close(done) },
		"the host's end":   func(_ chan vm.Event, _ chan struct{}, cancel context.CancelFunc) { cancel() },
		"QMP disconnected": func(ev chan vm.Event, _ chan struct{}, _ context.CancelFunc) { close(ev) },
	} {
		ctx, cancel := context.WithCancel(context.Background())
		ev, done := make(chan vm.Event, 1), make(chan struct{})
		unsubscribed := make(chan struct{})
		var resumedAt *time.Time
		ended := make(chan struct{})
		go func() {
			logResume(ctx, "vm1", ev, func() { close(unsubscribed) }, done, func(at *time.Time) { resumedAt = at })
			close(ended)
		}()
		end(ev, done, cancel)
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: logResume did not end", name)
		}
		select {
		case <-unsubscribed:
		default:
			t.Fatalf("%s: the RESUME subscription was not dropped", name)
		}
		if (name == "RESUME") != (resumedAt != nil) {
			t.Fatalf("%s: resume time %v", name, resumedAt)
		}
		cancel()
	}
}

// The agent channel's splice passes bytes through unchanged both ways
// with its trace, which logs the first answer with its time since the
// request and since the VM resumed.
func TestSpliceTracesTheFirstAnswer(t *testing.T) {
	var buf syncBuffer
	logger := logrus.New()
	logger.SetOutput(&buf)
	ctx := log.WithLogger(context.Background(), logrus.NewEntry(logger))
	h := &hostedVM{}
	at := time.Now().Add(-time.Second)
	h.resumed.Store(&at)

	client, clientEnd := net.Pipe()
	agentConn, agentEnd := net.Pipe()
	go splice(clientEnd, clientEnd, agentConn, newAnswerTrace(ctx, "vm1", h))
	go func() { client.Write([]byte("request")) }()
	got := make([]byte, 7)
	if _, err := io.ReadFull(agentEnd, got); err != nil || string(got) != "request" {
		t.Fatalf("the agent got %q, %v", got, err)
	}
	go func() { agentEnd.Write([]byte("reply")) }()
	got = make([]byte, 5)
	if _, err := io.ReadFull(client, got); err != nil || string(got) != "reply" {
		t.Fatalf("the client got %q, %v", got, err)
	}
	client.Close()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(buf.String(), "first answer through the agent channel"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no trace of the first answer; log: %s", buf.String())
		}
	}
	if l := buf.String(); !strings.Contains(l, "request_to_reply=") || !strings.Contains(l, "resume_to_reply=1.") || !strings.Contains(l, "vm=vm1") {
		t.Fatalf("trace of the first answer: %s", l)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
