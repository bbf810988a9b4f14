package initsys

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestModuleList(t *testing.T) {
	list := "# load order matters\nkernel/drivers/scsi/scsi_mod.ko\n\n  /abs/virtio_scsi.ko  \nkernel/fs/erofs/erofs.ko\n"
	got, err := moduleList(strings.NewReader(list), "/lib/modules/6.12")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/lib/modules/6.12/kernel/drivers/scsi/scsi_mod.ko", "/abs/virtio_scsi.ko", "/lib/modules/6.12/kernel/fs/erofs/erofs.ko"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("moduleList = %q, want %q", got, want)
	}
}

func TestLoadModulesSurvivesBadEntries(t *testing.T) {
	dir := t.TempDir()
	notModule := filepath.Join(dir, "not-a-module.ko")
	if err := os.WriteFile(notModule, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	list := filepath.Join(dir, "modules")
	if err := os.WriteFile(list, []byte(filepath.Join(dir, "missing.ko")+"\n"+notModule+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := LoadModules(list, nil); n != 0 {
		t.Errorf("loaded %d modules from a list of bad ones", n)
	}
	if n := LoadModules(filepath.Join(dir, "no-list"), nil); n != 0 {
		t.Errorf("loaded %d modules without a list", n)
	}
}

func TestCmdlineParam(t *testing.T) {
	cmdline := "console=ttyS0 quiet c8s.log_level=debug panic=-1 c8s.flag\n"
	if v, ok := cmdlineParam(cmdline, "c8s.log_level"); !ok || v != "debug" {
		t.Errorf("c8s.log_level = %q, %v", v, ok)
	}
	if v, ok := cmdlineParam(cmdline, "c8s.flag"); !ok || v != "" {
		t.Errorf("bare flag = %q, %v", v, ok)
	}
	if _, ok := cmdlineParam(cmdline, "c8s.log"); ok {
		t.Error("prefix of a key matched")
	}
}

func TestWantedControllers(t *testing.T) {
	got := wantedControllers([]string{"pids", "rdma", "memory", "misc", "cpu"})
	if want := []string{"cpu", "memory", "pids"}; !reflect.DeepEqual(got, want) {
		t.Errorf("wantedControllers = %q, want %q", got, want)
	}
}

func TestDeferredModules(t *testing.T) {
	const dir = "/lib/modules/6.12/kernel/"
	for path, want := range map[string]bool{
		dir + "drivers/scsi/virtio_scsi.ko":              false,
		dir + "drivers/scsi/sd_mod.ko":                   false,
		dir + "drivers/virt/coco/sev-guest/sev-guest.ko": true,
		dir + "net/vmw_vsock/vsock.ko":                   true,
		dir + "drivers/md/dm-verity.ko":                  true,
		dir + "fs/erofs/erofs.ko":                        true,
		dir + "fs/overlayfs/overlay.ko":                  true,
		dir + "drivers/virtio/virtio_balloon.ko":         true,
	} {
		if got := Deferred(path); got != want {
			t.Errorf("Deferred(%s) = %v, want %v", path, got, want)
		}
	}
	if !Deferred(dir+"net/vmw_vsock/vsock.ko", "/net/vmw_vsock/") || Deferred(dir+"fs/erofs/erofs.ko", "/net/vmw_vsock/") {
		t.Error("Deferred with explicit fragments matches the wrong modules")
	}
}

func TestLoadModulesSkipsLiveModules(t *testing.T) {
	dir := t.TempDir()
	sys := filepath.Join(dir, "sys")
	for name, state := range map[string]string{"dm_mod": "live\n", "overlay": "coming\n"} {
		if err := os.MkdirAll(filepath.Join(sys, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(sys, name, "initstate"), []byte(state), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	list := filepath.Join(dir, "modules")
	mods := []string{"/m/kernel/drivers/md/dm-mod.ko", "/m/kernel/fs/overlayfs/overlay.ko", "/m/kernel/drivers/scsi/sd_mod.ko"}
	if err := os.WriteFile(list, []byte(strings.Join(mods, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	oldSys, oldFinit := sysModuleDir, finitModule
	defer func() { sysModuleDir, finitModule = oldSys, oldFinit }()
	var loaded []string
	sysModuleDir = sys
	finitModule = func(path string) error { loaded = append(loaded, filepath.Base(path)); return nil }
	if n := LoadModules(list, nil); n != 2 {
		t.Errorf("LoadModules = %d, want 2", n)
	}
	// dm-mod is live (skipped); overlay is still coming up (loaded: the
	// kernel waits for it); sd_mod is not there.
	if want := []string{"overlay.ko", "sd_mod.ko"}; !reflect.DeepEqual(loaded, want) {
		t.Errorf("loaded %q, want %q", loaded, want)
	}
}

// A module load a signal interrupts (EINTR) is tried again, not lost.
func TestLoadModulesRetriesEINTR(t *testing.T) {
	dir := t.TempDir()
	list := filepath.Join(dir, "modules")
	if err := os.WriteFile(list, []byte("/m/kernel/fs/overlayfs/overlay.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	oldSys, oldFinit := sysModuleDir, finitModule
	defer func() { sysModuleDir, finitModule = oldSys, oldFinit }()
	sysModuleDir = t.TempDir()
	calls := 0
	finitModule = func(string) error {
		calls++
		if calls < 3 {
			return unix.EINTR
		}
		return nil
	}
	if n := LoadModules(list, nil); n != 1 || calls != 3 {
		t.Errorf("LoadModules = %d after %d finit_module calls, want 1 after 3 (two interrupted)", n, calls)
	}
}

// A module is loaded with its ModuleParams, by the kernel's name of the
// module (dashes become underscores): scsi_mod with scan=manual, others
// with none.
func TestLoadModulePassesItsParameters(t *testing.T) {
	old := finitModuleFd
	defer func() { finitModuleFd = old }()
	got := map[string]string{}
	finitModuleFd = func(fd int, params string, flags int) error {
		name, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
		if err != nil {
			return err
		}
		got[filepath.Base(name)] = params
		return nil
	}
	dir := t.TempDir()
	for _, name := range []string{"scsi_mod.ko", "dm-verity.ko"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := loadModule(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	if got["scsi_mod.ko"] != "scan=manual" || got["dm-verity.ko"] != "" {
		t.Errorf("modules loaded with %q, want scsi_mod.ko with scan=manual and dm-verity.ko with none", got)
	}
	if moduleName("/x/dm-verity.ko") != "dm_verity" {
		t.Errorf("moduleName(dm-verity.ko) = %q, want dm_verity", moduleName("/x/dm-verity.ko"))
	}
}
