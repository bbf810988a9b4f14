package attest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// CCELPath is where Linux exposes the data of the CCEL ACPI table (the CC
// event log the TD's firmware, and the kernel's EFI stub through it,
// recorded their RTMR extensions in).
const CCELPath = "/sys/firmware/acpi/tables/data/CCEL"

// maxCCEL bounds the event log read: OVMF's log area is 64 KiB, some
// firmware uses 1 MiB.
const maxCCEL = 4 << 20

// withCCEL adds the CC event log at path to TDX evidence. A guest without
// the table sends none; whether the evidence is enough without it is the
// verifier's policy.
type withCCEL struct {
	Provider
	path string
}

func (w withCCEL) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	ev, err := w.Provider.Evidence(ctx, reportData)
	if err != nil || ev.Kind != KindTDX {
		return ev, err
	}
	if ev.EventLog, err = readCCEL(w.path); err != nil {
		return nil, err
	}
	return ev, nil
}

func readCCEL(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the CC event log: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCCEL+1))
	if err != nil {
		return nil, fmt.Errorf("the CC event log %s: %w", path, err)
	}
	if len(b) > maxCCEL {
		return nil, fmt.Errorf("the CC event log %s is larger than %d MiB", path, maxCCEL>>20)
	}
	return b, nil
}
