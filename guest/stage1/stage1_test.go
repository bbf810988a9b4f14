package stage1

import (
	"strings"
	"testing"
)

const (
	rootParams = "c8s.root=/dev/vda c8s.rootfstype=erofs c8s.verity.roothash=4392bc4f7ed2fb4ebdd8b1cba7d1f1ec0c37b1fc34c2e9a5ef9e27b1ac11a8b6 c8s.verity.salt=00ff c8s.verity.blocks=100 c8s.verity.hashstart=101"
	baseParams = "console=ttyS0 quiet panic=-1 c8s.tee=sim"
)

// TestPlan checks the first stage's decision, which only the measured
// command line and the initramfs's own content drive: a sealed initramfs
// maps the root it names and refuses to boot without one (the host cannot
// make it serve from memory by dropping c8s.root=); an unsealed one boots
// without a root and refuses one, rather than ignore what the command line
// asks to verify.
func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name           string
		cmdline        string
		sealed         bool
		wantSealed     bool
		wantErr        string
		wantDevice     string
		wantHashBlocks uint64
	}{
		{name: "sealed initramfs, verity root", cmdline: baseParams + " " + rootParams, sealed: true, wantSealed: true, wantDevice: "/dev/vda", wantHashBlocks: 101},
		{name: "unsealed initramfs, no root", cmdline: baseParams},
		{name: "sealed initramfs without c8s.root", cmdline: baseParams, sealed: true, wantErr: "no c8s.root= on the kernel command line: this initramfs only boots a sealed"},
		{name: "unsealed initramfs with c8s.root", cmdline: baseParams + " " + rootParams, wantErr: "it is not a sealed image's initrd.img"},
		{name: "incomplete verity parameters", cmdline: baseParams + " c8s.root=/dev/vda", sealed: true, wantErr: "c8s.verity.blocks= is missing"},
		{name: "bad root hash", cmdline: strings.Replace(rootParams, "roothash=4392", "roothash=zz92", 1), sealed: true, wantErr: "is not a hex sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, sealed, err := plan(tc.cmdline, tc.sealed)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("plan = %v, %v; want an error with %q", sealed, err, tc.wantErr)
				}
				if sealed {
					t.Fatal("plan failed, yet says to go on with a sealed root")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sealed != tc.wantSealed || p.Device != tc.wantDevice || p.HashStartBlock != tc.wantHashBlocks {
				t.Fatalf("plan = %+v, %v; want device %q, hash start %d, sealed %v", p, sealed, tc.wantDevice, tc.wantHashBlocks, tc.wantSealed)
			}
		})
	}
}
