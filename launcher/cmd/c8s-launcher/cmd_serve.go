package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/ctrdimage"
	"github.com/c8s-dev/c8s/launcher/layercache"
	"github.com/c8s-dev/c8s/launcher/migrate"
	"github.com/c8s-dev/c8s/measurements/layer"
)

func init() {
	register("serve", "the node's migration server on a unix socket: accepts incoming pod VMs (the destination side of `migrate`) and dials tls:// destinations for this node's shims with its identity (the source side)", runServe)
}

func runServe(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("serve")
	cfgPath := fs.String("config", "/etc/c8s/config.toml", "the node's configuration file (TOML)")
	socket := fs.String("socket", "", "unix socket of the API (default: <runtime.state_dir>/node/migrate.sock)")
	name := fs.String("name", "", "node name (default: the host name)")
	host := fs.String("migration-host", "127.0.0.1", "address QEMU listens on for incoming migrations")
	listenTLS := fs.String("listen-tls", "", "also serve the API with mutual TLS on HOST:PORT (identity in <runtime.state_dir>/node/migrate-tls)")
	containerd := fs.String("containerd", "", "containerd socket whose content store converts the image layers an incoming pod VM brings and this node's layer cache lacks (default: none, such VMs are refused)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return errors.New("usage: c8s-launcher serve [--config FILE] [--socket SOCK] [--listen-tls HOST:PORT] [--name NODE] [--migration-host ADDR]")
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	if *socket == "" {
		*socket = statedir.MigrateSocket(cfg.Runtime.StateDir)
	}
	l, err := migrate.Listen(*socket)
	if err != nil {
		return err
	}
	defer os.Remove(*socket)
	srv := &migrate.Server{Config: *cfg, Name: *name, MigrationHost: *host}
	layersFrom := "this node's layer cache " + cfg.LayerCachePath() + " only"
	if *containerd != "" {
		store, closeStore, err := incomingLayerStore(cfg, *containerd)
		if err != nil {
			l.Close()
			return err
		}
		defer closeStore()
		srv.Layers = store
		layersFrom = "this node's layer cache " + cfg.LayerCachePath() + ", converted from containerd at " + *containerd + " where missing"
	}
	node, err := migrate.LocalNode(*cfg, *name)
	if err != nil {
		l.Close()
		return err
	}
	useTLS, err := srv.StreamTLS()
	if err != nil {
		l.Close()
		return err
	}
	stream := "TLS with the node's identity in " + statedir.MigrateTLS(cfg.Runtime.StateDir)
	if !useTLS {
		stream = "plain TCP on loopback (migration.plain_loopback; tests only)"
	}
	storage := "none (migration.shared_storage_root unset: VMs with disks are refused)"
	if r := cfg.Migration.SharedStorageRoot; r != "" {
		if _, err := os.Stat(r); err != nil {
			l.Close()
			return fmt.Errorf("migration.shared_storage_root: %w", err)
		}
		storage = r
	}
	fmt.Fprintf(stdout, "node %s (trust pool %s, tee %s, chip %.16s…) accepts migrations on %s\n", node.Name, node.TrustPool, node.TEE, node.ChipID, *socket)
	fmt.Fprintf(stdout, "migration stream: %s on %s; shared storage: %s\n", stream, *host, storage)
	fmt.Fprintf(stdout, "image layers: %s\n", layersFrom)
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *listenTLS != "" {
		serverTLS, _, err := migrate.LoadTLS(statedir.MigrateTLS(cfg.Runtime.StateDir))
		if err != nil {
			l.Close()
			return err
		}
		tl, err := migrate.ListenTLS(*listenTLS, serverTLS)
		if err != nil {
			l.Close()
			return err
		}
		fmt.Fprintf(stdout, "and with mutual TLS on %s\n", tl.Addr())
		errc := make(chan error, 1)
		go func() { errc <- srv.Serve(ctx, tl) }()
		err = srv.Serve(ctx, l)
		stop()
		return errors.Join(err, <-errc)
	}
	return srv.Serve(ctx, l)
}

// incomingLayerStore is the node's layer cache, converting the layers an
// incoming VM brings and the cache lacks from the blobs in containerd's
// content store at address, with the same code as convert-layer.
func incomingLayerStore(cfg *config.Config, address string) (migrate.LayerStore, func(), error) {
	cache, err := layercache.Open(cfg.LayerCachePath())
	if err != nil {
		return nil, nil, err
	}
	images, err := ctrdimage.Dial(address)
	if err != nil {
		return nil, nil, err
	}
	convert := func(_ context.Context, blob io.Reader, mediaType string, out *os.File) (migrate.LayerInfo, error) {
		tr, err := layer.Decompress(blob, mediaType)
		if err != nil {
			return migrate.LayerInfo{}, err
		}
		defer tr.Close()
		info, err := layer.Build(tr, out)
		if err != nil {
			return migrate.LayerInfo{}, err
		}
		return migrate.LayerInfo{DiffID: info.DiffID, RootHash: info.RootHash, DataBlocks: info.DataBlocks, Size: info.Size}, nil
	}
	return &migrate.CacheLayers{Cache: cache, Dir: cache.Dir(), Blobs: images, Convert: convert}, func() { images.Close() }, nil
}
