package attest

import (
	"context"
	"fmt"

	sevclient "github.com/google/go-sev-guest/client"
)

// SEVGuestDevice is the SEV-SNP guest driver's ioctl device.
const SEVGuestDevice = "/dev/sev-guest"

// SEVGuest gets SNP evidence from the sev-guest device: an extended report
// (report and the certificate table the host supplies), or a plain report
// where the extended request fails.
//
// go-sev-guest's device self-throttles commands (its -self_throttle_duration
// flag, 2s by default), so an extended report, which takes two commands,
// takes about two seconds; configfs-tsm, which Detect prefers, does not.
type SEVGuest struct {
	device[sevclient.Device]
}

// NewSEVGuest returns the provider for the device at path (normally
// SEVGuestDevice).
func NewSEVGuest(path string) *SEVGuest {
	return NewSEVGuestWith(path, openSEVDevice)
}

// NewSEVGuestWith returns the provider for the device at path, opened
// with open instead of the kernel's driver (tests pass go-sev-guest's fake
// device).
func NewSEVGuestWith(path string, open func(path string) (sevclient.Device, error)) *SEVGuest {
	return &SEVGuest{device[sevclient.Device]{name: NameSEVGuest, path: path, open: open}}
}

func openSEVDevice(path string) (sevclient.Device, error) {
	d := &sevclient.LinuxDevice{}
	if err := d.Open(path); err != nil {
		return nil, err
	}
	return d, nil
}

// Evidence asks the secure processor for a report with reportData.
func (p *SEVGuest) Evidence(ctx context.Context, reportData [64]byte) (*Evidence, error) {
	return p.use(ctx, func(d sevclient.Device) (*Evidence, error) {
		// The device-level calls take the device path c8s found; the
		// newer QuoteProvider API always opens the library's default.
		//lint:ignore SA1019 QuoteProvider cannot be given the device path found here
		report, certs, extErr := sevclient.GetRawExtendedReport(d, reportData)
		if extErr != nil || len(report) == 0 {
			// The host may not support extended requests: a plain
			// report still proves the launch; the verifier then
			// needs the VCEK from elsewhere.
			//lint:ignore SA1019 as above: the device at the path found here
			plain, err := sevclient.GetRawReport(d, reportData)
			if err != nil {
				return nil, fmt.Errorf("sev-guest %s: extended report: %v; report: %w", p.path, extErr, err)
			}
			report, certs = plain, nil
		}
		if err := checkSNPReport(report, reportData); err != nil {
			return nil, fmt.Errorf("sev-guest %s: %w", p.path, err)
		}
		return &Evidence{Kind: KindSNP, Provider: NameSEVGuest, Report: report, CertTable: certs}, nil
	})
}
