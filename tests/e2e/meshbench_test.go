package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The mesh's cost, measured in TestMesh's pods (make bench runs it with
// bigger figures, hack/bench-mesh.sh): a transfer of meshBenchMiB from
// the server pod's IP, port 8080, which the agents' redirects carry
// through the mesh (the client's proxy, TLS 1.3 over the bridge, the
// server's proxy), against the same from its unmeshed port 8081 in plain
// TCP, and meshBenchReqs small requests, each on a new connection (so
// each meshed one pays a TLS handshake). The workloads are the same on
// both ports: busybox httpd on every address. Timed from the host around
// ExecSync, less the median of an empty exec.
var (
	meshBenchMiB  = envInt("C8S_MESH_BENCH_MIB", 8)
	meshBenchReqs = envInt("C8S_MESH_BENCH_REQS", 10)
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// meshBenchServer is the server's script: the marker page, a big and a
// small file, and busybox httpd on every address on 8081 (unmeshed) and
// 8080 (meshed: the agent redirects it).
func meshBenchServer() []string {
	return []string{"sh", "-c", fmt.Sprintf("mkdir -p /tmp/www && echo c8s-mesh-$((6*7))-plaintext-marker >/tmp/www/marker.html && "+
		"head -c %d /dev/zero >/tmp/www/big && echo ok >/tmp/www/small && busybox httpd -p 8081 -h /tmp/www && "+
		"exec busybox httpd -f -p 8080 -h /tmp/www", meshBenchMiB<<20)}
}

// The client's bench commands (the policy's exec patterns, and argv).
const meshBenchTarget = `10\.231\.9\.[0-9]+:808[01]`

var meshBenchExecs = [][]string{
	{"true"},
	{"sh", "-c", `re:busybox wget -q -O - http://` + meshBenchTarget + `/big \| wc -c`},
	{"sh", "-c", `re:for i in \$\(seq [0-9]+\); do busybox wget -q -O /dev/null http://` + meshBenchTarget + `/small \|\| exit 1; done`},
}

func meshBenchBig(host string) []string {
	return []string{"sh", "-c", "busybox wget -q -O - http://" + host + "/big | wc -c"}
}

func meshBenchSmall(host string, n int) []string {
	return []string{"sh", "-c", fmt.Sprintf("for i in $(seq %d); do busybox wget -q -O /dev/null http://%s/small || exit 1; done", n, host)}
}

// timed runs argv in the pod and returns its wall time and stdout.
func timed(ctx context.Context, t *testing.T, p *meshPod, argv []string) (time.Duration, string) {
	t.Helper()
	t0 := time.Now()
	out, err := p.exec(ctx, argv...)
	d := time.Since(t0)
	if err != nil {
		t.Fatalf("%v: %v", argv, err)
	}
	return d, out
}

func medianDuration(ds []time.Duration) time.Duration {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}

// meshBench measures and logs meshed against plain traffic between the
// client and server pods; the transfers must arrive whole.
func meshBench(ctx context.Context, t *testing.T, client *meshPod, serverIP string) {
	t.Helper()
	var empty []time.Duration
	for range 3 {
		d, _ := timed(ctx, t, client, []string{"true"})
		empty = append(empty, d)
	}
	base := medianDuration(empty)
	hosts := map[string]string{"meshed": serverIP + ":8080", "plain": serverIP + ":8081"}
	rate, lat := map[string]float64{}, map[string]float64{}
	for _, kind := range []string{"plain", "meshed"} {
		d, out := timed(ctx, t, client, meshBenchBig(hosts[kind]))
		if got := strings.TrimSpace(out); got != strconv.Itoa(meshBenchMiB<<20) {
			t.Fatalf("%s transfer: %s bytes arrived, want %d", kind, got, meshBenchMiB<<20)
		}
		rate[kind] = float64(meshBenchMiB) / (d - base).Seconds()
		d, _ = timed(ctx, t, client, meshBenchSmall(hosts[kind], meshBenchReqs))
		lat[kind] = float64((d - base).Microseconds()) / 1000 / float64(meshBenchReqs)
	}
	t.Logf("mesh bench: throughput (%d MiB, one connection, under TCG): meshed %.1f MiB/s, plain %.1f MiB/s, ratio meshed/plain %.2f",
		meshBenchMiB, rate["meshed"], rate["plain"], rate["meshed"]/rate["plain"])
	t.Logf("mesh bench: latency per request (%d requests, a new connection each, TLS handshake included when meshed): meshed %.1f ms, plain %.1f ms, ratio meshed/plain %.2f",
		meshBenchReqs, lat["meshed"], lat["plain"], lat["meshed"]/lat["plain"])
	t.Logf("mesh bench: empty exec baseline subtracted: %v", base.Round(time.Millisecond))
}
