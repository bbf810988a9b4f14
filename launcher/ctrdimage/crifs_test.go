package ctrdimage

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeCRI is CRI's image service with the generated code (which the
// shim does not link): its ImageFsInfo answers resp, or err.
type fakeCRI struct {
	runtimeapi.UnimplementedImageServiceServer
	resp *runtimeapi.ImageFsInfoResponse
	err  error
	got  chan *runtimeapi.ImageFsInfoRequest
}

func (f *fakeCRI) ImageFsInfo(_ context.Context, r *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	f.got <- r
	return f.resp, f.err
}

// serveCRI serves svc (nil: no image service at all) and returns a
// connection to it.
func serveCRI(t *testing.T, svc runtimeapi.ImageServiceServer) *grpc.ClientConn {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	if svc != nil {
		runtimeapi.RegisterImageServiceServer(s, svc)
	}
	go s.Serve(l)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func fs(mountpoint string) *runtimeapi.FilesystemUsage {
	return &runtimeapi.FilesystemUsage{Timestamp: 42, FsId: &runtimeapi.FilesystemIdentifier{Mountpoint: mountpoint},
		UsedBytes: &runtimeapi.UInt64Value{Value: 1 << 30}, InodesUsed: &runtimeapi.UInt64Value{Value: 7}}
}

// The hand-decoded ImageFsInfo call reads what the generated server
// sends: the image file systems' mountpoints in order, not the container
// file systems', "" for one without an identifier.
func TestImageFSMountpointsAgainstCRI(t *testing.T) {
	f := &fakeCRI{got: make(chan *runtimeapi.ImageFsInfoRequest, 1), resp: &runtimeapi.ImageFsInfoResponse{
		ImageFilesystems:     []*runtimeapi.FilesystemUsage{fs("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs"), {Timestamp: 1}, fs("/b")},
		ContainerFilesystems: []*runtimeapi.FilesystemUsage{fs("/containers")},
	}}
	got, err := imageFSMountpoints(context.Background(), serveCRI(t, f))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs", "", "/b"}
	if !slices.Equal(got, want) {
		t.Errorf("mountpoints %q, want %q", got, want)
	}
	if r := <-f.got; !proto.Equal(r, &runtimeapi.ImageFsInfoRequest{}) {
		t.Errorf("the server got %v, want an empty ImageFsInfoRequest", r)
	}
}

// Errors keep their gRPC status (imageSnapshotter tells an Unimplemented
// CRI apart), for a CRI that refuses the call and for a containerd
// without CRI.
func TestImageFSMountpointsErrors(t *testing.T) {
	f := &fakeCRI{got: make(chan *runtimeapi.ImageFsInfoRequest, 1), err: status.Error(codes.Unavailable, "stats not collected yet")}
	if _, err := imageFSMountpoints(context.Background(), serveCRI(t, f)); status.Code(err) != codes.Unavailable {
		t.Errorf("error %v, want code Unavailable", err)
	}
	if _, err := imageFSMountpoints(context.Background(), serveCRI(t, nil)); status.Code(err) != codes.Unimplemented {
		t.Errorf("without an image service: error %v, want code Unimplemented", err)
	}
}

func TestParseImageFsInfo(t *testing.T) {
	full, err := proto.Marshal(&runtimeapi.ImageFsInfoResponse{ImageFilesystems: []*runtimeapi.FilesystemUsage{fs("/a")}})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		in   []byte
		want []string
		bad  bool
	}{
		"empty answer":         {in: nil, want: nil},
		"one file system":      {in: full, want: []string{"/a"}},
		"unknown fields":       {in: append([]byte{0xf8, 0x01, 0x05}, full...), want: []string{"/a"}}, // field 31, varint 5
		"truncated":            {in: full[:len(full)-1], bad: true},
		"bad tag":              {in: []byte{0x00}, bad: true},
		"length past the end":  {in: []byte{0x0a, 0x10, 0x12}, bad: true},
		"bad nested fs_id":     {in: []byte{0x0a, 0x02, 0x12, 0x05}, bad: true},
		"mountpoint not bytes": {in: []byte{0x0a, 0x04, 0x12, 0x02, 0x08, 0x01}, want: []string{""}}, // fs_id{mountpoint as varint}: ignored
	} {
		t.Run(name, func(t *testing.T) {
			got, err := parseImageFsInfo(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("no error, got %q", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRawCodecRefusesOtherTypes(t *testing.T) {
	if _, err := (rawCodec{}).Marshal("x"); err == nil {
		t.Error("Marshal of a string: no error")
	}
	var s string
	if err := (rawCodec{}).Unmarshal([]byte{1}, &s); err == nil {
		t.Error("Unmarshal into a string: no error")
	}
}
