package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/launcher/admin/diag"
	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/launcher/layercache"
)

func init() {
	register("layers", "list or prune the node's cache of image layer disks (layers list|prune)", runLayers)
}

const layersUsage = `usage: c8s-launcher layers list [--config PATH] [--json]
       c8s-launcher layers prune [--config PATH] [--containerd-address SOCKET] [--all-unused] [--json]
       c8s-launcher layers sync [--config PATH] [--containerd-address SOCKET] [--json]
       c8s-launcher layers convert [--config PATH] [--containerd-address SOCKET] [--namespace NS] IMAGE...

list shows each cached layer: its diff ID, size, dm-verity root and the pods
using it (live; stale ones, of pods that are gone, in parentheses).
prune removes the layers no running pod uses and, unless --all-unused, no
image in containerd (any namespace) has; a layer a running pod uses is
never removed. Each cached layer is counted in containerd's image file
system (CRI ImageFsInfo, kubelet's imagefs) as a snapshot linking its disk;
prune stops counting a layer before removing it, then counts those not
counted yet and drops counts of layers gone, as sync alone does.
--containerd-address "" leaves containerd alone (prune then needs
--all-unused).
convert builds the layer disks of images already in containerd into the
cache, as a pod's first start would`

func runLayers(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(layersUsage)
	}
	switch args[0] {
	case "list":
		return runLayersList(args[1:], stdout)
	case "prune":
		return runLayersPrune(ctx, args[1:], stdout)
	case "sync":
		return runLayersSync(ctx, args[1:], stdout)
	case "convert":
		return runLayersConvert(ctx, args[1:], stdout)
	}
	return fmt.Errorf("layers: unknown command %q\n%s", args[0], layersUsage)
}

// openLayerCache opens the cache the configuration at cfgPath names.
func openLayerCache(cfgPath string) (*layercache.Cache, error) {
	cfg, _, err := loadNodeConfig("/", cfgPath)
	if err != nil {
		return nil, err
	}
	return layercache.Open(cfg.LayerCachePath())
}

// layerJSON is one layer of `layers list --json`.
type layerJSON struct {
	DiffID     digest.Digest `json:"diff_id"`
	Size       int64         `json:"size"`
	Allocated  int64         `json:"allocated"`
	RootHash   string        `json:"root_hash"`
	DataBlocks uint64        `json:"data_blocks"`
	Source     digest.Digest `json:"source,omitempty"`
	Created    time.Time     `json:"created"`
	BuildMS    int64         `json:"build_ms"`
	Path       string        `json:"path"`
	Pods       []string      `json:"pods"`
	StalePods  []string      `json:"stale_pods,omitempty"`
}

func runLayersList(args []string, stdout io.Writer) error {
	fs := newFlags("layers list")
	cfgPath := fs.String("config", "", "c8s configuration (default "+DefaultConfigPath+" if present, else built-in defaults)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := openLayerCache(*cfgPath)
	if err != nil {
		return err
	}
	ls, err := c.List()
	if err != nil {
		return err
	}
	out := make([]layerJSON, 0, len(ls))
	for _, l := range ls {
		j := layerJSON{DiffID: l.DiffID, Size: l.Size, Allocated: l.Allocated, RootHash: l.RootHash, DataBlocks: l.DataBlocks,
			Source: l.Source, Created: l.Created, BuildMS: l.BuildMillis, Path: l.Path, Pods: []string{}}
		for _, r := range l.Refs {
			name := r.Namespace + "/" + r.Pod
			if r.Live {
				j.Pods = append(j.Pods, name)
			} else {
				j.StalePods = append(j.StalePods, name)
			}
		}
		out = append(out, j)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "DIFF ID\tSIZE\tREFS\tPODS\n")
	var total int64
	for _, j := range out {
		pods := fmt.Sprint(j.Pods)
		if len(j.StalePods) > 0 {
			pods += fmt.Sprintf(" (stale: %v)", j.StalePods)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", j.DiffID, mib(j.Allocated), len(j.Pods), pods)
		total += j.Allocated
	}
	fmt.Fprintf(tw, "%d layers\t%s\t\t%s\n", len(out), mib(total), c.Dir())
	return tw.Flush()
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func runLayersPrune(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("layers prune")
	cfgPath := fs.String("config", "", "c8s configuration (default "+DefaultConfigPath+" if present, else built-in defaults)")
	ctrdAddr := fs.String("containerd-address", diag.DefaultContainerdAddress, "containerd's gRPC socket, whose images keep their layers and whose image file system counts them (\"\": none)")
	allUnused := fs.Bool("all-unused", false, "remove every layer no running pod uses, ignoring containerd's images")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, err := openLayerCache(*cfgPath)
	if err != nil {
		return err
	}
	if *ctrdAddr == "" && !*allUnused {
		return errors.New(`layers prune: without containerd (--containerd-address ""), its images cannot keep their layers: pass --all-unused`)
	}
	var keep func(digest.Digest) bool
	var skipped []string
	if !*allUnused {
		cl, err := ctrdimage.Dial(*ctrdAddr)
		if err != nil {
			return err
		}
		defer cl.Close()
		inUse, sk, err := cl.InUse(ctx)
		if err != nil {
			return fmt.Errorf("%w (pass --containerd-address, or --all-unused to ignore containerd's images)", err)
		}
		keep = func(d digest.Digest) bool { return inUse[d] }
		skipped = sk
	}
	if *ctrdAddr != "" {
		c.Account(ctrdimage.NewImageFS(*ctrdAddr, c.Dir()))
	}
	p, err := c.Prune(ctx, keep)
	if err != nil {
		return fmt.Errorf("%w (layers that could not stop being counted in containerd's image file system are kept: check --containerd-address)", err)
	}
	sy, syncErr := c.SyncAccounts(ctx)
	removed := make([]digest.Digest, 0, len(p.Layers))
	for _, e := range p.Layers {
		removed = append(removed, e.DiffID)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Removed       []digest.Digest `json:"removed"`
			Bytes         int64           `json:"bytes"`
			StaleRefs     int             `json:"stale_refs"`
			SkippedImages []string        `json:"skipped_images,omitempty"`
			imageFSJSON
		}{removed, p.Bytes, p.StaleRefs, skipped, newImageFSJSON(sy, syncErr)})
	}
	for _, d := range removed {
		fmt.Fprintf(stdout, "removed %s\n", d)
	}
	for _, s := range skipped {
		fmt.Fprintf(stdout, "warning: image not resolved, its layers not kept: %s\n", s)
	}
	fmt.Fprintf(stdout, "pruned %d layers, %s; %d stale references\n", len(removed), mib(p.Bytes), p.StaleRefs)
	printSynced(stdout, sy, syncErr)
	return nil
}
