package vm

import (
	"fmt"
	"path/filepath"
	"strings"
)

// SharedFS is a virtio-fs share served by a vhost-user daemon (virtiofsd)
// listening on Socket; the guest mounts it by Tag. vhost-user needs the
// guest's RAM in shared memory: a memfd backend (share=on) unless the TEE
// backend already gives one (SNP). QEMU 7.2 cannot migrate such a VM.
type SharedFS struct {
	Socket string
	Tag    string
}

// sharedMemoryID names the memory backend sharedFSArgs adds.
const sharedMemoryID = "c8s-mem"

// sharedFSArgs returns the machine options and arguments for fs (nil: none).
// machine holds the TEE's machine options so far.
func sharedFSArgs(fs *SharedFS, machine []string, memoryMiB uint32) (machineOpts, argv []string) {
	if fs == nil {
		return nil, nil
	}
	hasBackend := false
	for _, o := range machine {
		hasBackend = hasBackend || strings.HasPrefix(o, "memory-backend=")
	}
	if !hasBackend {
		machineOpts = []string{"memory-backend=" + sharedMemoryID}
		argv = []string{"-object", fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,share=on", sharedMemoryID, memoryMiB)}
	}
	argv = append(argv, vhostUserFSArgs("charfs0", fs.Socket, fs.Tag)...)
	return machineOpts, argv
}

func checkSharedFS(fs *SharedFS) error {
	if fs == nil {
		return nil
	}
	if !filepath.IsAbs(fs.Socket) || strings.ContainsAny(fs.Socket, ",\n") || len(fs.Socket) > unixPathMax {
		return fmt.Errorf("vm: shared fs socket %q must be an absolute path without commas, at most %d bytes", fs.Socket, unixPathMax)
	}
	if fs.Tag == "" || len(fs.Tag) > 36 || strings.ContainsAny(fs.Tag, ",= \n") {
		return fmt.Errorf("vm: shared fs tag %q must be 1-36 characters without commas, '=' or spaces", fs.Tag)
	}
	return nil
}
