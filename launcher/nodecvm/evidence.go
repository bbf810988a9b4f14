package nodecvm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/go-configfs-tsm/configfs/configfsi"
	"github.com/google/go-configfs-tsm/configfs/linuxtsm"
	"github.com/google/go-configfs-tsm/report"
	sevclient "github.com/google/go-sev-guest/client"
	tdxclient "github.com/google/go-tdx-guest/client"

	"github.com/c8s-dev/c8s/launcher/discovery"
)

// Evidence is what the node's secure processor said about the node.
type Evidence struct {
	// TEE is discovery.SNP or discovery.TDX.
	TEE string
	// Via names where the evidence came from: "configfs-tsm",
	// "sev-guest" or "tdx-guest".
	Via string
	// Report is the SNP ATTESTATION_REPORT and CertTable the certificate
	// table the host supplied with it (may be empty); Quote is the TDX
	// quote.
	Report, CertTable, Quote []byte
}

// Source asks the node's own secure processor for evidence binding
// reportData.
type Source interface {
	Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error)
}

// SourceFor returns the evidence source for a node-as-CVM that discovery
// found under root: configfs-tsm where the kernel offers it (root "/"
// only: go-configfs-tsm uses the kernel's paths), else the guest device
// of the node's TEE. It returns nil when the node is not a CVM.
func SourceFor(root string, c discovery.NodeCVMInfo) Source {
	if root == "" {
		root = "/"
	}
	switch {
	case c.TEE == "":
		return nil
	case c.TSMReport && filepath.Clean(root) == "/":
		return &TSM{}
	case c.TEE == discovery.SNP:
		return &SEVGuest{Path: filepath.Join(root, "dev/sev-guest")}
	case c.TEE == discovery.TDX:
		return &TDXGuest{Path: filepath.Join(root, "dev/tdx_guest")}
	}
	return nil
}

// SEVGuest reads SNP reports from the sev-guest device.
type SEVGuest struct {
	Path string
	// Open opens the device; nil opens the kernel's (tests pass
	// go-sev-guest's fake device).
	Open func(path string) (sevclient.Device, error)
}

// Evidence implements Source: an extended report (report and certificate
// table), or a plain report where the host does not support extended
// requests.
func (s *SEVGuest) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	open := s.Open
	if open == nil {
		open = func(path string) (sevclient.Device, error) {
			d := &sevclient.LinuxDevice{}
			return d, d.Open(path)
		}
	}
	return withDevice(ctx, s.Path, open, func(d sevclient.Device) (*Evidence, error) {
		report, certs, extErr := sevclient.GetRawExtendedReport(d, reportData) //nolint:staticcheck // the device-level call takes the path found here
		if extErr != nil || len(report) == 0 {
			plain, err := sevclient.GetRawReport(d, reportData) //nolint:staticcheck
			if err != nil {
				return nil, fmt.Errorf("nodecvm: %s: extended report: %v; report: %w", s.Path, extErr, err)
			}
			report, certs = plain, nil
		}
		return &Evidence{TEE: discovery.SNP, Via: "sev-guest", Report: report, CertTable: certs}, nil
	})
}

// withDevice opens the device at path, calls use and closes it again.
func withDevice[D interface{ Close() error }](ctx context.Context, path string, open func(string) (D, error), use func(D) (*Evidence, error)) (*Evidence, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d, err := open(path)
	if err != nil {
		return nil, fmt.Errorf("nodecvm: opening %s: %w", path, err)
	}
	defer d.Close()
	return use(d)
}

// TDXGuest reads TDX quotes through the tdx_guest device.
type TDXGuest struct {
	Path string
	// Open opens the device; nil opens the kernel's (tests pass
	// go-tdx-guest's fake device).
	Open func(path string) (tdxclient.Device, error)
}

// Evidence implements Source.
func (t *TDXGuest) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	open := t.Open
	if open == nil {
		open = func(path string) (tdxclient.Device, error) {
			d := &tdxclient.LinuxDevice{}
			return d, d.Open(path)
		}
	}
	return withDevice(ctx, t.Path, open, func(d tdxclient.Device) (*Evidence, error) {
		quote, err := tdxclient.GetRawQuote(d, reportData)
		if err != nil {
			return nil, fmt.Errorf("nodecvm: %s: quote: %w (is the quoting service reachable?)", t.Path, err)
		}
		return &Evidence{TEE: discovery.TDX, Via: "tdx-guest", Quote: quote}, nil
	})
}

// TSM gets evidence through configfs-tsm (one report entry per request).
type TSM struct {
	// Client is the configfs; nil is the kernel's.
	Client configfsi.Client
}

// Evidence implements Source.
func (t *TSM) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := t.Client
	if c == nil {
		var err error
		if c, err = linuxtsm.MakeClient(); err != nil {
			return nil, fmt.Errorf("nodecvm: configfs-tsm: %w (is configfs mounted on /sys/kernel/config?)", err)
		}
	}
	r, err := report.Create(c, &report.Request{InBlob: reportData[:]})
	if err != nil {
		return nil, fmt.Errorf("nodecvm: configfs-tsm report: %w", err)
	}
	ev, err := tsmEvidence(r)
	if derr := r.Destroy(); derr != nil && err == nil {
		err = fmt.Errorf("nodecvm: configfs-tsm: removing the report entry: %w", derr)
	}
	if err != nil {
		return nil, err
	}
	return ev, nil
}

// tsmEvidence reads the report's outblob and, for SNP, the certificate
// table in auxblob (tdx_guest has no auxblob: the kernel hides it).
func tsmEvidence(r *report.OpenReport) (*Evidence, error) {
	resp, err := r.Get()
	if err != nil {
		return nil, fmt.Errorf("nodecvm: configfs-tsm report: %w", err)
	}
	switch p := strings.TrimSpace(resp.Provider); p {
	case "sev_guest":
		aux, err := r.ReadOption("auxblob")
		if err != nil {
			return nil, fmt.Errorf("nodecvm: configfs-tsm: the SNP certificate table: %w", err)
		}
		return &Evidence{TEE: discovery.SNP, Via: "configfs-tsm", Report: resp.OutBlob, CertTable: aux}, nil
	case "tdx_guest":
		if len(resp.OutBlob) == 0 {
			return nil, errors.New("nodecvm: configfs-tsm: tdx_guest returned an empty quote (is the quoting service reachable?)")
		}
		return &Evidence{TEE: discovery.TDX, Via: "configfs-tsm", Quote: resp.OutBlob}, nil
	default:
		return nil, fmt.Errorf("nodecvm: configfs-tsm provider %q is neither sev_guest nor tdx_guest", p)
	}
}
