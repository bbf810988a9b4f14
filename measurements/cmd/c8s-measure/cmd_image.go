package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	digest "github.com/opencontainers/go-digest"

	"github.com/c8s-dev/c8s/measurements/internal/ociimage"
)

func init() {
	register("image", "an image's layers as a policy pins them: per layer its blob, diff ID, dm-verity root and data blocks (registry, OCI layout or archive, containerd's content store)", runImage)
}

type imageLayerJSON struct {
	Digest     digest.Digest `json:"digest"`
	MediaType  string        `json:"media_type"`
	Size       int64         `json:"size"`
	DiffID     digest.Digest `json:"diff_id"`
	Verity     string        `json:"verity"`
	DataBlocks uint64        `json:"data_blocks"`
	DiskSize   int64         `json:"disk_size"`
}

type imageJSON struct {
	Image    string           `json:"image"`
	Digests  []digest.Digest  `json:"digests"`
	Manifest digest.Digest    `json:"manifest"`
	Config   digest.Digest    `json:"config"`
	Layers   []imageLayerJSON `json:"layers"`
}

// runImage prints what a policy pins of an image's layers.
func runImage(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "table", "output: table, toml (the [[policy.containers.NAME.layers]] of a rule) or json")
	container := fs.String("container", "NAME", "the container `NAME` of the -o toml tables")
	ref := fs.String("ref", "", "the image `REF` to take from a layout that holds several (by the names its index annotates, or NAME@sha256:…)")
	store := fs.String("content-store", "", "read containerd's content store `DIR` (…/io.containerd.content.v1.content, or containerd's root) instead; --manifest names the image")
	manifest := fs.String("manifest", "", "with --content-store: the `DIGEST` (sha256:…) of the image's manifest or index, as ctr images ls prints it")
	insecure := fs.Bool("insecure", false, "speak plain http to the registry (https is the default, except for a registry on 127.0.0.1, ::1 or localhost, which gets http)")
	tmp := fs.String("tmp", "", "`DIR` for the layer disks built while measuring (the system's temporary directory by default); each is removed after")
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: c8s-measure image [flags] REF|LAYOUT
       c8s-measure image [flags] --content-store DIR --manifest sha256:…

Prints, for each layer of the image's linux/amd64 manifest, bottom first:
its blob (digest, media type, size), its diff ID, and the dm-verity root
hash and data blocks of the layer disk a c8s node builds from it
(measurements/layer), which a container's [policy] rule pins. Every blob is
checked against its digest and size, and each layer's diff ID against the
image config's rootfs.diff_ids.

REF is a registry reference (127.0.0.1:5000/app:1, ghcr.io/o/app@sha256:…;
anonymous pull); LAYOUT an OCI image layout directory or a tar of one
(skopeo copy docker://REF oci:DIR, docker save, ctr images export).

`)
		fs.PrintDefaults()
	}
	pos, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	switch *out {
	case "table", "toml", "json":
	default:
		return fmt.Errorf("-o %q: want table, toml or json", *out)
	}
	ctx := context.Background()
	var img *ociimage.Image
	var name string
	switch {
	case *store != "":
		if len(pos) != 0 || *manifest == "" {
			fs.Usage()
			return errors.New("--content-store takes no REF and needs --manifest sha256:… (the store keeps no names)")
		}
		name = *manifest
		img, err = ociimage.OpenContentStore(ctx, *store, digest.Digest(*manifest))
	case *manifest != "":
		return errors.New("--manifest goes with --content-store")
	case len(pos) != 1:
		fs.Usage()
		return errors.New("want one image: a registry REF or an OCI layout")
	default:
		name = pos[0]
		if _, statErr := os.Stat(pos[0]); statErr == nil {
			img, err = ociimage.OpenLayout(ctx, pos[0], *ref)
		} else if strings.HasPrefix(pos[0], ".") || strings.HasPrefix(pos[0], "/") {
			return fmt.Errorf("%s: %w", pos[0], statErr)
		} else {
			if *ref != "" {
				return errors.New("--ref picks an image of a layout: a registry REF names one already")
			}
			img, err = ociimage.OpenRegistry(ctx, pos[0], ociimage.RegistryOptions{Insecure: *insecure})
		}
	}
	if err != nil {
		return err
	}
	layers, err := ociimage.MeasureLayers(ctx, img, *tmp)
	if err != nil {
		return err
	}
	js := imageJSON{Image: name, Digests: img.Digests, Manifest: img.ManifestDigest(), Config: img.Manifest.Config.Digest, Layers: []imageLayerJSON{}}
	for _, l := range layers {
		js.Layers = append(js.Layers, imageLayerJSON{
			Digest: l.Blob.Digest, MediaType: l.Blob.MediaType, Size: l.Blob.Size,
			DiffID: l.Disk.DiffID, Verity: l.Disk.RootHash, DataBlocks: l.Disk.DataBlocks, DiskSize: l.Disk.Size,
		})
	}
	switch *out {
	case "json":
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(js)
	case "toml":
		return printLayersTOML(stdout, &js, *container)
	}
	return printLayersTable(stdout, &js)
}

// printLayersTOML prints the layers as a rule's tables.
func printLayersTOML(w io.Writer, js *imageJSON, container string) error {
	key := container
	if strings.ContainsFunc(key, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
	}) {
		key = fmt.Sprintf("%q", key)
	}
	fmt.Fprintf(w, "# The layers of %s (manifest %s, config %s), bottom first,\n", js.Image, js.Manifest, js.Config)
	fmt.Fprintf(w, "# as `c8s-measure image` measured them: the end of the rule of the container that runs it.\n")
	for i, l := range js.Layers {
		fmt.Fprintf(w, "\n[[policy.containers.%s.layers]]  # layer %d of %d: blob %s, %s, %d bytes\n", key, i+1, len(js.Layers), l.Digest, l.MediaType, l.Size)
		fmt.Fprintf(w, "digest = %q\nverity = %q\nblocks = %d\n", l.DiffID, l.Verity, l.DataBlocks)
	}
	return nil
}

// printLayersTable prints the image's digests and a table of its layers.
func printLayersTable(w io.Writer, js *imageJSON) error {
	fmt.Fprintf(w, "image     %s\n", js.Image)
	if len(js.Digests) > 1 {
		fmt.Fprintf(w, "index     %s\n", strings.Join(digestStrings(js.Digests[:len(js.Digests)-1]), " → "))
	}
	fmt.Fprintf(w, "manifest  %s (linux/amd64)\n", js.Manifest)
	fmt.Fprintf(w, "config    %s\n", js.Config)
	var disk int64
	for _, l := range js.Layers {
		disk += l.DiskSize
	}
	fmt.Fprintf(w, "layers    %d, layer disks %s in all\n\n", len(js.Layers), humanBytes(disk))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tBLOB\tMEDIA TYPE\tSIZE\tDIFF ID\tVERITY ROOT\tBLOCKS\tDISK")
	for i, l := range js.Layers {
		media := strings.TrimPrefix(strings.TrimPrefix(l.MediaType, "application/vnd.oci.image.layer.v1."), "application/vnd.docker.image.rootfs.")
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", i+1, l.Digest, media, humanBytes(l.Size), l.DiffID, l.Verity, l.DataBlocks, humanBytes(l.DiskSize))
	}
	return tw.Flush()
}

func digestStrings(ds []digest.Digest) []string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return s
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
