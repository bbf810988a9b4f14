package attest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/google/go-configfs-tsm/configfs/configfsi"
	"github.com/google/go-configfs-tsm/configfs/linuxtsm"
	"github.com/google/go-configfs-tsm/report"
)

// TSMReportDir is the configfs-tsm report directory.
const TSMReportDir = configfsi.TsmPrefix + "/report"

// configfs-tsm provider names (the kernel drivers' module names) and the
// evidence kind each produces.
var tsmProviderKinds = map[string]string{
	"sev_guest": KindSNP,
	"tdx_guest": KindTDX,
}

// ConfigfsTSM gets evidence through configfs-tsm: it creates a report
// entry, writes the report data to inblob, reads outblob (the SNP report or
// the TDX quote) and, for SNP, auxblob (the certificate table).
type ConfigfsTSM struct {
	mu     sync.Mutex
	client configfsi.Client
	// kind, when set (by Detect, from the TEE the VM was started as), is
	// the only evidence kind the provider returns.
	kind string
}

// NewConfigfsTSM returns the provider over client; with a nil client it
// uses the kernel's configfs (go-configfs-tsm's linuxtsm client).
func NewConfigfsTSM(client configfsi.Client) *ConfigfsTSM {
	return &ConfigfsTSM{client: client}
}

// Name is NameConfigfsTSM.
func (*ConfigfsTSM) Name() string { return NameConfigfsTSM }

// Evidence gets a report with reportData as inblob.
func (p *ConfigfsTSM) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	client := p.client
	if client == nil {
		c, err := linuxtsm.MakeClient()
		if err != nil {
			return nil, fmt.Errorf("configfs-tsm: %w (is configfs mounted on /sys/kernel/config and the tsm module loaded?)", err)
		}
		client = c
	}
	r, err := report.Create(client, &report.Request{InBlob: reportData[:]})
	if err != nil {
		return nil, fmt.Errorf("configfs-tsm: %w", err)
	}
	ev, err := p.get(r, reportData)
	if derr := r.Destroy(); derr != nil && err == nil {
		err = fmt.Errorf("configfs-tsm: remove the report entry: %w", derr)
	}
	if err != nil {
		return nil, err
	}
	return ev, nil
}

func (p *ConfigfsTSM) get(r *report.OpenReport, reportData [64]byte) (*Evidence, error) {
	resp, err := r.Get()
	if err != nil {
		return nil, fmt.Errorf("configfs-tsm: %w (no TEE provider registered? sev-guest and tdx-guest register one when they load)", err)
	}
	provider := strings.TrimSpace(resp.Provider)
	kind, ok := tsmProviderKinds[provider]
	if !ok {
		return nil, fmt.Errorf("configfs-tsm: unknown provider %q; c8s knows sev_guest (SNP) and tdx_guest (TDX)", provider)
	}
	if p.kind != "" && kind != p.kind {
		return nil, fmt.Errorf("configfs-tsm: the report provider is %s (%s evidence), but this VM was started as %s", provider, kind, p.kind)
	}
	ev := &Evidence{Kind: kind, Provider: NameConfigfsTSM, Report: resp.OutBlob}
	switch kind {
	case KindSNP:
		if err := checkSNPReport(ev.Report, reportData); err != nil {
			return nil, fmt.Errorf("configfs-tsm: %w", err)
		}
		// The certificates the host supplied for this same report (same
		// generation); TDX has no auxblob.
		aux, err := r.ReadOption("auxblob")
		if err != nil {
			return nil, fmt.Errorf("configfs-tsm: read the SNP certificate table: %w", err)
		}
		ev.CertTable = aux
	case KindTDX:
		if len(ev.Report) == 0 {
			return nil, errors.New("configfs-tsm: tdx_guest returned an empty quote (is the quoting service reachable?)")
		}
	}
	return ev, nil
}

// rootedClient is the kernel's configfs below another root directory, for
// Detect on a root other than "/". Paths in and out of the client stay the
// kernel's (/sys/kernel/config/tsm/...), as go-configfs-tsm expects.
type rootedClient struct{ root string }

func (c rootedClient) path(name string) string { return filepath.Join(c.root, name) }

func (c rootedClient) MkdirTemp(dir, pattern string) (string, error) {
	p, err := os.MkdirTemp(c.path(dir), pattern)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, filepath.Base(p)), nil
}

func (c rootedClient) ReadFile(name string) ([]byte, error) { return os.ReadFile(c.path(name)) }

func (c rootedClient) WriteFile(name string, contents []byte) error {
	return os.WriteFile(c.path(name), contents, 0o220)
}

// RemoveAll removes a report entry; configfs entries are removed with
// rmdir, as the kernel client does.
func (c rootedClient) RemoveAll(name string) error { return os.Remove(c.path(name)) }

func (c rootedClient) ReadDir(dirname string) ([]os.DirEntry, error) {
	return os.ReadDir(c.path(dirname))
}
