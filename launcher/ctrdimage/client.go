package ctrdimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	containersapi "github.com/containerd/containerd/api/services/containers/v1"
	contentapi "github.com/containerd/containerd/api/services/content/v1"
	imagesapi "github.com/containerd/containerd/api/services/images/v1"
	namespacesapi "github.com/containerd/containerd/api/services/namespaces/v1"
	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Client reads containerd's containers, images and content. Calls take
// the containerd namespace from their context (namespaces.WithNamespace).
type Client struct {
	conn       *grpc.ClientConn
	containers containersapi.ContainersClient
	images     imagesapi.ImagesClient
	content    contentapi.ContentClient
	snapshots  snapshotsapi.SnapshotsClient
	namespaces namespacesapi.NamespacesClient
}

// Dial connects to containerd's gRPC socket at address (a path). The
// connection is made on first use.
func Dial(address string) (*Client, error) {
	address = strings.TrimPrefix(address, "unix://")
	conn, err := grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("containerd at %s: %w", address, err)
	}
	return NewClient(conn), nil
}

// NewClient uses an established connection.
func NewClient(conn *grpc.ClientConn) *Client {
	return &Client{
		conn:       conn,
		containers: containersapi.NewContainersClient(conn),
		images:     imagesapi.NewImagesClient(conn),
		content:    contentapi.NewContentClient(conn),
		snapshots:  snapshotsapi.NewSnapshotsClient(conn),
		namespaces: namespacesapi.NewNamespacesClient(conn),
	}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// ContainerImage returns the image container id runs, resolved for
// Platform, after checking that the container's snapshot is that image
// unchanged: its parent is the image's chain ID. It returns an error
// wrapping ErrNotImage when the container has no image, the image is gone
// from containerd, or its snapshot has another parent (a root prepared
// from something else, as `ctr run --rootfs` does).
func (c *Client) ContainerImage(ctx context.Context, id string) (Image, error) {
	cr, err := c.containers.Get(ctx, &containersapi.GetContainerRequest{ID: id})
	if err != nil {
		return Image{}, fmt.Errorf("container %s in containerd: %w", id, errgrpc.ToNative(err))
	}
	ctr := cr.Container
	if ctr.Image == "" {
		return Image{}, fmt.Errorf("container %s has no image: %w", id, ErrNotImage)
	}
	ir, err := c.images.Get(ctx, &imagesapi.GetImageRequest{Name: ctr.Image})
	if err != nil {
		err = errgrpc.ToNative(err)
		if errdefs.IsNotFound(err) {
			return Image{}, fmt.Errorf("image %s of container %s is no longer in containerd: %w", ctr.Image, id, ErrNotImage)
		}
		return Image{}, fmt.Errorf("image %s of container %s: %w", ctr.Image, id, err)
	}
	t := ir.Image.Target
	im, err := Resolve(ctx, c, ctr.Image, ocispec.Descriptor{MediaType: t.MediaType, Digest: digest.Digest(t.Digest), Size: t.Size})
	if err != nil {
		return Image{}, err
	}
	if ctr.SnapshotKey == "" {
		return Image{}, fmt.Errorf("container %s has no snapshot of image %s: %w", id, ctr.Image, ErrNotImage)
	}
	sr, err := c.snapshots.Stat(ctx, &snapshotsapi.StatSnapshotRequest{Snapshotter: ctr.Snapshotter, Key: ctr.SnapshotKey})
	if err != nil {
		return Image{}, fmt.Errorf("snapshot %s of container %s (%s): %w", ctr.SnapshotKey, id, ctr.Snapshotter, errgrpc.ToNative(err))
	}
	if want := im.ChainID().String(); sr.Info.Parent != want {
		return Image{}, fmt.Errorf("the snapshot of container %s has parent %q, not image %s (chain %s): %w", id, sr.Info.Parent, ctr.Image, want, ErrNotImage)
	}
	return im, nil
}

// Image returns the image name of the context's namespace, resolved for
// Platform.
func (c *Client) Image(ctx context.Context, name string) (Image, error) {
	ir, err := c.images.Get(ctx, &imagesapi.GetImageRequest{Name: name})
	if err != nil {
		return Image{}, fmt.Errorf("image %s: %w", name, errgrpc.ToNative(err))
	}
	t := ir.Image.Target
	return Resolve(ctx, c, name, ocispec.Descriptor{MediaType: t.MediaType, Digest: digest.Digest(t.Digest), Size: t.Size})
}

// HasBlob reports whether the content store holds the blob d.
func (c *Client) HasBlob(ctx context.Context, d digest.Digest) (bool, error) {
	_, err := c.content.Info(ctx, &contentapi.InfoRequest{Digest: d.String()})
	if err == nil {
		return true, nil
	}
	if err = errgrpc.ToNative(err); errdefs.IsNotFound(err) {
		return false, nil
	}
	return false, err
}

// ReadBlob reads a whole blob into memory (see Blobs).
func (c *Client) ReadBlob(ctx context.Context, desc ocispec.Descriptor) ([]byte, error) {
	rc, err := c.OpenBlob(ctx, desc)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, desc.Size+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) != desc.Size {
		return nil, fmt.Errorf("blob %s: %d bytes, the descriptor says %d", desc.Digest, len(data), desc.Size)
	}
	return data, nil
}

// OpenBlob streams a blob from the content store. The reader does not
// check the digest: the caller does (the layer cache checks the diff ID
// of what it unpacks).
func (c *Client) OpenBlob(ctx context.Context, desc ocispec.Descriptor) (io.ReadCloser, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.content.Read(ctx, &contentapi.ReadContentRequest{Digest: desc.Digest.String()})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("read blob %s: %w", desc.Digest, errgrpc.ToNative(err))
	}
	return &blobReader{stream: stream, cancel: cancel, digest: desc.Digest}, nil
}

type blobReader struct {
	stream contentapi.Content_ReadClient
	cancel context.CancelFunc
	digest digest.Digest
	buf    []byte
	err    error
}

func (r *blobReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		resp, err := r.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				r.err = io.EOF
			} else {
				r.err = fmt.Errorf("read blob %s: %w", r.digest, errgrpc.ToNative(err))
			}
			continue
		}
		r.buf = resp.Data
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (r *blobReader) Close() error {
	r.cancel()
	return nil
}

// InUse returns the diff IDs of the layers of every image in every
// namespace of containerd, resolved for Platform: what the layer cache
// keeps unless told to ignore images. An image that cannot be resolved
// (its content partly gone) is skipped and reported in skipped.
func (c *Client) InUse(ctx context.Context) (diffIDs map[digest.Digest]bool, skipped []string, err error) {
	nr, err := c.namespaces.List(ctx, &namespacesapi.ListNamespacesRequest{})
	if err != nil {
		return nil, nil, fmt.Errorf("list containerd's namespaces: %w", errgrpc.ToNative(err))
	}
	diffIDs = map[digest.Digest]bool{}
	for _, ns := range nr.Namespaces {
		nctx := namespaces.WithNamespace(ctx, ns.Name)
		ir, err := c.images.List(nctx, &imagesapi.ListImagesRequest{})
		if err != nil {
			return nil, nil, fmt.Errorf("list the images of namespace %s: %w", ns.Name, errgrpc.ToNative(err))
		}
		for _, img := range ir.Images {
			t := img.Target
			im, err := Resolve(nctx, c, img.Name, ocispec.Descriptor{MediaType: t.MediaType, Digest: digest.Digest(t.Digest), Size: t.Size})
			if err != nil {
				skipped = append(skipped, fmt.Sprintf("%s/%s: %v", ns.Name, img.Name, err))
				continue
			}
			for _, l := range im.Layers {
				diffIDs[l.DiffID] = true
			}
		}
	}
	return diffIDs, skipped, nil
}
