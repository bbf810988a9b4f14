package vm

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"
)

// QMP is the VM's QEMU monitor connection. Raw gives the generated typed
// commands of go-qemu; Execute runs any command (for those Raw lacks or
// types too narrowly, such as device_add with driver properties); Subscribe
// delivers asynchronous events.
type QMP struct {
	mon *qmp.SocketMonitor
	raw *raw.Monitor

	mu     sync.Mutex
	subs   map[int]*subscription
	nextID int
	closed bool
	once   sync.Once
}

type subscription struct {
	name string
	ch   chan qmp.Event
}

func dialQMP(ctx context.Context, socket string) (*QMP, error) {
	timeout := 2 * time.Second
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	mon, err := qmp.NewSocketMonitor("unix", socket, timeout)
	if err != nil {
		return nil, err
	}
	if err := runCtx(ctx, func() error { return mon.Connect() }); err != nil {
		mon.Disconnect()
		return nil, fmt.Errorf("qmp handshake: %w", err)
	}
	events, err := mon.Events(context.Background())
	if err != nil {
		mon.Disconnect()
		return nil, err
	}
	q := &QMP{mon: mon, raw: raw.NewMonitor(mon), subs: map[int]*subscription{}}
	go q.dispatch(events)
	return q, nil
}

// dispatch always drains the monitor's event channel (go-qemu blocks
// command responses while an event is unread) and fans events out.
func (q *QMP) dispatch(events <-chan qmp.Event) {
	for ev := range events {
		q.mu.Lock()
		for _, s := range q.subs {
			if s.name == "" || s.name == ev.Event {
				select {
				case s.ch <- ev:
				default: // a slow subscriber loses events rather than blocking QMP
				}
			}
		}
		q.mu.Unlock()
	}
	q.mu.Lock()
	for id, s := range q.subs {
		close(s.ch)
		delete(q.subs, id)
	}
	q.closed = true
	q.mu.Unlock()
}

// Subscribe returns a channel receiving events named name ("" for all)
// until cancel is called or the connection closes (then it is closed).
func (q *QMP) Subscribe(name string) (events <-chan qmp.Event, cancel func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ch := make(chan qmp.Event, 64)
	if q.closed {
		close(ch)
		return ch, func() {}
	}
	id := q.nextID
	q.nextID++
	q.subs[id] = &subscription{name: name, ch: ch}
	return ch, func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if s, ok := q.subs[id]; ok {
			close(s.ch)
			delete(q.subs, id)
		}
	}
}

// Raw is go-qemu's generated, typed QMP command set.
func (q *QMP) Raw() *raw.Monitor { return q.raw }

// Version is the QEMU version the monitor reported.
func (q *QMP) Version() string {
	if q.mon.Version == nil {
		return ""
	}
	return q.mon.Version.String()
}

// Execute runs command with args (marshalled to JSON, nil for none) and
// decodes the "return" value into result (nil to ignore it). If ctx ends
// first, Execute returns ctx.Err(); the command may still complete.
func (q *QMP) Execute(ctx context.Context, command string, args any, result any) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	var out []byte
	err = runCtx(ctx, func() error {
		var e error
		out, e = q.mon.Run(b)
		return e
	})
	if err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	if result == nil {
		return nil
	}
	var resp struct {
		Return json.RawMessage `json:"return"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		return fmt.Errorf("qmp %s: decoding response: %w", command, err)
	}
	if err := json.Unmarshal(resp.Return, result); err != nil {
		return fmt.Errorf("qmp %s: decoding return value: %w", command, err)
	}
	return nil
}

func (q *QMP) close() {
	if q == nil {
		return
	}
	q.once.Do(func() { q.mon.Disconnect() })
}

// runCtx runs f, returning early with ctx.Err() if ctx ends first.
func runCtx(ctx context.Context, f func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
