package agent

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	agentapi "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// watchGuestLooks records every path guestBindSourceExists looks at.
func watchGuestLooks(t *testing.T) *[]string {
	t.Helper()
	var looked []string
	oldL, oldR := guestLstat, guestReadlink
	guestLstat = func(p string) (fs.FileInfo, error) { looked = append(looked, p); return oldL(p) }
	guestReadlink = func(p string) (string, error) { looked = append(looked, p); return oldR(p) }
	t.Cleanup(func() { guestLstat, guestReadlink = oldL, oldR })
	return &looked
}

// guestBindSourceExists resolves a host-chosen path by hand and never
// looks at or below the agent's own directories, however the path gets
// there (lexically, through "..", through a symbolic link, absolute or
// relative); elsewhere it reports what exists.
func TestGuestBindSourceExistsStaysOutOfOwnDirs(t *testing.T) {
	root := t.TempDir()
	own := filepath.Join(root, "own")
	for _, d := range []string{"own/share/c-0/sub", "guest/dir"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"guest/abs":  own,
		"guest/rel":  "../own/share",
		"guest/loop": "loop",
		"guest/up":   "..",
		"guest/file": "dir",
	}
	for l, target := range links {
		if err := os.Symlink(target, filepath.Join(root, l)); err != nil {
			t.Fatal(err)
		}
	}
	looked := watchGuestLooks(t)
	for p, want := range map[string]bool{
		root + "/guest/dir":                   true,
		root + "/guest/file":                  true,
		root + "/guest/up/guest/dir":          true,
		root + "/guest/missing":               false,
		root + "/guest/loop/x":                false,
		own + "/share/c-0/sub/x":              true, // kept for the policy, not looked at
		own:                                   true,
		root + "/guest/abs/share/c-0/sub/x":   true,
		root + "/guest/rel/c-0/sub/x":         true,
		root + "/guest/dir/../../own/share/x": true,
		root + "/guest/up/own/share/c-0/x":    true,
		"relative/path":                       true,
	} {
		if got := guestBindSourceExists(p, []string{own}); got != want {
			t.Errorf("guestBindSourceExists(%q) = %v, want %v", p, got, want)
		}
	}
	for _, p := range *looked {
		if p == own || strings.HasPrefix(p, own+"/") {
			t.Errorf("looked at %s, in the agent's own directory %s", p, own)
		}
	}
	if len(*looked) == 0 {
		t.Fatal("no path was looked at")
	}
}

// volPolicy allows container "vol" a read-only shared volume on /tmp.
var volPolicy = shRule("vol", `mounts = [{ destination = "/tmp", kind = "shared", read_only = true }]
`)

// TestMaliciousHostWalksIntoShare: the host names, as the source of a
// bind of the guest's own filesystem, a path through an entry of the
// pod's share it announces as a mount point. Had the agent looked, the
// walk would have mounted that submount, writable, in the agent's
// namespace. Under a policy the agent looks at nothing below its own
// directories, reached lexically or through a link, and the policy
// refuses the bind.
func TestMaliciousHostWalksIntoShare(t *testing.T) {
	e := newEnv(t)
	share := t.TempDir()
	e.svc.cfg.SharedDir, e.svc.cfg.MountShared = share, func(string, string) error { return nil }
	if err := os.MkdirAll(filepath.Join(share, "c-0", "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(share, link); err != nil {
		t.Fatal(err)
	}
	e.enforce(t, policyDoc(t, volPolicy))
	looked := watchGuestLooks(t)
	for _, src := range []string{filepath.Join(share, "c-0", "sub", "x"), filepath.Join(link, "c-0", "sub", "x"), filepath.Join(e.stateDir, "c1", "shares", "c-0", "sub")} {
		s := e.podSpec(t, "vol", "true")
		s.Mounts = append(s.Mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: src, Options: []string{"rbind", "ro"}})
		e.refused(t, s, "mounts[")
	}
	for _, p := range *looked {
		for _, own := range []string{share, e.stateDir} {
			if p == own || strings.HasPrefix(p, own+"/") {
				t.Errorf("the agent looked at %s, below its own %s", p, own)
			}
		}
	}
}

// TestMaliciousHostSubmountUnderReadOnlyVolume: the host has a writable
// mount below a share entry the policy requires read-only, in the agent's
// namespace (a walk it directed mounted a virtio-fs submount there), or
// gets one mounted below the staged copy before the runtime binds it.
// Under a policy the share is staged without the mounts below it and
// bound without recursion: the container sees the read-only volume all
// the way down, not the writable mount.
func TestMaliciousHostSubmountUnderReadOnlyVolume(t *testing.T) {
	const cm = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/cfg"
	for _, when := range []string{"before staging", "after staging"} {
		t.Run(strings.ReplaceAll(when, " ", "-"), func(t *testing.T) {
			e := newEnv(t)
			share := t.TempDir()
			e.svc.cfg.SharedDir, e.svc.cfg.MountShared = share, func(string, string) error { return nil }
			sub := filepath.Join(share, "c-0", "sub")
			if err := os.MkdirAll(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(sub, "volume-file"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			mountTmpfs := func(dir string) {
				if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m"); err != nil {
					t.Error(err)
					return
				}
				t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
			}
			if when == "before staging" {
				mountTmpfs(sub)
				staged := filepath.Join(e.stateDir, "c", "shares", "c-0")
				testHookSharesStaged = func() {
					// The staged copy holds no mount below it.
					ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(staged))
					if err != nil {
						t.Error(err)
					}
					for _, m := range ms {
						if m.Mountpoint != staged {
							t.Errorf("staged with the host's mount %s below it", m.Mountpoint)
						}
					}
				}
				t.Cleanup(func() { testHookSharesStaged = nil })
			} else {
				testHookSharesStaged = func() { mountTmpfs(filepath.Join(e.stateDir, "c", "shares", "c-0", "sub")) }
				t.Cleanup(func() { testHookSharesStaged = nil })
			}
			e.enforce(t, policyDoc(t, volPolicy))
			s := e.podSpec(t, "vol", "if touch /tmp/sub/w 2>/dev/null; then echo wrote; else echo refused; fi; ls /tmp/sub")
			s.Mounts = append(s.Mounts, specs.Mount{Destination: "/tmp", Type: "bind", Source: cm, Options: []string{"rbind", "ro"}})
			e.create(t, "c", s, pipes(), func(r *agentapi.CreateContainerRequest) {
				r.SharedMounts = []*agentapi.SharedMount{{Source: cm, Name: "c-0"}}
			})
			e.start(t, "c")
			if st := e.wait(t, "c", ""); st != 0 {
				t.Fatalf("exit %d: %s", st, e.readAll(t, "c", "", true))
			}
			if out := e.readAll(t, "c", "", false); out != "refused\nvolume-file\n" {
				t.Errorf("the container's /tmp/sub: %q, want the read-only volume's own directory", out)
			}
			e.remove(t, "c")
			e.assertGone(t, "c")
		})
	}
}

// aliasPolicy allows container "alias" a read-only shared volume on
// /var/run/share and a tmpfs on /run/share/cache: apart as written, the
// same directory in an image whose /var/run links to /run.
var aliasPolicy = shRule("alias", `mounts = [{ destination = "/var/run/share", kind = "shared", read_only = true }, { destination = "/run/share/cache", kind = "tmpfs" }]
`)

// TestMaliciousHostMountBelowShareThroughImageSymlink: crun mounts each
// destination inside the container's root, following its image's
// symlinks, so the tmpfs lands in the host's share (listed after it, the
// share covers it; listed before, the host can detach it by replacing the
// share's entry). The policy's check of the paths as written passes; the
// agent's check of the paths as the root resolves them refuses, in either
// order, before the runtime runs.
func TestMaliciousHostMountBelowShareThroughImageSymlink(t *testing.T) {
	const cm = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/cfg"
	tmpfs := specs.Mount{Destination: "/run/share/cache", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev"}}
	share := specs.Mount{Destination: "/var/run/share", Type: "bind", Source: cm, Options: []string{"rbind", "ro"}}
	for name, ms := range map[string][]specs.Mount{"tmpfs first": {tmpfs, share}, "share first": {share, tmpfs}} {
		t.Run(strings.ReplaceAll(name, " ", "-"), func(t *testing.T) {
			e := newEnv(t)
			dir := t.TempDir()
			e.svc.cfg.SharedDir, e.svc.cfg.MountShared = dir, func(string, string) error { return nil }
			if err := os.MkdirAll(filepath.Join(dir, "c-0"), 0o755); err != nil {
				t.Fatal(err)
			}
			e.enforce(t, policyDoc(t, aliasPolicy))
			s := e.podSpec(t, "alias", "true")
			s.Mounts = append(s.Mounts, ms...)
			_, err := e.agent.CreateContainer(ctxT(t), &agentapi.CreateContainerRequest{ContainerId: "evil", Spec: mustJSON(t, s), Rootfs: rootfsReq(), Stdio: pipes(),
				SharedMounts: []*agentapi.SharedMount{{Source: cm, Name: "c-0"}}})
			assertCode(t, err, codes.PermissionDenied)
			for _, w := range []string{`destination "/run/share/cache" (tmpfs)`, `at or below the shared (virtio-fs) mount on "/var/run/share" ("/run/share" in the container's root`} {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v\ndoes not say %s", err, w)
				}
			}
			e.assertGone(t, "evil")
		})
	}
}
