package sandbox

import agent "github.com/c8s-dev/c8s/guest/api/agent/v1"

// PortForward is the agent's PortForward service, on the current agent
// connection as Agent and IO are. The shim uses it through the forwarder
// that Options.PortForward starts; tests that play the host call it
// directly.
func (s *Sandbox) PortForward() agent.PortForwardService { return movingPortForward{s} }
