package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	adminapi "github.com/c8s-dev/c8s/shim/api/admin/v1"
)

func init() {
	register("attest", "re-attest a running pod VM with a fresh nonce and print the verified claims", runAttest)
}

func runAttest(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("attest")
	address := fs.String("address", "/run/containerd/containerd.sock", "containerd's socket (the pod's shim socket is derived from it)")
	namespace := fs.String("namespace", "k8s.io", "containerd namespace of the pod")
	asJSON := fs.Bool("json", false, "print the claims as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: c8s-launcher attest [--address SOCK] [--namespace NS] [--json] SANDBOX (the pod's sandbox id, or the container id of a pod-less container)")
	}
	sandbox := fs.Arg(0)
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(ctx, *namespace), 2*time.Minute)
	defer cancel()
	client, err := dialShim(ctx, *address, *namespace, sandbox)
	if err != nil {
		return err
	}
	defer client.Close()
	resp, err := adminapi.NewAdminClient(client).Attest(ctx, &adminapi.AttestRequest{})
	if err != nil {
		return fmt.Errorf("attest sandbox %s: %w", sandbox, err)
	}
	if *asJSON {
		out := map[string]any{"sandbox": resp.Sandbox, "provider": resp.Provider, "claims": json.RawMessage(resp.ClaimsJson)}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	var claims map[string]any
	dec := json.NewDecoder(bytes.NewReader(resp.ClaimsJson))
	dec.UseNumber()
	if err := dec.Decode(&claims); err != nil {
		return fmt.Errorf("decode claims: %w", err)
	}
	fmt.Fprintf(stdout, "sandbox %s: attestation verified (evidence from %s)\n", resp.Sandbox, resp.Provider)
	for _, k := range []string{"mode", "simulated", "vcpus", "measurement", "host_data", "report_data", "chip_id", "reported_tcb", "guest_policy"} {
		v, ok := claims[k]
		if !ok {
			continue
		}
		if n, isNum := v.(json.Number); isNum && (k == "reported_tcb" || k == "guest_policy") {
			if u, err := strconv.ParseUint(n.String(), 10, 64); err == nil {
				v = fmt.Sprintf("%#x", u)
			}
		}
		fmt.Fprintf(stdout, "  %-13s %v\n", k+":", v)
	}
	return nil
}
