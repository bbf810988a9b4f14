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

// notifyOption is appended to the options of the virtio-pci devices whose
// guest notifications (queue kicks) are rare and small: virtio-rng, the
// virtio-scsi controller and virtio-serial. Under TCG it turns their
// ioeventfds off. There is no KVM to signal an ioeventfd there: QEMU
// emulates one, so each kick is an eventfd the vCPU thread writes and the
// main loop wakes up for, and the main loop polls every such eventfd (one
// per virtqueue: 64 for virtio-serial's default 31 ports alone) on each of
// its wake-ups. Off, the vCPU thread runs the device's queue handler itself
// (it queues a disk request to QEMU's I/O threads, writes a few bytes to a
// port's socket) and the main loop polls 24 file descriptors instead of 95
// (with virtioSerialArgs' port count). The main loop's CPU over a whole
// `ctr run --rm busybox true` went from 0.31-0.37 s to 0.19-0.29 s (perf
// sched_stat_runtime, 4 interleaved pairs, loaded machine; issue 18); an
// idle pod's main loop wakes as often as a bare VM's (36/s). Under KVM the
// ioeventfd is KVM's own, which spares the vCPU an exit to QEMU: kept.
func notifyOption(accelName string) string {
	if accelName == "tcg" {
		return ",ioeventfd=off"
	}
	return ""
}

// rngArgs is a virtio-rng device fed from the host's /dev/urandom.
func rngArgs(id, accelName string) []string {
	return []string{
		"-object", fmt.Sprintf("rng-random,id=%s,filename=/dev/urandom", id),
		"-device", "virtio-rng-pci,rng=" + id + notifyOption(accelName),
	}
}

// scsiControllerArgs is the virtio-scsi controller the layer and volume
// disks hang off.
func scsiControllerArgs(id, accelName string) []string {
	return []string{"-device", fmt.Sprintf("virtio-scsi-pci,id=%s,disable-modern=false%s", id, notifyOption(accelName))}
}

// vsockArgs is a vhost-vsock device with the guest's context ID.
func vsockArgs(id string, cid uint32) []string {
	return []string{"-device", fmt.Sprintf("vhost-vsock-pci,disable-modern=false,id=%s,guest-cid=%d", id, cid)}
}

// virtioSerialArgs is the virtio-serial controller the named ports use.
// Under TCG it is sized for ports of them: each port the controller can
// have is a pair of virtqueues the guest's driver sets up at probe and QEMU
// keeps (and, with ioeventfds, polls), whether a port uses it or not;
// QEMU's default is 31. Number 0 is reserved for a console port, hence
// ports+1. Under KVM (SNP, TDX) the controller keeps QEMU's default: there
// the saving is small, and a migration's destination must render the same
// device (QEMU refuses an incoming virtio-serial with more ports than the
// destination's), so a hardware pod's device model does not change with
// this count. A sim pod started by a c8s from before it (31 ports) cannot
// move to a node running this one.
func virtioSerialArgs(id string, ports int, accelName string) []string {
	size := ""
	if accelName == "tcg" {
		size = fmt.Sprintf(",max_ports=%d", ports+1)
	}
	return []string{"-device", fmt.Sprintf("virtio-serial-pci,disable-modern=false,id=%s%s%s", id, size, notifyOption(accelName))}
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
