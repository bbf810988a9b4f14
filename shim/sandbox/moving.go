package sandbox

import (
	"context"

	agent "github.com/c8s-dev/c8s/guest/api/agent/v1"
)

// movingAgent and movingIO are the Sandbox's Agent and IO: each call goes
// to the current agent connection and is retried on the destination when
// a migration cut it off.
type (
	movingAgent       struct{ s *Sandbox }
	movingIO          struct{ s *Sandbox }
	movingPortForward struct{ s *Sandbox }
)

var (
	_ agent.AgentService       = movingAgent{}
	_ agent.IOService          = movingIO{}
	_ agent.PortForwardService = movingPortForward{}
)

func (m movingAgent) GetInfo(ctx context.Context, r *agent.GetInfoRequest) (*agent.GetInfoResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.GetInfoResponse, error) { return c.agent.GetInfo(ctx, r) })
}

func (m movingAgent) CreateContainer(ctx context.Context, r *agent.CreateContainerRequest) (*agent.CreateContainerResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.CreateContainerResponse, error) { return c.agent.CreateContainer(ctx, r) })
}

func (m movingAgent) StartContainer(ctx context.Context, r *agent.StartContainerRequest) (*agent.StartContainerResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.StartContainerResponse, error) { return c.agent.StartContainer(ctx, r) })
}

func (m movingAgent) RemoveContainer(ctx context.Context, r *agent.RemoveContainerRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.RemoveContainer(ctx, r) })
}

func (m movingAgent) ExecProcess(ctx context.Context, r *agent.ExecProcessRequest) (*agent.ExecProcessResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.ExecProcessResponse, error) { return c.agent.ExecProcess(ctx, r) })
}

func (m movingAgent) WaitProcess(ctx context.Context, r *agent.ProcessRequest) (*agent.WaitProcessResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.WaitProcessResponse, error) { return c.agent.WaitProcess(ctx, r) })
}

func (m movingAgent) SignalProcess(ctx context.Context, r *agent.SignalProcessRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.SignalProcess(ctx, r) })
}

func (m movingAgent) DeleteProcess(ctx context.Context, r *agent.ProcessRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.DeleteProcess(ctx, r) })
}

func (m movingAgent) ResizePty(ctx context.Context, r *agent.ResizePtyRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.ResizePty(ctx, r) })
}

func (m movingAgent) CloseStdin(ctx context.Context, r *agent.ProcessRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.CloseStdin(ctx, r) })
}

func (m movingAgent) ListPids(ctx context.Context, r *agent.ListPidsRequest) (*agent.ListPidsResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.ListPidsResponse, error) { return c.agent.ListPids(ctx, r) })
}

func (m movingAgent) Stats(ctx context.Context, r *agent.StatsRequest) (*agent.StatsResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.StatsResponse, error) { return c.agent.Stats(ctx, r) })
}

func (m movingAgent) UpdateContainer(ctx context.Context, r *agent.UpdateContainerRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.UpdateContainer(ctx, r) })
}

func (m movingAgent) OnlineCPUMem(ctx context.Context, r *agent.OnlineCPUMemRequest) (*agent.OnlineCPUMemResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.OnlineCPUMemResponse, error) { return c.agent.OnlineCPUMem(ctx, r) })
}

func (m movingAgent) Shutdown(ctx context.Context, r *agent.Empty) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.Shutdown(ctx, r) })
}

func (m movingAgent) GetEvidence(ctx context.Context, r *agent.GetEvidenceRequest) (*agent.GetEvidenceResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.GetEvidenceResponse, error) { return c.agent.GetEvidence(ctx, r) })
}

func (m movingAgent) SetInitData(ctx context.Context, r *agent.SetInitDataRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.agent.SetInitData(ctx, r) })
}

func (m movingIO) ReadStdout(ctx context.Context, r *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.ReadStreamResponse, error) { return c.io.ReadStdout(ctx, r) })
}

func (m movingIO) ReadStderr(ctx context.Context, r *agent.ReadStreamRequest) (*agent.ReadStreamResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.ReadStreamResponse, error) { return c.io.ReadStderr(ctx, r) })
}

func (m movingIO) WriteStdin(ctx context.Context, r *agent.WriteStdinRequest) (*agent.WriteStdinResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.WriteStdinResponse, error) { return c.io.WriteStdin(ctx, r) })
}

func (m movingPortForward) ListenPorts(ctx context.Context, r *agent.ListenPortsRequest) (*agent.ListenPortsResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.ListenPortsResponse, error) { return c.forward.ListenPorts(ctx, r) })
}

func (m movingPortForward) Dial(ctx context.Context, r *agent.DialRequest) (*agent.DialResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.DialResponse, error) { return c.forward.Dial(ctx, r) })
}

func (m movingPortForward) Read(ctx context.Context, r *agent.ConnReadRequest) (*agent.ConnReadResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.ConnReadResponse, error) { return c.forward.Read(ctx, r) })
}

func (m movingPortForward) Write(ctx context.Context, r *agent.ConnWriteRequest) (*agent.ConnWriteResponse, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.ConnWriteResponse, error) { return c.forward.Write(ctx, r) })
}

func (m movingPortForward) Close(ctx context.Context, r *agent.ConnCloseRequest) (*agent.Empty, error) {
	return call(ctx, m.s, func(c *agentConn) (*agent.Empty, error) { return c.forward.Close(ctx, r) })
}
