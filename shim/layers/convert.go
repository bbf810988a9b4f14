package layers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/opencontainers/go-digest"
)

// FSType is the file system of a layer disk (measurements/layer).
const FSType = "ext4"

// LauncherBinary is the node tool whose convert-layer subcommand converts
// layers; it is installed next to the shim.
const LauncherBinary = "c8s-launcher"

// Launcher is the path of c8s-launcher Convert runs ("": LauncherPath's
// answer). Tests set it.
var Launcher string

// LauncherPath finds c8s-launcher: next to the running binary (the shim),
// else on PATH.
func LauncherPath() (string, error) {
	if Launcher != "" {
		return Launcher, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), LauncherBinary)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	p, err := exec.LookPath(LauncherBinary)
	if err != nil {
		return "", fmt.Errorf("layer conversion needs %s next to the shim or on PATH: %w", LauncherBinary, err)
	}
	return p, nil
}

// Convert is the node's Converter: the blob decompressed by its media
// type and written as a layer disk by measurements/layer, the same code
// `c8s-measure image` computes a policy's roots with. It runs in a
// short-lived `c8s-launcher convert-layer` (blob on its stdin, out as its
// fd 3, the result as JSON on its stdout), so the tar, ext4, zstd and
// dm-verity code never stays resident in a pod's shim (issue 18). The
// result is host-side data either way: the guest opens a layer only with
// the dm-verity root its measured policy pins. out must be an *os.File.
// ctx ending kills the conversion.
func Convert(ctx context.Context, blob io.Reader, mediaType string, out io.ReadWriteSeeker) (Info, error) {
	f, ok := out.(*os.File)
	if !ok {
		return Info{}, fmt.Errorf("layer conversion writes into a file, not a %T", out)
	}
	if err := ctx.Err(); err != nil {
		return Info{}, err
	}
	launcher, err := LauncherPath()
	if err != nil {
		return Info{}, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, launcher, "convert-layer", "--media-type", mediaType)
	cmd.Stdin = blob
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return Info{}, ctx.Err()
		}
		msg := strings.TrimSpace(stderr.String())
		msg = strings.TrimPrefix(msg, LauncherBinary+" convert-layer: ")
		if msg == "" {
			msg = err.Error()
		}
		return Info{}, errors.New(msg)
	}
	var r struct {
		DiffID     digest.Digest `json:"diff_id"`
		RootHash   string        `json:"root_hash"`
		DataBlocks uint64        `json:"data_blocks"`
		Size       int64         `json:"size"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
		return Info{}, fmt.Errorf("%s convert-layer answered %q: %w", launcher, stdout.String(), err)
	}
	if err := r.DiffID.Validate(); err != nil || len(r.RootHash) != 64 {
		return Info{}, fmt.Errorf("%s convert-layer answered diff ID %q, root %q: not a layer's", launcher, r.DiffID, r.RootHash)
	}
	return Info{DiffID: r.DiffID, RootHash: r.RootHash, DataBlocks: r.DataBlocks, Size: r.Size}, nil
}
