package netnsdo

import (
	"fmt"
	"os"
	"testing"

	"github.com/vishvananda/netns"
)

func current(t *testing.T) netns.NsHandle {
	t.Helper()
	h, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestCreateDoRemove(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
	name := fmt.Sprintf("c8snetnsdo-%d", os.Getpid())
	var inSetup, inDo string
	path, err := Create(name, func() error {
		h, err := netns.Get()
		inSetup = h.UniqueId()
		h.Close()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(name) })
	mine := current(t)
	defer mine.Close()
	if inSetup == mine.UniqueId() {
		t.Fatal("setup ran in the caller's network namespace")
	}
	if err := Do(path, func() error {
		h, err := netns.Get()
		inDo = h.UniqueId()
		h.Close()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inDo != inSetup {
		t.Fatalf("Do ran in %s, want the created namespace %s", inDo, inSetup)
	}
	if err := Remove(name); err != nil {
		t.Fatal(err)
	}
	if err := Do(path, func() error { return nil }); err == nil {
		t.Fatal("Do entered a removed namespace")
	}
	if _, err := Create(name+"/x", nil); err == nil {
		t.Fatal("Create accepted a name with a slash")
	}
}
