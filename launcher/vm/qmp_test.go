package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// fakeQMP serves one QMP connection on a unix socket: the greeting, then
// serve's answers to each command after qmp_capabilities.
func fakeQMP(t *testing.T, serve func(enc *json.Encoder, cmd map[string]any)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "qmp.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		enc := json.NewEncoder(c)
		enc.Encode(map[string]any{"QMP": map[string]any{"version": map[string]any{"qemu": map[string]int{"major": 7, "minor": 2, "micro": 19}}, "capabilities": []string{}}})
		sc := bufio.NewScanner(c)
		for sc.Scan() {
			var cmd map[string]any
			if json.Unmarshal(sc.Bytes(), &cmd) != nil {
				return
			}
			if cmd["execute"] == "qmp_capabilities" {
				enc.Encode(map[string]any{"return": map[string]any{}})
				continue
			}
			serve(enc, cmd)
		}
	}()
	return sock
}

// The client matches answers to commands by id (QEMU may interleave events
// and answers), reports error answers with QEMU's description, delivers
// events to subscribers, and fails pending commands when QEMU goes away.
func TestQMPClient(t *testing.T) {
	held := make(chan map[string]any, 1)
	sock := fakeQMP(t, func(enc *json.Encoder, cmd map[string]any) {
		switch cmd["execute"] {
		case "hold": // answered after the next command, out of order
			held <- cmd
		case "query-status":
			enc.Encode(map[string]any{"event": "DEVICE_DELETED", "data": map[string]any{"device": "scsidisk1"}})
			enc.Encode(map[string]any{"id": cmd["id"], "return": map[string]any{"status": "running"}})
			h := <-held
			enc.Encode(map[string]any{"id": h["id"], "return": map[string]any{"held": true}})
		case "device_del":
			enc.Encode(map[string]any{"id": cmd["id"], "error": map[string]any{"class": "DeviceNotFound", "desc": "Device 'nope' not found"}})
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.close()
	if q.Version() != "7.2.19" {
		t.Errorf("Version = %q, want 7.2.19", q.Version())
	}
	events, stop := q.Subscribe("DEVICE_DELETED")
	defer stop()

	heldDone := make(chan error, 1)
	var heldRet struct{ Held bool }
	go func() { heldDone <- q.Execute(ctx, "hold", nil, &heldRet) }()
	for len(held) == 0 {
		time.Sleep(time.Millisecond)
	}
	var st struct{ Status string }
	if err := q.Execute(ctx, "query-status", nil, &st); err != nil || st.Status != "running" {
		t.Fatalf("query-status = %+v, %v; want running", st, err)
	}
	if err := <-heldDone; err != nil || !heldRet.Held {
		t.Fatalf("the out-of-order answer: %+v, %v", heldRet, err)
	}
	select {
	case ev := <-events:
		if ev.Event != "DEVICE_DELETED" || ev.Data["device"] != "scsidisk1" {
			t.Fatalf("event %+v", ev)
		}
	case <-ctx.Done():
		t.Fatal("no DEVICE_DELETED event")
	}

	err = q.Execute(ctx, "device_del", map[string]any{"id": "nope"}, nil)
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "DeviceNotFound" || qe.Command != "device_del" {
		t.Fatalf("device_del: %v, want DeviceNotFound", err)
	}
}

// A command pending when the connection closes fails, and so does every
// later one; subscriptions are closed.
func TestQMPClientConnectionClosed(t *testing.T) {
	sock := fakeQMP(t, func(enc *json.Encoder, cmd map[string]any) {})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := dialQMP(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	events, stop := q.Subscribe("")
	defer stop()
	done := make(chan error, 1)
	go func() { done <- q.Execute(ctx, "never-answered", nil, nil) }()
	time.Sleep(50 * time.Millisecond)
	q.close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a command pending at close succeeded")
		}
	case <-ctx.Done():
		t.Fatal("a command pending at close never returned")
	}
	if _, open := <-events; open {
		t.Fatal("the subscription stayed open after close")
	}
	if err := q.Execute(ctx, "query-status", nil, nil); err == nil {
		t.Fatal("a command after close succeeded")
	}
}
