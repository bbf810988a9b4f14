// Package netnsdo runs code inside another network namespace, on an OS
// thread that is switched there and back. The shim uses it to wire a pod's
// CNI namespace to its VM, the guest agent to configure the pod
// interfaces inside the sandbox container's namespace.
package netnsdo

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread switched into the network namespace at path
// (e.g. /var/run/netns/cni-…, /proc/<pid>/ns/net). Sockets fn opens, and
// devices it creates, belong to that namespace.
func Do(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()
	return switched(func() error {
		if err := netns.Set(target); err != nil {
			return fmt.Errorf("enter network namespace %s: %w", path, err)
		}
		return nil
	}, fn)
}

// Create makes a named network namespace (/var/run/netns/name, as `ip
// netns add` does), runs setup (if not nil) inside it and returns its path.
// Remove deletes it. Tests use them for scratch namespaces.
func Create(name string, setup func() error) (string, error) {
	err := switched(func() error {
		ns, err := netns.NewNamed(name)
		if err != nil {
			return err
		}
		return ns.Close()
	}, func() error {
		if setup == nil {
			return nil
		}
		return setup()
	})
	if err != nil {
		netns.DeleteNamed(name)
		return "", fmt.Errorf("create network namespace %s: %w", name, err)
	}
	return filepath.Join(netnsDir, name), nil
}

// Remove deletes a namespace made by Create.
func Remove(name string) error { return netns.DeleteNamed(name) }

// netnsDir is where named network namespaces are bound.
const netnsDir = "/var/run/netns"

// switched runs fn on a locked OS thread that enter has switched to another
// network namespace, then switches the thread back. The thread runs nothing
// else meanwhile; should it fail to switch back, it stays locked so that Go
// retires it with its goroutine.
func switched(enter, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open the current network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := enter(); err != nil {
			if serr := netns.Set(orig); serr == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return to the original network namespace: %w", err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
