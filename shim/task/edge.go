package task

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/shim"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/ttrpc"
)

// The ttrpc edge. The service's methods return containerd errdefs errors;
// one unary server interceptor turns them into gRPC status errors for
// every service on the shim's server (the task API and the Admin API), as
// c8s-agent's server does in the guest. containerd's shim framework
// chains the interceptors of its ttrpc plugins into the server it builds.

var _ shim.TTRPCServerUnaryOptioner = (*service)(nil)

// UnaryServerInterceptor returns the interceptor the shim's ttrpc server
// runs around each call.
func (s *service) UnaryServerInterceptor() ttrpc.UnaryServerInterceptor {
	return errorsToGRPC
}

// errorsToGRPC converts the error of a call into a gRPC status carrying
// its errdefs class (ErrNotFound: codes.NotFound, ...) and its message,
// which containerd's client turns back into the errdefs error. A status
// error passes unchanged; an error of no errdefs class is Unknown.
func errorsToGRPC(ctx context.Context, unmarshal ttrpc.Unmarshaler, _ *ttrpc.UnaryServerInfo, method ttrpc.Method) (interface{}, error) {
	resp, err := method(ctx, unmarshal)
	if err != nil {
		return nil, errgrpc.ToGRPC(err)
	}
	return resp, nil
}
