package migrate

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/c8s-dev/c8s/launcher/migrate/pooltest"
)

// The source loads its stream credentials while the destination starts
// (preloadSourceCreds): a TLS destination then gets exactly the commands
// of the one-step set-up, and a plain one leaves no credentials loaded.
func TestPreloadedSourceCreds(t *testing.T) {
	ca, err := pooltest.NewCA("pool p1")
	if err != nil {
		t.Fatal(err)
	}
	identity := filepath.Join(t.TempDir(), "id")
	if _, err := ca.Issue(identity, "node-a"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dst := NewClient("/nonexistent.sock").WithStream(identity, true)
	tlsIn := IncomingResponse{URI: "tcp:127.0.0.1:4444", TLS: true}

	t.Run("TLS destination", func(t *testing.T) {
		state := t.TempDir()
		oneStep := &recorder{}
		if err := setupStreamTLS(ctx, oneStep, state, identity, endpointClient, "127.0.0.1", ""); err != nil {
			t.Fatal(err)
		}
		q := &recorder{}
		loaded := preloadSourceCreds(ctx, q, state, dst, Options{})()
		if !loaded {
			t.Fatal("the credentials were not loaded ahead")
		}
		if len(q.files) != 4 { // the directory and its three files, while object-add ran
			t.Fatalf("QEMU's credentials directory held %v at object-add", q.files)
		}
		if err := prepareStream(ctx, q, state, dst, tlsIn, "node-b", Options{}, loaded); err != nil {
			t.Fatal(err)
		}
		if got, want := mustJSON(t, q.calls), mustJSON(t, oneStep.calls); got != want {
			t.Fatalf("preloaded set-up ran\n%s\nwant the one-step set-up's\n%s", got, want)
		}
	})
	t.Run("plain destination", func(t *testing.T) {
		q := &recorder{}
		loaded := preloadSourceCreds(ctx, q, t.TempDir(), dst, Options{})()
		plainIn := IncomingResponse{URI: "tcp:127.0.0.1:4444"}
		if err := prepareStream(ctx, q, t.TempDir(), dst, plainIn, "node-b", Options{}, loaded); err != nil {
			t.Fatal(err)
		}
		reset := &recorder{}
		resetStreamTLS(ctx, reset)
		if len(q.calls) != 1+len(reset.calls) || mustJSON(t, q.calls[1:]) != mustJSON(t, reset.calls) {
			t.Fatalf("a plain stream after the preload ran %s; want the credentials removed again (%s)", mustJSON(t, q.calls), mustJSON(t, reset.calls))
		}
	})
	t.Run("nothing to load", func(t *testing.T) {
		for name, tc := range map[string]struct {
			dst  *Client
			opts Options
		}{
			"plain stream forced": {dst, Options{plainStream: true}},
			"no identity":         {NewClient("/nonexistent.sock"), Options{}},
			"empty identity dir":  {NewClient("/nonexistent.sock").WithStream(t.TempDir(), false), Options{}},
		} {
			q := &recorder{}
			if preloadSourceCreds(ctx, q, t.TempDir(), tc.dst, tc.opts)() || len(q.calls) != 0 {
				t.Errorf("%s: loaded credentials ahead (%v)", name, q.calls)
			}
		}
	})
	t.Run("a failed load falls back to the one-step set-up", func(t *testing.T) {
		q := &recorder{fail: "object-add"}
		if preloadSourceCreds(ctx, q, t.TempDir(), dst, Options{})() {
			t.Fatal("a failed object-add counted as loaded")
		}
		// The add may have taken effect with its reply lost (a cancelled
		// context): what it may have left is removed.
		reset := &recorder{}
		resetStreamTLS(ctx, reset)
		if n := len(q.calls) - len(reset.calls); n < 1 || mustJSON(t, q.calls[n:]) != mustJSON(t, reset.calls) {
			t.Fatalf("a failed load ran %s; want the credentials removed after it (%s)", mustJSON(t, q.calls), mustJSON(t, reset.calls))
		}
	})
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
