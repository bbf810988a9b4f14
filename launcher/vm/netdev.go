package vm

import (
	"errors"
	"fmt"
	"net"
	"os"
)

// NetDevice is a virtio-net NIC of the VM backed by a tap device the caller
// created and opened (one queue). QEMU inherits Tap: the i-th NetDevice's
// tap is its file descriptor 3+i.
type NetDevice struct {
	// MAC is the NIC's MAC address as the guest sees it.
	MAC net.HardwareAddr
	// Tap is the open tap device (/dev/net/tun after TUNSETIFF). Args
	// only counts it; Start passes it to QEMU.
	Tap *os.File
}

// netdevID names the i-th NIC's netdev; its device is netdevID + "dev".
func netdevID(i int) string { return fmt.Sprintf("net%d", i) }

// netArgs renders the -netdev tap,fds=N and -device virtio-net-pci pairs,
// one queue each (the i-th NIC's tap is fd 3+i). The device gets no option
// ROM (romfile=): the guest boots directly, never over the network, and
// hosts without the ipxe ROMs (Debian's ipxe-qemu) would refuse the device.
func netArgs(nics []NetDevice) []string {
	var argv []string
	for i, n := range nics {
		argv = append(argv, tapNetArgs(netdevID(i), n.MAC.String(), 3+i)...)
	}
	return argv
}

// checkNetDevices reports NICs that cannot be rendered.
func checkNetDevices(nics []NetDevice) error {
	var errs []error
	for i, n := range nics {
		if n.Tap == nil {
			errs = append(errs, fmt.Errorf("vm: NIC %d has no open tap device", i))
		}
		if len(n.MAC) != 6 {
			errs = append(errs, fmt.Errorf("vm: NIC %d: MAC %q must be a 6-byte Ethernet address", i, n.MAC))
		}
	}
	return errors.Join(errs...)
}

// netFiles are the files QEMU inherits for the NICs, in fd order.
func netFiles(nics []NetDevice) []*os.File {
	var files []*os.File
	for _, n := range nics {
		files = append(files, n.Tap)
	}
	return files
}
