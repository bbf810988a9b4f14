// Package netnsdo runs code inside another network namespace, on an OS
// thread that is switched there and back. The shim uses it to wire a pod's
// CNI namespace to its VM, the guest agent to configure the pod
// interfaces inside the sandbox container's namespace.
package netnsdo

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread switched into the network namespace at path
// (e.g. /var/run/netns/cni-…, /proc/<pid>/ns/net). Sockets fn opens, and
// devices it creates, belong to that namespace. The thread runs nothing else
// meanwhile; should it fail to switch back, it stays locked so that Go
// retires it with its goroutine.
func Do(path string, fn func() error) error {
	target, err := netns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open network namespace %s: %w", path, err)
	}
	defer target.Close()
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
		if err := netns.Set(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter network namespace %s: %w", path, err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("return from network namespace %s: %w", path, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
