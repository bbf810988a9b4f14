package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/ttrpc"

	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

func init() {
	register("migrate", "live-migrate a running pod VM to another node, re-attest it there and cut over", runMigrate)
}

// dialShim connects to the c8s shim serving sandbox.
func dialShim(ctx context.Context, address, namespace, sandbox string) (*ttrpc.Client, error) {
	addr, err := shim.SocketAddress(ctx, address, sandbox, false)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", strings.TrimPrefix(addr, "unix://"))
	if err != nil {
		return nil, fmt.Errorf("no c8s shim for sandbox %q in namespace %q (containerd %s): %w", sandbox, namespace, address, err)
	}
	return ttrpc.NewClient(conn), nil
}

func runMigrate(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("migrate")
	address := fs.String("address", "/run/containerd/containerd.sock", "containerd's socket (the pod's shim socket is derived from it)")
	namespace := fs.String("namespace", "k8s.io", "containerd namespace of the pod")
	to := fs.String("to", "", "the destination node's `c8s-launcher serve`: its unix socket, or tls://HOST:PORT")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the transfer; the migration is rolled back after it")
	bandwidth := fs.Uint64("max-bandwidth", 0, "bytes per second (0: the launcher's default)")
	asJSON := fs.Bool("json", false, "print the result as JSON, no progress bar")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || *to == "" {
		return errors.New("usage: c8s-launcher migrate --to SOCK [--address SOCK] [--namespace NS] [--timeout D] [--max-bandwidth N] [--json] SANDBOX")
	}
	sandbox := fs.Arg(0)
	ctx = namespaces.WithNamespace(ctx, *namespace)
	client, err := dialShim(ctx, *address, *namespace, sandbox)
	if err != nil {
		return err
	}
	defer client.Close()
	admin := adminapi.NewAdminClient(client)

	done := make(chan struct{})
	barDone := make(chan struct{})
	go func() {
		defer close(barDone)
		if !*asJSON {
			progressBar(ctx, admin, stdout, done)
		}
	}()
	mctx, cancel := context.WithTimeout(ctx, *timeout+5*time.Minute)
	defer cancel()
	resp, err := admin.Migrate(mctx, &adminapi.MigrateRequest{
		Destination: *to, TimeoutSeconds: uint32(timeout.Seconds()), MaxBandwidth: *bandwidth,
	})
	close(done)
	<-barDone
	if err != nil {
		return fmt.Errorf("migrate sandbox %s: %w", sandbox, err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(map[string]any{
			"sandbox": resp.Sandbox, "node": resp.Node, "claims": json.RawMessage(resp.ClaimsJson),
			"qemu_total_ms": resp.QemuTotalMs, "downtime_ms": resp.DowntimeMs, "total_ms": resp.TotalMs, "reattest_ms": resp.ReattestMs,
		})
	}
	var claims struct {
		ChipID      string `json:"chip_id"`
		Measurement string `json:"measurement"`
	}
	_ = json.Unmarshal(resp.ClaimsJson, &claims)
	fmt.Fprintf(stdout, "sandbox %s migrated to node %s and re-attested there (chip %.16s…, measurement %.16s…)\n", resp.Sandbox, resp.Node, claims.ChipID, claims.Measurement)
	fmt.Fprintf(stdout, "  QEMU total %d ms, downtime %d ms; c8s end to end %d ms (re-attestation %d ms)\n", resp.QemuTotalMs, resp.DowntimeMs, resp.TotalMs, resp.ReattestMs)
	return nil
}

// progressBar polls the shim's migration progress on its own connection
// until done is closed.
func progressBar(ctx context.Context, admin adminapi.AdminService, w io.Writer, done <-chan struct{}) {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	drawn := false
	for {
		select {
		case <-done:
			if drawn {
				fmt.Fprintln(w)
			}
			return
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		p, err := admin.MigrationProgress(pctx, &adminapi.MigrationProgressRequest{})
		cancel()
		if err != nil || !p.Active || p.Total == 0 {
			continue
		}
		fmt.Fprintf(w, "\r%s", renderProgress(p))
		drawn = true
	}
}

// renderProgress is one line of the progress bar.
func renderProgress(p *adminapi.MigrationProgressResponse) string {
	const width = 30
	frac := 1 - float64(p.Remaining)/float64(p.Total)
	if frac < 0 {
		frac = 0
	}
	n := int(frac * width)
	return fmt.Sprintf("[%s%s] %3.0f%% %-9s %d MiB sent, %d MiB remaining of %d MiB, %.0f Mbit/s, %d dirty pages/s",
		strings.Repeat("#", n), strings.Repeat(".", width-n), frac*100, p.Status,
		p.Transferred>>20, p.Remaining>>20, p.Total>>20, p.Mbps, p.DirtyPagesRate)
}
