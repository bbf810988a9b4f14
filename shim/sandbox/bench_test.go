package sandbox

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
	"github.com/c8s-dev/c8s/launcher/attest/verdict"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/launcher/migrate/pooltest"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
)

// BenchmarkMigrate live-migrates a pod VM booted from the guest image
// (`make image`) to a second node on loopback, through the same code as
// the shim's Migrate RPC, for a 256 MiB and a 1 GiB guest. It reports
// QEMU's own total time and downtime, c8s's preflight-to-cut-over time
// (re-attestation included) and its ratio to QEMU's total, and the
// re-attestation alone, next to the pod's first attestation on the source
// (both under TCG here: the guest's share is emulated). The boot is not
// timed. Each size runs with QEMU's migration stream under TLS (the pool's
// certificates, as between nodes) and, for comparison, in plain TCP on
// loopback (migration.plain_loopback).
func BenchmarkMigrate(b *testing.B) {
	// go test interleaves log lines with the benchmark's result line:
	// logs are dropped so that the metrics stay on it (failures still end
	// the benchmark with their error).
	out := logrus.StandardLogger().Out
	logrus.SetOutput(io.Discard)
	b.Cleanup(func() { logrus.SetOutput(out) })
	image, err := filepath.Abs(filepath.Join("..", "..", "_output", "image"))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(image, "manifest.json")); err != nil {
		b.Skipf("no guest image (%v): run make image", err)
	}
	for _, mem := range []uint32{256, 1024} {
		b.Run(fmt.Sprintf("mem=%dMiB", mem), func(b *testing.B) {
			for _, stream := range []string{"tls", "plain"} {
				b.Run("stream="+stream, func(b *testing.B) { benchMigrate(b, image, mem, stream == "tls") })
			}
		})
	}
}

func benchMigrate(b *testing.B, image string, mem uint32, streamTLS bool) {
	b.StopTimer() // the setup creates a sim identity: seconds of key generation
	ctx := context.Background()
	root, err := os.MkdirTemp("", "c8s-mb-") // short: unix socket paths
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(root) })
	node := func(name string) config.Config {
		cfg := config.Default()
		cfg.Hypervisor.Kernel = filepath.Join(image, "vmlinuz")
		cfg.Hypervisor.Initrd = filepath.Join(image, "initrd.img")
		cfg.Hypervisor.DefaultMemoryMiB = mem
		cfg.Hypervisor.Accel = "tcg"
		cfg.Runtime.StateDir = filepath.Join(root, name)
		cfg.Node.TrustPool = "bench"
		return cfg
	}
	a, bn := node("a"), node("b")
	identityA := statedir.MigrateTLS(a.Runtime.StateDir)
	if streamTLS {
		ca, err := pooltest.NewCA("bench")
		if err != nil {
			b.Fatal(err)
		}
		for cfg, name := range map[*config.Config]string{&a: "node-a", &bn: "node-b"} {
			if _, err := ca.Issue(statedir.MigrateTLS(cfg.Runtime.StateDir), name); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		bn.Migration.PlainLoopback = true
	}

	srv := &migrate.Server{Config: bn, Name: "node-b"}
	sock := filepath.Join(root, "b.sock")
	l, err := migrate.Listen(sock)
	if err != nil {
		b.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	served := make(chan struct{})
	go func() { srv.Serve(sctx, l); close(served) }()
	b.Cleanup(func() { stop(); <-served })
	spB, err := sim.Open(statedir.SimSP(bn.Runtime.StateDir))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(statedir.PoolRoots(a.Runtime.StateDir), 0o700); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(statedir.PoolRoots(a.Runtime.StateDir), "node-b.pem"), spB.CertChainPEM(), 0o644); err != nil {
		b.Fatal(err)
	}
	dst := migrate.NewClient(sock).WithStream(identityA, !streamTLS)

	var qemuTotal, downtime, total, reattest, connect, verify, bootAttest, started, seen, answer, sourceAnswer, nextAnswer time.Duration
	n, warm := 0, 0
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("mb%d", i)
		sb, err := Start(ctx, Options{ID: id, StateDir: filepath.Join(a.Runtime.StateDir, id), Config: a})
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if _, err := sb.Attest(ctx, a); err != nil { // as the shim does before the pod runs
			sb.Stop(ctx)
			b.Fatal(err)
		}
		bootAttest += time.Since(t0)
		// The same request as the destination's first, on the source
		// (warm), and below on the destination right after the move: the
		// guest's own work, without a new QEMU's empty TCG translation
		// cache.
		t0 = time.Now()
		if err := benchEvidence(ctx, sb); err != nil {
			sb.Stop(ctx)
			b.Fatal(err)
		}
		sourceAnswer += time.Since(t0)
		b.StartTimer()
		m, err := sb.Migrate(ctx, a, dst, MigrateOptions{})
		b.StopTimer()
		if err != nil {
			sb.Stop(ctx)
			b.Fatal(err)
		}
		t0 = time.Now()
		if err := benchEvidence(ctx, sb); err != nil {
			sb.Stop(ctx)
			b.Fatal(err)
		}
		nextAnswer += time.Since(t0)
		if err := sb.Stop(ctx); err != nil {
			b.Fatal(err)
		}
		r := m.Result
		qemuTotal += time.Duration(r.Info.TotalTime) * time.Millisecond
		downtime += time.Duration(r.Info.Downtime) * time.Millisecond
		total += r.Total
		reattest += r.Reattest
		connect += m.AgentConnect
		verify += m.Verify
		started += r.Started
		seen += r.Transferred - r.Started - time.Duration(r.Info.TotalTime)*time.Millisecond
		if m.WarmChannel {
			warm++
			answer += m.FirstAnswer
		}
		n++
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / float64(n) }
	b.ReportMetric(ms(qemuTotal), "qemu-total-ms")
	b.ReportMetric(ms(downtime), "downtime-ms")
	b.ReportMetric(ms(total), "c8s-total-ms")
	b.ReportMetric(ms(total)/ms(qemuTotal), "c8s/qemu")
	b.ReportMetric(ms(reattest), "reattest-ms")
	b.ReportMetric(ms(connect), "reattest-connect-ms")
	b.ReportMetric(ms(verify), "reattest-verify-ms")
	b.ReportMetric(ms(bootAttest), "source-attest-ms")
	// The trace: Run's start to QEMU's migrate (preflight, the destination
	// QEMU's start, the stream's TLS set-up) and QEMU's completion to c8s
	// seeing it; the share of runs whose re-attestation used the agent
	// channel dialled during the transfer.
	b.ReportMetric(ms(started), "to-migrate-ms")
	b.ReportMetric(ms(seen), "completion-seen-ms")
	b.ReportMetric(float64(warm)/float64(n), "warm-channel")
	if warm > 0 {
		// The warm channel's first answer: the evidence, from the guest
		// running on the destination (the rest of reattest-verify-ms is
		// its verification).
		b.ReportMetric(float64(answer)/float64(time.Millisecond)/float64(warm), "reattest-answer-ms")
	}
	// The same GetEvidence (fresh nonce, no verification) on the source
	// before the move and on the destination right after its first
	// answer: reattest-answer-ms minus reattest-next-answer-ms is the cold
	// start of the destination QEMU (under TCG, its empty translation
	// cache: perf shows 77-83% of its vCPU thread in TCG's translator
	// during the first answer). KVM-based SNP/TDX guests have no such cost.
	b.ReportMetric(ms(sourceAnswer), "source-answer-ms")
	b.ReportMetric(ms(nextAnswer), "reattest-next-answer-ms")
}

// benchEvidence asks the pod's agent for evidence with a fresh nonce.
func benchEvidence(ctx context.Context, sb *Sandbox) error {
	nonce, err := verdict.NewNonce()
	if err != nil {
		return err
	}
	_, err = sb.Agent.GetEvidence(ctx, &agent.GetEvidenceRequest{Nonce: nonce})
	return err
}
