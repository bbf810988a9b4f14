package attest

import (
	"context"
	"fmt"

	tdxclient "github.com/google/go-tdx-guest/client"
)

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
		return &Evidence{Kind: KindTDX, Provider: NameTDXGuest, Report: quote}, nil
	})
}
