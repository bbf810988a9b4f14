package vm

import "fmt"

// The QEMU options of the fixed devices every pod VM has. They are spelled
// out here rather than rendered by a device-model library so that the
// shim, which links this package, carries no hypervisor framework (issue
// 18: every package linked into the long-running shim costs resident
// memory). The golden argv files (testdata/golden) pin every string.

// rootDiskArgs is the read-only virtio-blk root disk (/dev/vda): the
// device, without write cache, serial = id, over a drive of its own.
func rootDiskArgs(id, file string) []string {
	return []string{
		"-device", fmt.Sprintf("virtio-blk-pci,disable-modern=false,drive=%s,config-wce=off,serial=%s", id, id),
		"-drive", fmt.Sprintf("id=%s,file=%s,aio=threads,format=raw,if=none,readonly=on", id, file),
	}
}

// rngArgs is a virtio-rng device fed from the host's /dev/urandom.
func rngArgs(id string) []string {
	return []string{
		"-object", fmt.Sprintf("rng-random,id=%s,filename=/dev/urandom", id),
		"-device", "virtio-rng-pci,rng=" + id,
	}
}

// scsiControllerArgs is the virtio-scsi controller the layer and volume
// disks hang off.
func scsiControllerArgs(id string) []string {
	return []string{"-device", fmt.Sprintf("virtio-scsi-pci,id=%s,disable-modern=false", id)}
}

// vsockArgs is a vhost-vsock device with the guest's context ID.
func vsockArgs(id string, cid uint32) []string {
	return []string{"-device", fmt.Sprintf("vhost-vsock-pci,disable-modern=false,id=%s,guest-cid=%d", id, cid)}
}

// virtioSerialArgs is the virtio-serial controller the named ports use.
func virtioSerialArgs(id string) []string {
	return []string{"-device", fmt.Sprintf("virtio-serial-pci,disable-modern=false,id=%s", id)}
}

// serialPortArgs is a named virtio-serial port on bus, backed by a unix
// socket QEMU listens on (server, no wait for a client).
func serialPortArgs(bus, deviceID, charID, path, name string) []string {
	return []string{
		"-device", fmt.Sprintf("virtserialport,bus=%s,chardev=%s,id=%s,name=%s", bus, charID, deviceID, name),
		"-chardev", fmt.Sprintf("socket,id=%s,path=%s,server=on,wait=off", charID, path),
	}
}

// tapNetArgs is a virtio-net NIC over the tap device QEMU inherits as fd,
// with no option ROM (see netArgs).
func tapNetArgs(id, mac string, fd int) []string {
	return []string{
		"-netdev", fmt.Sprintf("tap,id=%s,fds=%d", id, fd),
		"-device", fmt.Sprintf("driver=virtio-net-pci,netdev=%s,mac=%s,disable-modern=false,romfile=", id, mac),
	}
}

// vhostUserFSArgs is a virtio-fs device served by a vhost-user daemon on
// socket, with QEMU's default queue size.
func vhostUserFSArgs(charID, socket, tag string) []string {
	return []string{
		"-chardev", fmt.Sprintf("socket,id=%s,path=%s", charID, socket),
		"-device", fmt.Sprintf("vhost-user-fs-pci,chardev=%s,tag=%s,queue-size=1024", charID, tag),
	}
}
