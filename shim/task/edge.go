package task

import (
	"context"

	taskAPI "github.com/containerd/containerd/api/runtime/task/v3"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"google.golang.org/protobuf/types/known/emptypb"
)

// edge is the ttrpc face of the service: it converts errdefs errors into
// gRPC status errors, and nothing else.
type edge struct{ s *service }

func grpcErr[T any](v T, err error) (T, error) {
	if err != nil {
		var zero T
		return zero, errgrpc.ToGRPC(err)
	}
	return v, nil
}

func (e *edge) State(ctx context.Context, r *taskAPI.StateRequest) (*taskAPI.StateResponse, error) {
	return grpcErr(e.s.State(ctx, r))
}
func (e *edge) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (*taskAPI.CreateTaskResponse, error) {
	return grpcErr(e.s.Create(ctx, r))
}
func (e *edge) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error) {
	return grpcErr(e.s.Start(ctx, r))
}
func (e *edge) Delete(ctx context.Context, r *taskAPI.DeleteRequest) (*taskAPI.DeleteResponse, error) {
	return grpcErr(e.s.Delete(ctx, r))
}
func (e *edge) Pids(ctx context.Context, r *taskAPI.PidsRequest) (*taskAPI.PidsResponse, error) {
	return grpcErr(e.s.Pids(ctx, r))
}
func (e *edge) Pause(ctx context.Context, r *taskAPI.PauseRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.Pause(ctx, r))
}
func (e *edge) Resume(ctx context.Context, r *taskAPI.ResumeRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.Resume(ctx, r))
}
func (e *edge) Checkpoint(ctx context.Context, r *taskAPI.CheckpointTaskRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.Checkpoint(ctx, r))
}
func (e *edge) Kill(ctx context.Context, r *taskAPI.KillRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.Kill(ctx, r))
}
func (e *edge) Exec(ctx context.Context, r *taskAPI.ExecProcessRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.Exec(ctx, r))
}
func (e *edge) ResizePty(ctx context.Context, r *taskAPI.ResizePtyRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.ResizePty(ctx, r))
}
func (e *edge) CloseIO(ctx context.Context, r *taskAPI.CloseIORequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.CloseIO(ctx, r))
}
func (e *edge) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.Update(ctx, r))
}
func (e *edge) Wait(ctx context.Context, r *taskAPI.WaitRequest) (*taskAPI.WaitResponse, error) {
	return grpcErr(e.s.Wait(ctx, r))
}
func (e *edge) Stats(ctx context.Context, r *taskAPI.StatsRequest) (*taskAPI.StatsResponse, error) {
	return grpcErr(e.s.Stats(ctx, r))
}
func (e *edge) Connect(ctx context.Context, r *taskAPI.ConnectRequest) (*taskAPI.ConnectResponse, error) {
	return grpcErr(e.s.Connect(ctx, r))
}
func (e *edge) Shutdown(ctx context.Context, r *taskAPI.ShutdownRequest) (*emptypb.Empty, error) {
	return grpcErr(e.s.Shutdown(ctx, r))
}
