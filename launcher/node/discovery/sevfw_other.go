//go:build !linux

package discovery

import "errors"

// HostSEVFirmware is only implemented on Linux.
func HostSEVFirmware(devPath string) (string, error) {
	return "", errors.New("discovery: reading the SEV firmware version needs Linux")
}
