package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/launcher/admin/diag"
	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/measurements/layer"
)

// imageFSJSON is what `layers prune|sync --json` say of the layers'
// counts in containerd's image file system.
type imageFSJSON struct {
	Counted   []digest.Digest `json:"imagefs_counted"`
	Uncounted []digest.Digest `json:"imagefs_uncounted"`
	Problem   string          `json:"imagefs_problem,omitempty"`
}

func newImageFSJSON(s layercache.Synced, err error) imageFSJSON {
	j := imageFSJSON{Counted: s.Added, Uncounted: s.Removed}
	if j.Counted == nil {
		j.Counted = []digest.Digest{}
	}
	if j.Uncounted == nil {
		j.Uncounted = []digest.Digest{}
	}
	if err != nil {
		j.Problem = err.Error()
	}
	return j
}

// printSynced tells what SyncAccounts did; its failure is a warning, as
// the cache itself is fine.
func printSynced(w io.Writer, s layercache.Synced, err error) {
	if len(s.Added) > 0 || len(s.Removed) > 0 {
		fmt.Fprintf(w, "image file system: %d layers counted, %d counts of removed layers dropped\n", len(s.Added), len(s.Removed))
	}
	switch {
	case errors.Is(err, layercache.ErrNoImageFS):
		fmt.Fprintf(w, "note: %v: the layers are not counted anywhere\n", err)
	case err != nil:
		fmt.Fprintf(w, "warning: image file system: %v\n", err)
	}
}

// openCountedCache opens the cache of the configuration at cfgPath,
// counting its layers in the image file system of the containerd at
// address.
func openCountedCache(cfgPath, address string) (*layercache.Cache, error) {
	if address == "" {
		return nil, errors.New("--containerd-address is empty: the layers are counted in containerd")
	}
	c, err := openLayerCache(cfgPath)
	if err != nil {
		return nil, err
	}
	c.Account(ctrdimage.NewImageFS(address, c.Dir()))
	return c, nil
}

func runLayersSync(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("layers sync")
	cfgPath := fs.String("config", "", "c8s configuration (default "+DefaultConfigPath+" if present, else built-in defaults)")
	ctrdAddr := fs.String("containerd-address", diag.DefaultContainerdAddress, "containerd's gRPC socket, whose image file system counts the layers")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := openCountedCache(*cfgPath, *ctrdAddr)
	if err != nil {
		return err
	}
	s, err := c.SyncAccounts(ctx)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if encErr := enc.Encode(newImageFSJSON(s, err)); encErr != nil {
			return encErr
		}
	} else {
		var note error // other errors are the command's
		if err == layercache.ErrNoImageFS {
			note = err
		}
		printSynced(stdout, s, note)
		if len(s.Added) == 0 && len(s.Removed) == 0 && err == nil {
			fmt.Fprintln(stdout, "image file system: every cached layer is counted")
		}
	}
	if err == layercache.ErrNoImageFS {
		return nil // nothing measures images there: nothing to count
	}
	return err
}

// convertRefPod is the pod name of the reference `layers convert` holds
// while it builds a layer.
const convertRefPod = "c8s-launcher layers convert"

func runLayersConvert(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("layers convert")
	cfgPath := fs.String("config", "", "c8s configuration (default "+DefaultConfigPath+" if present, else built-in defaults)")
	ctrdAddr := fs.String("containerd-address", diag.DefaultContainerdAddress, "containerd's gRPC socket, holding the images")
	ns := fs.String("namespace", ctrdimage.CRINamespace, "containerd namespace of the images")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("usage: c8s-launcher layers convert [--config PATH] [--containerd-address SOCKET] [--namespace NS] IMAGE [IMAGE ...]")
	}
	c, err := openCountedCache(*cfgPath, *ctrdAddr)
	if err != nil {
		return err
	}
	cl, err := ctrdimage.Dial(*ctrdAddr)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx = namespaces.WithNamespace(ctx, *ns)
	ref, err := layercache.PodRef(*ns, convertRefPod, "")
	if err != nil {
		return err
	}
	for _, name := range fs.Args() {
		im, err := cl.Image(ctx, name)
		if err != nil {
			return fmt.Errorf("%w (in containerd namespace %s)", err, *ns)
		}
		for _, l := range im.Layers {
			e, built, err := c.Acquire(ctx, l.DiffID, ref, blobBuilder(cl, l))
			if err != nil {
				return fmt.Errorf("image %s: %w", name, err)
			}
			if err := c.Release(context.WithoutCancel(ctx), l.DiffID, ref.Name); err != nil {
				return err
			}
			how := "cached"
			if built {
				how = fmt.Sprintf("built in %d ms", e.BuildMillis)
			}
			fmt.Fprintf(stdout, "%s %s %s %s\n", name, l.DiffID, mib(e.Size), how)
		}
	}
	return nil
}

// blobBuilder builds the disk of layer l from its blob in containerd's
// content store, as the shim's conversion does (measurements/layer).
func blobBuilder(cl *ctrdimage.Client, l ctrdimage.Layer) layercache.Builder {
	return func(ctx context.Context, out *os.File) (layercache.Meta, error) {
		rc, err := cl.OpenBlob(ctx, l.Blob)
		if err != nil {
			return layercache.Meta{}, err
		}
		defer rc.Close()
		tr, err := layer.Decompress(rc, l.Blob.MediaType)
		if err != nil {
			return layercache.Meta{}, err
		}
		defer tr.Close()
		info, err := layer.Build(tr, out)
		if err != nil {
			return layercache.Meta{}, fmt.Errorf("convert blob %s (%s): %w", l.Blob.Digest, l.Blob.MediaType, err)
		}
		return layercache.Meta{DiffID: info.DiffID, RootHash: info.RootHash, DataBlocks: info.DataBlocks, Size: info.Size,
			Source: l.Blob.Digest, MediaType: l.Blob.MediaType}, nil
	}
}
