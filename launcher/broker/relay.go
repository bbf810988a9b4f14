package broker

import (
	"context"
	"net"

	"github.com/hashicorp/yamux"

	"github.com/c8s-dev/c8s/launcher/broker/relay"
)

// MuxConfig is the yamux configuration both ends of the relay port use
// (relay.MuxConfig).
func MuxConfig() *yamux.Config { return relay.MuxConfig() }

// Relay carries byte streams from the guest to the key broker at addr
// (relay.Relay, which the shim calls without linking the broker).
func Relay(ctx context.Context, port net.Conn, addr string) error {
	return relay.Relay(ctx, port, addr)
}
