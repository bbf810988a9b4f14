package subcmd

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
)

func TestRegisterRunAndUsage(t *testing.T) {
	tool := New("c8s-x")
	tool.Register("greet", "say hello", func(_ context.Context, args []string, stdout io.Writer) error {
		_, err := io.WriteString(stdout, "hello "+strings.Join(args, " "))
		return err
	})
	tool.Register("check-everything", "a long name", func(context.Context, []string, io.Writer) error { return nil })
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "greet", []string{"pod"}, &out); err != nil || out.String() != "hello pod" {
		t.Fatalf("Run = %q, %v", out.String(), err)
	}
	if err := tool.Run(context.Background(), "nope", nil, &out); err == nil || !strings.Contains(err.Error(), `"nope"`) {
		t.Fatalf("unknown command: %v", err)
	}
	var usage bytes.Buffer
	tool.Usage(&usage)
	if !strings.Contains(usage.String(), "  check-everything  a long name\n") || !strings.Contains(usage.String(), "  greet             say hello\n") {
		t.Fatalf("usage not aligned:\n%s", usage.String())
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a duplicate subcommand did not panic")
		}
	}()
	tool.Register("greet", "again", nil)
}
