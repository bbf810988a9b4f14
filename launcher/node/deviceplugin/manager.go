package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
)

// Manager runs one Plugin per resource and keeps the set in line with
// what discovery finds: Update starts plugins for new resources, stops
// those for resources that are gone and passes changed device lists on.
type Manager struct {
	ctx context.Context
	dir string

	mu      sync.Mutex
	plugins map[string]*managed
}

type managed struct {
	p       *Plugin
	devices []Device
	cancel  context.CancelFunc
	done    chan error
}

// NewManager returns a Manager whose plugins serve in dir (the kubelet's
// device-plugins directory; empty for the default) until ctx ends or Stop.
func NewManager(ctx context.Context, dir string) *Manager {
	return &Manager{ctx: ctx, dir: dir, plugins: map[string]*managed{}}
}

// Update serves exactly the resources in want, each with its devices.
func (m *Manager) Update(want map[string][]Device) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for name, mp := range m.plugins {
		if _, keep := want[name]; !keep {
			mp.stop()
			delete(m.plugins, name)
		}
	}
	for name, devs := range want {
		if mp, ok := m.plugins[name]; ok {
			if !reflect.DeepEqual(mp.devices, devs) {
				mp.p.SetDevices(devs)
				mp.devices = append([]Device(nil), devs...)
			}
			continue
		}
		p, err := New(Options{ResourceName: name, Dir: m.dir, Devices: devs})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ctx, cancel := context.WithCancel(m.ctx)
		mp := &managed{p: p, devices: append([]Device(nil), devs...), cancel: cancel, done: make(chan error, 1)}
		go func() { mp.done <- p.Run(ctx) }()
		m.plugins[name] = mp
	}
	return errors.Join(errs...)
}

// Plugin returns the running plugin for resource, or nil.
func (m *Manager) Plugin(resource string) *Plugin {
	m.mu.Lock()
	defer m.mu.Unlock()
	if mp, ok := m.plugins[resource]; ok {
		return mp.p
	}
	return nil
}

// Stop stops every plugin and removes their sockets. It returns the first
// error a plugin's Run ended with.
func (m *Manager) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for name, mp := range m.plugins {
		if err := mp.stop(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		delete(m.plugins, name)
	}
	return errors.Join(errs...)
}

func (mp *managed) stop() error {
	mp.cancel()
	return <-mp.done
}
