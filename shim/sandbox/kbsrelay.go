package sandbox

import (
	"context"
	"fmt"

	"github.com/containerd/log"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/launcher/broker/relay"
	"github.com/c8s-dev/c8s/launcher/vm"
	"github.com/c8s-dev/c8s/launcher/vm/tee"
)

// startKBSRelay relays the guest's streams on the c8s.kbs port to the key
// broker the pod's init data names, when it names one. The relay sees
// only the TLS the guest runs end to end with the broker; the address
// comes from the measured init data, so pointing it elsewhere only makes
// the guest's pinned TLS fail.
func startKBSRelay(ctx context.Context, v *vm.VM, data []byte) error {
	doc, err := initdata.Parse(data)
	if err != nil {
		return err
	}
	if doc.KBS.URL == "" {
		return nil
	}
	addr, err := doc.KBS.Address()
	if err != nil {
		return err
	}
	port, err := v.DialPort(ctx, tee.KBSPort)
	if err != nil {
		return fmt.Errorf("the key broker relay: %w", err)
	}
	l := log.G(ctx).WithField("broker", addr)
	go func() {
		if err := relay.Relay(log.WithLogger(ctx, l), port, addr); err != nil {
			l.WithError(err).Warn("key broker relay stopped")
		}
	}()
	l.Debug("relaying the guest's key broker streams")
	return nil
}
