package ctrdimage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	contentapi "github.com/containerd/containerd/api/services/content/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	namespacesapi "github.com/containerd/containerd/api/services/namespaces/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
)

// fakeContainerd serves the parts of containerd's gRPC API the client
// uses, from memory, per namespace.
type fakeContainerd struct {
	blobs      map[digest.Digest][]byte
	images     map[string]map[string]ocispec.Descriptor // ns -> name -> target
	containers map[string]map[string]*containersapi.Container
	parents    map[string]string // snapshot key -> parent
	// chunk is the size of the content service's messages.
	chunk int
}

func newFake() *fakeContainerd {
	return &fakeContainerd{blobs: map[digest.Digest][]byte{}, images: map[string]map[string]ocispec.Descriptor{},
		containers: map[string]map[string]*containersapi.Container{}, parents: map[string]string{}, chunk: 1000}
}

func (f *fakeContainerd) add(data []byte, mediaType string) ocispec.Descriptor {
	d := digest.FromBytes(data)
	f.blobs[d] = data
	return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))}
}

func (f *fakeContainerd) addJSON(v any, mediaType string) ocispec.Descriptor {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return f.add(data, mediaType)
}

func ns(ctx context.Context) string { n, _ := namespaces.Namespace(ctx); return n }

// One type per service, each with its service's Unimplemented methods.
type (
	containersServer struct {
		containersapi.UnimplementedContainersServer
		*fakeContainerd
	}
	imagesServer struct {
		imagesapi.UnimplementedImagesServer
		*fakeContainerd
	}
	contentServer struct {
		contentapi.UnimplementedContentServer
		*fakeContainerd
	}
	snapshotsServer struct {
		snapshotsapi.UnimplementedSnapshotsServer
		*fakeContainerd
	}
	namespacesServer struct {
		namespacesapi.UnimplementedNamespacesServer
		*fakeContainerd
	}
)

func (f containersServer) Get(ctx context.Context, r *containersapi.GetContainerRequest) (*containersapi.GetContainerResponse, error) {
	c, ok := f.containers[ns(ctx)][r.ID]
	if !ok {
		return nil, errgrpc.ToGRPC(errdefs.ErrNotFound)
	}
	return &containersapi.GetContainerResponse{Container: c}, nil
}

func (f imagesServer) Get(ctx context.Context, r *imagesapi.GetImageRequest) (*imagesapi.GetImageResponse, error) {
	t, ok := f.images[ns(ctx)][r.Name]
	if !ok {
		return nil, errgrpc.ToGRPC(errdefs.ErrNotFound)
	}
	return &imagesapi.GetImageResponse{Image: &imagesapi.Image{Name: r.Name, Target: &types.Descriptor{MediaType: t.MediaType, Digest: t.Digest.String(), Size: t.Size}}}, nil
}

func (f imagesServer) List(ctx context.Context, r *imagesapi.ListImagesRequest) (*imagesapi.ListImagesResponse, error) {
	var out []*imagesapi.Image
	for name, t := range f.images[ns(ctx)] {
		out = append(out, &imagesapi.Image{Name: name, Target: &types.Descriptor{MediaType: t.MediaType, Digest: t.Digest.String(), Size: t.Size}})
	}
	return &imagesapi.ListImagesResponse{Images: out}, nil
}

func (f contentServer) Info(ctx context.Context, r *contentapi.InfoRequest) (*contentapi.InfoResponse, error) {
	data, ok := f.blobs[digest.Digest(r.Digest)]
	if !ok {
		return nil, errgrpc.ToGRPC(errdefs.ErrNotFound)
	}
	return &contentapi.InfoResponse{Info: &contentapi.Info{Digest: r.Digest, Size: int64(len(data))}}, nil
}

func (f contentServer) Read(r *contentapi.ReadContentRequest, s contentapi.Content_ReadServer) error {
	data, ok := f.blobs[digest.Digest(r.Digest)]
	if !ok {
		return errgrpc.ToGRPC(errdefs.ErrNotFound)
	}
	for off := 0; off < len(data); off += f.chunk {
		end := min(off+f.chunk, len(data))
		if err := s.Send(&contentapi.ReadContentResponse{Offset: int64(off), Data: data[off:end]}); err != nil {
			return err
		}
	}
	return nil
}

func (f snapshotsServer) Stat(ctx context.Context, r *snapshotsapi.StatSnapshotRequest) (*snapshotsapi.StatSnapshotResponse, error) {
	p, ok := f.parents[r.Snapshotter+"/"+r.Key]
	if !ok {
		return nil, errgrpc.ToGRPC(errdefs.ErrNotFound)
	}
	return &snapshotsapi.StatSnapshotResponse{Info: &snapshotsapi.Info{Name: r.Key, Parent: p}}, nil
}

func (f namespacesServer) List(ctx context.Context, r *namespacesapi.ListNamespacesRequest) (*namespacesapi.ListNamespacesResponse, error) {
	var out []*namespacesapi.Namespace
	for n := range f.images {
		out = append(out, &namespacesapi.Namespace{Name: n})
	}
	return &namespacesapi.ListNamespacesResponse{Namespaces: out}, nil
}

// serve runs f on a unix socket and returns a Client of it.
func serve(t *testing.T, f *fakeContainerd) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	containersapi.RegisterContainersServer(s, containersServer{fakeContainerd: f})
	imagesapi.RegisterImagesServer(s, imagesServer{fakeContainerd: f})
	contentapi.RegisterContentServer(s, contentServer{fakeContainerd: f})
	snapshotsapi.RegisterSnapshotsServer(s, snapshotsServer{fakeContainerd: f})
	namespacesapi.RegisterNamespacesServer(s, namespacesServer{fakeContainerd: f})
	go s.Serve(l)
	t.Cleanup(s.Stop)
	c, err := Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// testImage stores an image: an OCI index with a manifest for another
// platform, an attestation manifest and a Docker manifest for this one
// with two layers. It returns the index and the expected Image.
func testImage(f *fakeContainerd, name string) (ocispec.Descriptor, Image) {
	layers := [][]byte{bytes.Repeat([]byte("base layer "), 500), []byte("top layer")}
	diffIDs := []digest.Digest{digest.FromString("tar of base"), digest.FromString("tar of top")}
	var descs []ocispec.Descriptor
	for _, l := range layers {
		descs = append(descs, f.add(l, ocispec.MediaTypeImageLayerGzip))
	}
	cfg := f.addJSON(ocispec.Image{Platform: Platform, RootFS: ocispec.RootFS{Type: "layers", DiffIDs: diffIDs}}, mediaTypeDockerConfig)
	man := f.addJSON(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: mediaTypeDockerManifest, Config: cfg, Layers: descs}, mediaTypeDockerManifest)
	other := f.addJSON(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, Config: f.add([]byte("{}"), ocispec.MediaTypeImageConfig)}, ocispec.MediaTypeImageManifest)
	foreign := "s390x"
	if runtime.GOARCH == foreign {
		foreign = "amd64"
	}
	idx := f.addJSON(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, Manifests: []ocispec.Descriptor{
		withPlatform(other, ocispec.Platform{OS: "linux", Architecture: foreign}),
		withPlatform(other, ocispec.Platform{OS: "unknown", Architecture: "unknown"}),
		withPlatform(man, Platform),
	}}, ocispec.MediaTypeImageIndex)
	want := Image{Name: name, Manifest: man.Digest, Config: cfg.Digest}
	for i := range layers {
		want.Layers = append(want.Layers, Layer{DiffID: diffIDs[i], Blob: descs[i]})
	}
	return idx, want
}

func withPlatform(d ocispec.Descriptor, p ocispec.Platform) ocispec.Descriptor {
	d.Platform = &p
	return d
}

func TestContainerImage(t *testing.T) {
	f := newFake()
	const name = "registry.example/app:1"
	idx, want := testImage(f, name)
	f.images["k8s.io"] = map[string]ocispec.Descriptor{name: idx}
	f.containers["k8s.io"] = map[string]*containersapi.Container{
		"app":      {ID: "app", Image: name, Snapshotter: "overlayfs", SnapshotKey: "app"},
		"rootfs":   {ID: "rootfs", Image: name, Snapshotter: "overlayfs", SnapshotKey: "rootfs"},
		"no-image": {ID: "no-image", Snapshotter: "overlayfs", SnapshotKey: "no-image"},
		"gone":     {ID: "gone", Image: "registry.example/removed:1", Snapshotter: "overlayfs", SnapshotKey: "gone"},
	}
	f.parents["overlayfs/app"] = want.ChainID().String()
	f.parents["overlayfs/rootfs"] = "sha256:" + strings.Repeat("0", 64)
	c := serve(t, f)
	ctx := namespaces.WithNamespace(context.Background(), "k8s.io")

	got, err := c.ContainerImage(ctx, "app")
	if err != nil {
		t.Fatal(err)
	}
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if !bytes.Equal(gj, wj) {
		t.Fatalf("ContainerImage:\n got %s\nwant %s", gj, wj)
	}
	for id, msg := range map[string]string{"rootfs": "has parent", "no-image": "has no image", "gone": "no longer in containerd"} {
		if _, err := c.ContainerImage(ctx, id); !errors.Is(err, ErrNotImage) || !strings.Contains(err.Error(), msg) {
			t.Errorf("container %s: %v, want ErrNotImage saying %q", id, err, msg)
		}
	}
	if _, err := c.ContainerImage(ctx, "missing"); !errdefs.IsNotFound(err) {
		t.Errorf("a container containerd does not know: %v", err)
	}
	// Namespaces are containerd's: the same id elsewhere is not found.
	if _, err := c.ContainerImage(namespaces.WithNamespace(context.Background(), "default"), "app"); !errdefs.IsNotFound(err) {
		t.Errorf("container app in namespace default: %v", err)
	}

	// Layer blobs stream whole; HasBlob tells a missing one.
	base := want.Layers[0].Blob
	rc, err := c.OpenBlob(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	data, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || digest.FromBytes(data) != base.Digest {
		t.Fatalf("OpenBlob: %d bytes, %v", len(data), err)
	}
	if ok, err := c.HasBlob(ctx, base.Digest); !ok || err != nil {
		t.Errorf("HasBlob of a stored layer: %v, %v", ok, err)
	}
	delete(f.blobs, base.Digest)
	if ok, err := c.HasBlob(ctx, base.Digest); ok || err != nil {
		t.Errorf("HasBlob of a discarded layer: %v, %v", ok, err)
	}
}

func TestInUse(t *testing.T) {
	f := newFake()
	idx, want := testImage(f, "a")
	f.images["k8s.io"] = map[string]ocispec.Descriptor{"a": idx}
	broken := f.addJSON(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}}, ocispec.MediaTypeImageIndex)
	f.images["default"] = map[string]ocispec.Descriptor{"other-platform-only": broken}
	c := serve(t, f)
	got, skipped, err := c.InUse(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got[want.Layers[0].DiffID] || !got[want.Layers[1].DiffID] {
		t.Errorf("InUse = %v, want the diff IDs of image a", got)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0], "default/other-platform-only") {
		t.Errorf("skipped = %v", skipped)
	}
}

// memBlobs is Blobs from memory.
type memBlobs map[digest.Digest][]byte

func (m memBlobs) ReadBlob(_ context.Context, d ocispec.Descriptor) ([]byte, error) {
	data, ok := m[d.Digest]
	if !ok {
		return nil, errdefs.ErrNotFound
	}
	return data, nil
}

func TestResolveRefuses(t *testing.T) {
	f := newFake()
	idx, _ := testImage(f, "a")
	ctx := context.Background()
	if _, err := Resolve(ctx, memBlobs(f.blobs), "a", idx); err != nil {
		t.Fatal(err)
	}
	// A content store that returns other bytes than the digest names.
	tampered := memBlobs{}
	for d, b := range f.blobs {
		tampered[d] = b
	}
	tampered[idx.Digest] = append([]byte(" "), f.blobs[idx.Digest]...)
	if _, err := Resolve(ctx, tampered, "a", idx); err == nil || !strings.Contains(err.Error(), "bytes of digest") {
		t.Errorf("a tampered index: %v", err)
	}
	// A manifest whose layers and diff IDs disagree in number.
	cfg := f.addJSON(ocispec.Image{RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromString("x")}}}, ocispec.MediaTypeImageConfig)
	man := f.addJSON(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, Config: cfg}, ocispec.MediaTypeImageManifest)
	if _, err := Resolve(ctx, memBlobs(f.blobs), "b", man); err == nil || !strings.Contains(err.Error(), "0 layers but its config 1 diff IDs") {
		t.Errorf("mismatched manifest and config: %v", err)
	}
	// Not an image at all.
	if _, err := Resolve(ctx, memBlobs(f.blobs), "c", ocispec.Descriptor{MediaType: "application/x-other", Digest: man.Digest}); err == nil || !strings.Contains(err.Error(), "not an image index or manifest") {
		t.Errorf("a target of another media type: %v", err)
	}
}
