package attest

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"

	tdxclient "github.com/google/go-tdx-guest/client"
	tdxlabi "github.com/google/go-tdx-guest/client/linuxabi"
)

// TDX TDREPORT layout (Intel TDX module ABI, TDREPORT_STRUCT): a 256-byte
// REPORTMACSTRUCT, a 239-byte TEE_TCB_INFO, 17 reserved bytes, then
// TDINFO: ATTRIBUTES (8), XFAM (8), MRTD (48), MRCONFIGID (48), ...
// REPORTMACSTRUCT: REPORTTYPE (4), reserved (12), CPUSVN (16),
// TEE_TCB_INFO_HASH (48), TEE_INFO_HASH (48), then REPORTDATA (64).
const (
	TDReportSize       = tdxlabi.TdReportSize
	tdReportDataOffset = 128
	tdInfoOffset       = 512
	TDReportMRConfigID = tdInfoOffset + 8 + 8 + 48
)

// checkTDReport checks that a TDREPORT binds reportData, as checkSNPReport
// does for SNP: the agent hands it out as this request's evidence.
func checkTDReport(report []byte, reportData [64]byte) error {
	if len(report) != TDReportSize {
		return fmt.Errorf("the TDREPORT is %d bytes, not the %d of a TDREPORT_STRUCT", len(report), TDReportSize)
	}
	got := report[tdReportDataOffset : tdReportDataOffset+len(reportData)]
	if !bytes.Equal(got, reportData[:]) {
		return fmt.Errorf("the TDREPORT's REPORTDATA is %s, not the requested %s (a report for another request?)",
			hex.EncodeToString(got), hex.EncodeToString(reportData[:]))
	}
	return nil
}

// TDXGuestDevice is the TDX guest driver's ioctl device.
const TDXGuestDevice = "/dev/tdx_guest"

// TDXGuest gets a TDX quote from the tdx-guest device: a TDREPORT with the
// report data, turned into a quote by the host's quoting service.
type TDXGuest struct {
	device[tdxclient.Device]
}

// NewTDXGuest returns the provider for the device at path (normally
// TDXGuestDevice).
func NewTDXGuest(path string) *TDXGuest {
	return NewTDXGuestWith(path, openTDXDevice)
}

// NewTDXGuestWith returns the provider for the device at path, opened
// with open instead of the kernel's driver (tests pass go-tdx-guest's fake
// device).
func NewTDXGuestWith(path string, open func(path string) (tdxclient.Device, error)) *TDXGuest {
	return &TDXGuest{device[tdxclient.Device]{name: NameTDXGuest, path: path, open: open}}
}

func openTDXDevice(path string) (tdxclient.Device, error) {
	d := &tdxclient.LinuxDevice{}
	if err := d.Open(path); err != nil {
		return nil, err
	}
	return d, nil
}

// TDReport returns the TDREPORT for reportData, from the TDX module through
// the device (TDX_CMD_GET_REPORT0): guest-private, MACed by the CPU, never
// seen by the host before the guest hands it out.
func (p *TDXGuest) TDReport(ctx context.Context, reportData [64]byte) ([]byte, error) {
	ev, err := p.use(ctx, func(d tdxclient.Device) (*Evidence, error) {
		r, err := p.tdReport(d, reportData)
		return &Evidence{TDReport: r}, err
	})
	if err != nil {
		return nil, err
	}
	return ev.TDReport, nil
}

// tdReport reads the TDREPORT for reportData through the open device d
// and checks that it binds reportData.
func (p *TDXGuest) tdReport(d tdxclient.Device, reportData [64]byte) ([]byte, error) {
	req := tdxlabi.TdxReportReq{ReportData: reportData}
	res, err := d.Ioctl(tdxlabi.IocTdxGetReport, &req)
	if err != nil {
		return nil, fmt.Errorf("tdx-guest %s: get TDREPORT: %w", p.path, err)
	}
	if res != uintptr(tdxlabi.TdxAttestSuccess) {
		return nil, fmt.Errorf("tdx-guest %s: get TDREPORT: status %d", p.path, res)
	}
	if err := checkTDReport(req.TdReport[:], reportData); err != nil {
		return nil, fmt.Errorf("tdx-guest %s: %w", p.path, err)
	}
	return req.TdReport[:], nil
}

// withTDReport adds the TDREPORT from tdx to the TDX evidence of p.
type withTDReport struct {
	Provider
	tdx *TDXGuest
}

func (w withTDReport) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	ev, err := w.Provider.Evidence(ctx, reportData)
	if err != nil || ev.Kind != KindTDX {
		return ev, err
	}
	if ev.TDReport, err = w.tdx.TDReport(ctx, reportData); err != nil {
		return nil, err
	}
	return ev, nil
}

// Evidence returns a quote whose REPORT_DATA is reportData.
func (p *TDXGuest) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	return p.use(ctx, func(d tdxclient.Device) (*Evidence, error) {
		quote, err := tdxclient.GetRawQuote(d, reportData)
		if err != nil {
			return nil, fmt.Errorf("tdx-guest %s: get quote: %w (is the host's quoting service running?)", p.path, err)
		}
		if len(quote) == 0 {
			return nil, fmt.Errorf("tdx-guest %s: empty quote", p.path)
		}
		r, err := p.tdReport(d, reportData)
		if err != nil {
			return nil, err
		}
		return &Evidence{Kind: KindTDX, Provider: NameTDXGuest, Report: quote, TDReport: r}, nil
	})
}
