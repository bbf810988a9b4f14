package sim

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/measurements/snp"
)

// The launch measurement and boot log hash the guest image's files (tens
// of MB of SHA-256 and SHA-384, 60-80 ms of CPU). A process that starts
// many VMs of one image (`c8s-launcher serve`, receiving migrated pod VMs)
// computes them once per launch: measuredLaunch remembers them by the
// launch and the identity of each file (device, inode, size, mtime,
// ctime), so that a file replaced or rewritten in place is hashed again.
// The shim starts one VM and gains nothing, at the cost of one entry.

// measured is what NewHost derives from a launch's files.
type measured struct {
	m        snp.Digest
	eventLog []byte
	rtmrs    [4][48]byte
}

// fileID identifies one version of a file.
type fileID struct {
	dev, ino         uint64
	size             int64
	mtimeNs, ctimeNs int64
}

type launchKey struct {
	l     Launch
	files [3]fileID // firmware, kernel, initrd
}

var (
	launchMemoMu sync.Mutex
	launchMemo   = map[launchKey]measured{}
)

// launchMemoMax bounds the memo: a node's launches differ only by their
// command line (pod kernel parameters) and boot vCPUs.
const launchMemoMax = 64

func statID(path string) (fileID, error) {
	if path == "" {
		return fileID{}, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileID{}, fmt.Errorf("sim: no file identity for %s", path)
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano()}, nil
}

func keyOf(l Launch) (launchKey, bool) {
	k := launchKey{l: l}
	for i, p := range []string{l.Firmware, l.Kernel, l.Initrd} {
		id, err := statID(p)
		if err != nil {
			return k, false // measuring names the problem
		}
		k.files[i] = id
	}
	return k, true
}

// measuredLaunch returns the launch's measurement and boot log, from the
// memo when its files are unchanged.
func measuredLaunch(l Launch) (measured, error) {
	k, ok := keyOf(l)
	if ok {
		launchMemoMu.Lock()
		r, hit := launchMemo[k]
		launchMemoMu.Unlock()
		if hit {
			return r, nil
		}
	}
	var r measured
	var err error
	if r.m, err = Measure(l); err != nil {
		return measured{}, fmt.Errorf("measure the sim launch: %w", err)
	}
	// A kernel that is not an EFI-stub PE image has no TDX-shaped boot
	// log; its reports carry no RTMRs, which a policy checking the
	// measured boot refuses.
	if r.eventLog, r.rtmrs, err = BootLog(l); err != nil {
		log.L.WithError(err).Debug("sim: no modelled RTMRs for this launch")
		r.eventLog, r.rtmrs = nil, [4][48]byte{}
	}
	// Remembered only if no file changed while it was hashed.
	if after, same := keyOf(l); ok && same && after == k {
		launchMemoMu.Lock()
		if len(launchMemo) >= launchMemoMax {
			clear(launchMemo)
		}
		launchMemo[k] = r
		launchMemoMu.Unlock()
	}
	return r, nil
}
