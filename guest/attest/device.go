package attest

import (
	"context"
	"fmt"
	"sync"
)

// device is a TEE guest driver's ioctl device, opened for each request and
// used by one request at a time.
type device[D interface{ Close() error }] struct {
	name string
	path string
	mu   sync.Mutex
	open func(path string) (D, error)
}

// Name is the provider's name.
func (d *device[D]) Name() string { return d.name }

// Path is the device the provider opens.
func (d *device[D]) Path() string { return d.path }

// use opens the device and runs f on it.
func (d *device[D]) use(ctx context.Context, f func(D) (*Evidence, error)) (*Evidence, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	dev, err := d.open(d.path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", d.name, err)
	}
	defer dev.Close()
	return f(dev)
}
