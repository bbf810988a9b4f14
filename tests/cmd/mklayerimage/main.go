// Command mklayerimage writes an OCI image layout tarball of the busybox
// test image with one more layer (tests/internal/layerimage), for the
// layer-mode benchmarks:
//
//	mklayerimage OUT.tar --name docker.io/c8s/big:test --random-mib 400
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/c8s-dev/c8s/tests/internal/layerimage"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: mklayerimage OUT.tar --name REF [--random-mib N] [--file PATH=CONTENT]")
		os.Exit(2)
	}
	out := os.Args[1]
	fs := flag.NewFlagSet("mklayerimage", flag.ExitOnError)
	name := fs.String("name", "docker.io/c8s/layers:test", "image reference")
	random := fs.Int64("random-mib", 0, "size in MiB of a pseudo-random file (/data/random) in the extra layer")
	file := fs.String("file", "etc/c8s-layer", "a small file in the extra layer")
	fs.Parse(os.Args[2:])
	layer := []layerimage.Entry{{Name: *file, Data: []byte(*name + "\n")}}
	if *random > 0 {
		layer = append(layer, layerimage.Entry{Name: "data", Dir: true}, layerimage.Entry{Name: "data/random", Random: *random << 20})
	}
	img, err := layerimage.WriteFile(out, layerimage.Options{Name: *name, Layers: [][]layerimage.Entry{layer}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, l := range img.Layers {
		fmt.Printf("%s %s %d\n", l.DiffID, l.Blob, l.Size)
	}
}
