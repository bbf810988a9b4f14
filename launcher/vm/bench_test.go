package vm

import (
	"bufio"
	"context"
	"fmt"
	"testing"
)

// BenchmarkStartStop measures Start (QEMU up, QMP answering) plus Stop,
// without waiting for the guest.
func BenchmarkStartStop(b *testing.B) {
	env := newTestEnv(b)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		v, err := Start(ctx, env.spec(fmt.Sprintf("bench%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBootToAgent measures Start until the test guest answers on the
// agent channel, under TCG, plus Stop.
func BenchmarkBootToAgent(b *testing.B) {
	env := newTestEnv(b)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		v, err := Start(ctx, env.spec(fmt.Sprintf("boot%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		conn, err := v.DialAgent(ctx)
		if err != nil {
			b.Fatal(err)
		}
		sh := &agentShell{conn: conn, r: bufio.NewReader(conn)}
		if out := sh.run(b, "echo up"); out != "up\n" {
			b.Fatalf("guest said %q", out)
		}
		conn.Close()
		if err := v.Stop(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
