package discovery

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	// sevIoctlIssueCmd is SEV_ISSUE_CMD, _IOWR('S', 0x0, struct
	// sev_issue_cmd) of <linux/psp-sev.h>; the struct is packed: cmd
	// (u32), data (u64, a user pointer), error (u32), 16 bytes.
	sevIoctlIssueCmd = 0xC0105300
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
	status := heapBytes(12)
	var cmd [16]byte
	binary.LittleEndian.PutUint32(cmd[0:], sevPlatformStatus)
	binary.LittleEndian.PutUint64(cmd[4:], uint64(uintptr(unsafe.Pointer(&status[0]))))
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), sevIoctlIssueCmd, uintptr(unsafe.Pointer(&cmd[0])))
	runtime.KeepAlive(status)
	if errno != 0 {
		return "", fmt.Errorf("discovery: SEV_PLATFORM_STATUS on %s: %w (firmware error %#x)", devPath, errno, binary.LittleEndian.Uint32(cmd[12:]))
	}
	return fmt.Sprintf("API %d.%d build %d", status[0], status[1], status[7]), nil
}

// heapBytes returns n zero bytes on the heap. The kernel gets the status
// buffer's address inside the command struct, where the runtime cannot
// see it; a heap object never moves, a stack one may (stack growth).
//
//go:noinline
func heapBytes(n int) []byte {
	return make([]byte, n)
}
