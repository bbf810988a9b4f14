package discovery

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sevIssueCmd is struct sev_issue_cmd of <linux/psp-sev.h>.
type sevIssueCmd struct {
	cmd   uint32
	_     uint32
	data  uint64
	error uint32
	_     uint32
}

const (
	// sevIoctlIssueCmd is _IOWR('S', 0x0, struct sev_issue_cmd).
	sevIoctlIssueCmd = 0xC0185300
	// sevPlatformStatus is SEV_PLATFORM_STATUS.
	sevPlatformStatus = 1
)

// HostSEVFirmware asks the AMD secure processor (through devPath, normally
// /dev/sev) for its SEV firmware version with SEV_PLATFORM_STATUS, and
// returns it as "API major.minor build N".
func HostSEVFirmware(devPath string) (string, error) {
	f, err := os.OpenFile(devPath, os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("discovery: opening %s for the SEV firmware version: %w", devPath, err)
	}
	defer f.Close()
	// struct sev_user_data_status is packed: api_major, api_minor, state
	// (u8 each), flags (u32), build (u8), guest_count (u32).
	var status [12]byte
	cmd := sevIssueCmd{cmd: sevPlatformStatus, data: uint64(uintptr(unsafe.Pointer(&status[0])))}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), sevIoctlIssueCmd, uintptr(unsafe.Pointer(&cmd))); errno != 0 {
		return "", fmt.Errorf("discovery: SEV_PLATFORM_STATUS on %s: %w (firmware error %#x)", devPath, errno, cmd.error)
	}
	return fmt.Sprintf("API %d.%d build %d", status[0], status[1], status[7]), nil
}
