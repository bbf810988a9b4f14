package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// deviceDeletedTimeout bounds RemoveDisk's wait for DEVICE_DELETED when the
// caller's context has no deadline.
const deviceDeletedTimeout = 30 * time.Second

// DiskAddress returns where the guest finds the disk with this ID.
func (v *VM) DiskAddress(id string) (DiskAddress, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	a, ok := v.disks[id]
	return a, ok
}

// AddDisk hotplugs d on the virtio-scsi controller (blockdev-add, then
// device_add scsi-hd) at the lowest free target, LUN 0.
func (v *VM) AddDisk(ctx context.Context, d Disk) (DiskAddress, error) {
	if err := checkDisk(d); err != nil {
		return DiskAddress{}, err
	}
	v.mu.Lock()
	if _, dup := v.disks[d.ID]; dup {
		v.mu.Unlock()
		return DiskAddress{}, fmt.Errorf("vm: disk %q is already attached", d.ID)
	}
	target := -1
	for t := 0; t <= maxSCSITarget; t++ {
		if _, used := v.targets[t]; !used {
			target = t
			break
		}
	}
	if target < 0 {
		v.mu.Unlock()
		return DiskAddress{}, fmt.Errorf("vm: no free SCSI target for disk %q", d.ID)
	}
	v.targets[target] = d.ID // reserve while hotplugging
	v.mu.Unlock()

	release := func() {
		v.mu.Lock()
		delete(v.targets, target)
		v.mu.Unlock()
	}
	if err := v.qmp.Execute(ctx, "blockdev-add", blockdevOptions(d, target), nil); err != nil {
		release()
		return DiskAddress{}, fmt.Errorf("vm: adding disk %q (%s): %w", d.ID, d.Path, err)
	}
	dev := map[string]any{
		"driver":  "scsi-hd",
		"bus":     scsiBus,
		"channel": 0,
		"scsi-id": target,
		"lun":     0,
		"drive":   nodeName(target),
		"id":      deviceID(target),
	}
	if err := v.qmp.Execute(ctx, "device_add", dev, nil); err != nil {
		_ = v.qmp.Execute(context.Background(), "blockdev-del", map[string]any{"node-name": nodeName(target)}, nil)
		release()
		return DiskAddress{}, fmt.Errorf("vm: plugging disk %q into the guest: %w", d.ID, err)
	}
	addr := DiskAddress{Target: target}
	v.mu.Lock()
	v.disks[d.ID] = addr
	v.hotDisks[d.ID] = d
	v.mu.Unlock()
	return addr, nil
}

// RemoveDisk unplugs the disk with this ID (device_del, wait for
// DEVICE_DELETED, blockdev-del).
func (v *VM) RemoveDisk(ctx context.Context, id string) error {
	v.mu.Lock()
	addr, ok := v.disks[id]
	v.mu.Unlock()
	if !ok {
		return fmt.Errorf("vm: no disk %q attached", id)
	}
	dev := deviceID(addr.Target)
	events, cancel := v.qmp.Subscribe("DEVICE_DELETED")
	defer cancel()
	if err := v.qmp.Execute(ctx, "device_del", map[string]any{"id": dev}, nil); err != nil {
		return fmt.Errorf("vm: unplugging disk %q: %w", id, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var c context.CancelFunc
		ctx, c = context.WithTimeout(ctx, deviceDeletedTimeout)
		defer c()
	}
	for deleted := false; !deleted; {
		select {
		case ev, open := <-events:
			if !open {
				return errors.New("vm: QMP connection closed while unplugging a disk")
			}
			var data struct {
				Device string `json:"device"`
			}
			b, _ := json.Marshal(ev.Data)
			_ = json.Unmarshal(b, &data)
			deleted = data.Device == dev
		case <-ctx.Done():
			return fmt.Errorf("vm: waiting for the guest to release disk %q: %w", id, ctx.Err())
		case <-v.done:
			return fmt.Errorf("vm: qemu exited while unplugging disk %q", id)
		}
	}
	if err := v.qmp.Execute(ctx, "blockdev-del", map[string]any{"node-name": nodeName(addr.Target)}, nil); err != nil {
		return fmt.Errorf("vm: releasing disk %q: %w", id, err)
	}
	v.mu.Lock()
	delete(v.disks, id)
	delete(v.hotDisks, id)
	delete(v.targets, addr.Target)
	v.mu.Unlock()
	return nil
}
