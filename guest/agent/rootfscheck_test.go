package agent

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// The host names the file system and options of each container's root
// disk. Asked for overlayfs with lowerdir=/run/c8s/secrets:<another
// container's upper>, a guest that mounted what it was told would give a
// container every secret of the pod and other containers' writes, past
// the policy, which never sees the root's mount. Only ext4 and erofs with
// plain mount flags are taken.
func TestMaliciousHostRootfsOverlay(t *testing.T) {
	ctx := context.Background()
	for name, tc := range map[string]struct {
		r    *agentapi.Rootfs
		want string // "" = mounted
	}{
		"overlay of the secrets":  {&agentapi.Rootfs{Fstype: "overlay", Options: []string{"lowerdir=/run/c8s/secrets:/run/c8s/containers/app/scratch/upper"}}, `file system type "overlay"`},
		"tmpfs":                   {&agentapi.Rootfs{Fstype: "tmpfs"}, `file system type "tmpfs"`},
		"ext4 with a data option": {&agentapi.Rootfs{Fstype: "ext4", Options: []string{"ro", "journal_path=/dev/vda"}}, `option "journal_path=/dev/vda"`},
		"ext4 with flags":         {&agentapi.Rootfs{Fstype: "ext4", Options: []string{"rw", "noatime", "nodev"}}, ""},
		"erofs":                   {&agentapi.Rootfs{Fstype: "erofs", Options: []string{"ro"}}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			mounted := false
			s := &Service{cfg: Config{MountRootfs: func(context.Context, *agentapi.Rootfs, string) error {
				mounted = true
				return nil
			}}}
			c := &container{id: "c1", bundle: t.TempDir(), rootfs: t.TempDir()}
			err := s.mountRoot(ctx, c, tc.r, nil)
			if tc.want == "" {
				if err != nil || !mounted {
					t.Fatalf("mountRoot = %v (mounted %v), want it mounted", err, mounted)
				}
				return
			}
			if !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), tc.want) || mounted {
				t.Fatalf("mountRoot = %v (mounted %v), want permission denied naming %s and nothing mounted", err, mounted, tc.want)
			}
		})
	}
}

// A service whose state dir is relative (a test's Service literal) must
// not make bundles in the working directory: a test once left
// guest/agent/c1/rootfs in the source tree that way.
func TestRelativeStateDirRefused(t *testing.T) {
	t.Chdir(t.TempDir())
	s := &Service{containers: map[string]*container{}}
	_, err := s.CreateContainer(context.Background(), &agentapi.CreateContainerRequest{ContainerId: "c1", Rootfs: rootfsReq()})
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "not an absolute path") {
		t.Fatalf("CreateContainer with no state dir = %v, want it refused", err)
	}
	if _, err := os.Stat("c1"); err == nil {
		t.Fatal("a bundle was made in the working directory")
	}
}
