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
	"github.com/c8s-dev/c8s/launcher/migrate"
)

func init() {
	register("serve", "accept incoming pod VM migrations on a unix socket (the destination side of `migrate`)", runServe)
}

func runServe(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("serve")
	cfgPath := fs.String("config", "/etc/c8s/config.toml", "the node's configuration file (TOML)")
	socket := fs.String("socket", "", "unix socket of the API (default: <runtime.state_dir>/node/migrate.sock)")
	name := fs.String("name", "", "node name (default: the host name)")
	host := fs.String("migration-host", "127.0.0.1", "address QEMU listens on for incoming migrations")
	listenTLS := fs.String("listen-tls", "", "also serve the API with mutual TLS on HOST:PORT (identity in <runtime.state_dir>/node/migrate-tls)")
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
