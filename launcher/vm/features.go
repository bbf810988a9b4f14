package vm

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// CheckQEMUFeatures checks that the QEMU binary knows the user-creatable
// object types a TEE backend needs (tee.Pieces.QOMTypes), so that a QEMU
// too old for SEV-SNP or TDX fails with a clear message instead of a
// command-line error.
func CheckQEMUFeatures(ctx context.Context, qemu string, types []string) error {
	if len(types) == 0 {
		return nil
	}
	out, err := exec.CommandContext(ctx, qemu, "-machine", "none", "-object", "help").CombinedOutput()
	if err != nil {
		return fmt.Errorf("vm: listing QEMU object types with %s -object help: %v: %s", qemu, err, bytes.TrimSpace(out))
	}
	known := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasSuffix(line, ":") {
			known[strings.Fields(line)[0]] = true
		}
	}
	var missing []string
	for _, t := range types {
		if !known[t] {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("vm: %s does not support %s: this TEE needs a newer QEMU (SEV-SNP needs 9.1+, TDX 10.1+)", qemu, strings.Join(missing, ", "))
	}
	return nil
}
