package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// measure runs the subcommand name as c8s-measure does, through the tool's
// table with a stdout of its own, and returns what it printed there.
func measure(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	var stdout bytes.Buffer
	err := tool.Run(context.Background(), name, args, &stdout)
	return stdout.String(), err
}

// measureWarn runs a subcommand with a stdout and a stderr of its own and
// returns what it printed on each.
func measureWarn(run runFunc, args ...string) (stdout, stderr string, err error) {
	var out, warn bytes.Buffer
	err = run(args, &out, &warn)
	return out.String(), warn.String(), err
}

// TestEverySubcommandIsRegistered checks the table main runs from: each
// subcommand is there once, under the name the tests call it by.
func TestEverySubcommandIsRegistered(t *testing.T) {
	var usage bytes.Buffer
	tool.Usage(&usage)
	var got []string
	for _, line := range strings.Split(usage.String(), "\n") {
		if strings.HasPrefix(line, "  ") {
			got = append(got, strings.Fields(line)[0])
		}
	}
	want := []string{"igvm", "image", "policy", "sev", "seves", "sim", "snp", "snp-ovmf-hash", "tdx", "uki"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("subcommands %q, want %q", got, want)
	}
}
