package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// QMP is the VM's QEMU monitor connection (QEMU's docs/interop/qmp-spec):
// Execute runs a command, Subscribe delivers asynchronous events. Each
// command carries an "id" QEMU echoes in its answer, so commands from
// several goroutines may be in flight at once. The client is this small
// file rather than a generated QMP library: the shim links this package,
// and a library's thousand typed commands stay resident in every shim.
type QMP struct {
	conn    net.Conn
	version string

	wmu sync.Mutex // serializes writes

	mu      sync.Mutex
	pending map[uint64]chan qmpReply
	nextCmd uint64
	subs    map[int]*subscription
	nextSub int
	closed  bool
	err     error // why the connection closed
	once    sync.Once
}

// Event is an asynchronous QMP event ({"event": ..., "data": ...}).
type Event struct {
	Event     string         `json:"event"`
	Data      map[string]any `json:"data"`
	Timestamp struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
}

// QMPError is a command's error answer.
type QMPError struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *QMPError) Error() string { return e.Desc }

type subscription struct {
	name string
	ch   chan Event
}

// qmpMessage is any message QEMU sends after the greeting.
type qmpMessage struct {
	ID     *uint64         `json:"id"`
	Return json.RawMessage `json:"return"`
	Error  *QMPError       `json:"error"`
	Event
}

type qmpReply struct {
	ret json.RawMessage
	err error
}

func dialQMP(ctx context.Context, socket string) (*QMP, error) {
	timeout := 2 * time.Second
	if d, ok := ctx.Deadline(); ok && time.Until(d) < timeout {
		timeout = time.Until(d)
	}
	conn, err := net.DialTimeout("unix", socket, timeout)
	if err != nil {
		return nil, err
	}
	var q *QMP
	err = runCtx(ctx, func() error {
		var e error
		q, e = handshake(conn, timeout)
		return e
	})
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("qmp handshake: %w", err)
	}
	return q, nil
}

// handshake reads the greeting, leaves capabilities negotiation mode and
// starts the reader.
func handshake(conn net.Conn, timeout time.Duration) (*QMP, error) {
	_ = conn.SetDeadline(time.Now().Add(timeout))
	dec := json.NewDecoder(conn)
	var greeting struct {
		QMP *struct {
			Version struct {
				QEMU struct {
					Major, Minor, Micro int
				} `json:"qemu"`
			} `json:"version"`
		} `json:"QMP"`
	}
	if err := dec.Decode(&greeting); err != nil {
		return nil, fmt.Errorf("reading the greeting: %w", err)
	}
	if greeting.QMP == nil {
		return nil, errors.New("the first message is not a QMP greeting")
	}
	if _, err := conn.Write([]byte(`{"execute":"qmp_capabilities"}` + "\n")); err != nil {
		return nil, err
	}
	for {
		var m qmpMessage
		if err := dec.Decode(&m); err != nil {
			return nil, fmt.Errorf("reading the qmp_capabilities answer: %w", err)
		}
		if m.Error != nil {
			return nil, fmt.Errorf("qmp_capabilities: %s", m.Error.Desc)
		}
		if m.Return != nil {
			break
		}
	}
	_ = conn.SetDeadline(time.Time{})
	v := greeting.QMP.Version.QEMU
	q := &QMP{
		conn:    conn,
		version: fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro),
		pending: map[uint64]chan qmpReply{},
		subs:    map[int]*subscription{},
	}
	go q.read(dec)
	return q, nil
}

// read routes answers to their commands and fans events out to
// subscribers until the connection fails; then every pending command gets
// the error and every subscription is closed.
func (q *QMP) read(dec *json.Decoder) {
	var err error
	for {
		var m qmpMessage
		if err = dec.Decode(&m); err != nil {
			break
		}
		q.mu.Lock()
		switch {
		case m.Event.Event != "":
			for _, s := range q.subs {
				if s.name == "" || s.name == m.Event.Event {
					select {
					case s.ch <- m.Event:
					default: // a slow subscriber loses events rather than blocking QMP
					}
				}
			}
		case m.ID != nil:
			if ch, ok := q.pending[*m.ID]; ok {
				delete(q.pending, *m.ID)
				if m.Error != nil {
					ch <- qmpReply{err: m.Error}
				} else {
					ch <- qmpReply{ret: m.Return}
				}
			}
		}
		q.mu.Unlock()
	}
	q.mu.Lock()
	q.closed = true
	q.err = fmt.Errorf("qmp connection closed: %w", err)
	for id, ch := range q.pending {
		ch <- qmpReply{err: q.err}
		delete(q.pending, id)
	}
	for id, s := range q.subs {
		close(s.ch)
		delete(q.subs, id)
	}
	q.mu.Unlock()
}

// Subscribe returns a channel receiving events named name ("" for all)
// until cancel is called or the connection closes (then it is closed).
func (q *QMP) Subscribe(name string) (events <-chan Event, cancel func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	ch := make(chan Event, 64)
	if q.closed {
		close(ch)
		return ch, func() {}
	}
	id := q.nextSub
	q.nextSub++
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

// Version is the QEMU version the monitor reported (major.minor.micro).
func (q *QMP) Version() string { return q.version }

// Execute runs command with args (marshalled to JSON, nil for none) and
// decodes the "return" value into result (nil to ignore it). If ctx ends
// first, Execute returns ctx.Err(); the command may still complete.
func (q *QMP) Execute(ctx context.Context, command string, args any, result any) error {
	q.mu.Lock()
	if q.closed {
		err := q.err
		q.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	id := q.nextCmd
	q.nextCmd++
	ch := make(chan qmpReply, 1)
	q.pending[id] = ch
	q.mu.Unlock()
	drop := func() {
		q.mu.Lock()
		delete(q.pending, id)
		q.mu.Unlock()
	}

	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        uint64 `json:"id"`
	}{command, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		drop()
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	q.wmu.Lock()
	_, err = q.conn.Write(append(b, '\n'))
	q.wmu.Unlock()
	if err != nil {
		drop()
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	var r qmpReply
	select {
	case r = <-ch:
	case <-ctx.Done():
		drop()
		return ctx.Err()
	}
	if r.err != nil {
		var qe *QMPError
		if errors.As(r.err, &qe) {
			qe.Command = command
		}
		return fmt.Errorf("qmp %s: %w", command, r.err)
	}
	if result == nil {
		return nil
	}
	if err := json.Unmarshal(r.ret, result); err != nil {
		return fmt.Errorf("qmp %s: decoding return value: %w", command, err)
	}
	return nil
}

func (q *QMP) close() {
	if q == nil {
		return
	}
	q.once.Do(func() { q.conn.Close() })
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
