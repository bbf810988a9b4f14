package migrate

import (
	"context"
	"io"
	"regexp"
	"sync"
	"time"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/launcher/vm"
)

// The destination's trace of a migration's end (issue 18): when QEMU
// resumed the incoming VM, and the first answer through its agent
// channel, which is the re-attestation's evidence. Under TCG the new
// QEMU's translation cache is empty: with debug logging the number of
// translation blocks QEMU holds at that answer (`info jit`) is logged
// too, all of them translated since the VM resumed here.

// logResume logs when QEMU resumed the incoming VM id (its RESUME event,
// QEMU's own timestamp), the destination's end of the downtime, and
// hands the time to set.
func logResume(ctx context.Context, id string, resumed <-chan vm.Event, unsubscribe func(), done <-chan struct{}, set func(*time.Time)) {
	defer unsubscribe()
	select {
	case ev, ok := <-resumed:
		if !ok {
			return
		}
		at := time.Unix(ev.Timestamp.Seconds, ev.Timestamp.Microseconds*1000)
		set(&at)
		log.G(ctx).WithFields(log.Fields{"vm": id, "at": at.UTC().Format(time.RFC3339Nano)}).Info("incoming VM resumed on this node")
	case <-done:
	case <-ctx.Done():
	}
}

// answerTrace times the first request and the first reply on one agent
// channel connection.
type answerTrace struct {
	ctx     context.Context
	id      string
	h       *hostedVM
	reqOnce sync.Once
	request time.Time
	repOnce sync.Once
}

func newAnswerTrace(ctx context.Context, id string, h *hostedVM) *answerTrace {
	return &answerTrace{ctx: ctx, id: id, h: h}
}

// requests wraps the client's side: its first bytes are the request.
func (t *answerTrace) requests(r io.Reader) io.Reader {
	return readerFunc(func(b []byte) (int, error) {
		n, err := r.Read(b)
		if n > 0 {
			t.reqOnce.Do(func() { t.request = time.Now() })
		}
		return n, err
	})
}

// replies wraps the client's side of the answers: the first is logged,
// once passed on.
func (t *answerTrace) replies(w io.Writer) io.Writer {
	return writerFunc(func(b []byte) (int, error) {
		first := false
		t.repOnce.Do(func() { first = true })
		at := time.Now()
		n, err := w.Write(b)
		if first {
			go t.report(at)
		}
		return n, err
	})
}

// report logs the first answer, which reached the host at now.
func (t *answerTrace) report(now time.Time) {
	t.reqOnce.Do(func() {}) // waits for the request's Do: no race on request
	request := t.request
	f := log.Fields{"vm": t.id}
	if !request.IsZero() {
		f["request_to_reply"] = now.Sub(request).Round(time.Microsecond)
	}
	if at := t.h.resumed.Load(); at != nil {
		f["resume_to_reply"] = now.Sub(*at).Round(time.Microsecond)
	}
	l := log.G(t.ctx)
	if l.Logger.IsLevelEnabled(log.DebugLevel) {
		if q, ok := t.h.vm.(qemuGuest); ok {
			if n, ok := translationBlocks(t.ctx, q.QMP()); ok {
				f["tcg_translation_blocks"] = n
			}
		}
	}
	l.WithFields(f).Info("first answer through the agent channel")
}

// tbCount is `info jit`'s "TB count" line.
var tbCount = regexp.MustCompile(`TB count\s+(\d+)`)

// translationBlocks returns how many translation blocks TCG holds (false
// when QEMU does not say: not TCG).
func translationBlocks(ctx context.Context, q *vm.QMP) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var out string
	if err := q.Execute(ctx, "human-monitor-command", map[string]any{"command-line": "info jit"}, &out); err != nil {
		return "", false
	}
	m := tbCount.FindStringSubmatch(out)
	if m == nil {
		return "", false
	}
	return m[1], true
}

type (
	readerFunc func([]byte) (int, error)
	writerFunc func([]byte) (int, error)
)

func (f readerFunc) Read(b []byte) (int, error)  { return f(b) }
func (f writerFunc) Write(b []byte) (int, error) { return f(b) }
