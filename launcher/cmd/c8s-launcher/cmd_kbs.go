package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/c8s-dev/c8s/guest/api/initdata"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/broker"
	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/config/statedir"
	"github.com/c8s-dev/c8s/launcher/vm/tee/sim"
	"github.com/c8s-dev/c8s/manifest"
)

func init() {
	register("kbs", "serve the KBS protocol for this node's pods from a directory of secrets (single node; Trustee is the multi-node path)", runKBS)
}

func runKBS(ctx context.Context, args []string, stdout io.Writer) error {
	fs := newFlags("kbs")
	dir := fs.String("dir", "", "directory of secrets: DIR/REPO/TYPE/TAG (required)")
	listen := fs.String("listen", "127.0.0.1:8443", "address to serve HTTPS on")
	certFile := fs.String("cert", "", "TLS certificate (PEM); with --key. Both missing files: a self-signed pair for --hosts is created")
	keyFile := fs.String("key", "", "TLS key (PEM)")
	hosts := fs.String("hosts", "127.0.0.1", "comma-separated names and addresses of a created certificate")
	configPath := fs.String("config", "/etc/c8s/config.toml", "c8s config: the TEE, the image manifest and the state dir")
	policyPath := fs.String("policy", "", "policy (JSON, as verify-report reads it) instead of the manifest's launch digests; its host_data (SNP) or mrconfigid (TDX) pins one pod's init data")
	var initDataFiles stringList
	fs.Var(&initDataFiles, "init-data", "init data `FILE` of a pod the broker serves (repeatable): only evidence whose HOST_DATA or MRCONFIGID is the digest of one of these documents, sent with that document, is accepted")
	anyInitData := fs.Bool("any-init-data", false, "development only: accept whatever init data a pod sends (the host launches the pod, so it could write a [policy] of its own)")
	allowUnconfined := fs.Bool("allow-unconfined-host", false, "development only: also release to pods whose init data lets the host run code of its choosing in them (no [policy] section, or one in audit mode), which could read the secrets back")
	simDir := fs.String("sim-dir", "", "sim: the node's simulated secure processor state dir (default STATE_DIR/node/sim-sp)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *dir == "" || *certFile == "" || *keyFile == "" {
		return errors.New("--dir, --cert and --key are required")
	}
	if len(initDataFiles) == 0 && *policyPath == "" && !*anyInitData {
		return errNoPins // before anything else: --policy may pin instead
	}
	initData, err := loadInitData(initDataFiles, *allowUnconfined)
	if err != nil {
		return err
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		return err
	}
	tee := cfg.Hypervisor.TEE
	if *simDir == "" {
		*simDir = statedir.SimSP(cfg.Runtime.StateDir)
	}
	if tee == "sim" {
		// The node's simulated secure processor: the one its pods' reports
		// come from, created here if no pod has run yet.
		if _, err := sim.Open(*simDir); err != nil {
			return err
		}
	}
	trust, err := attest.TrustFor(tee, *simDir)
	if err != nil {
		return err
	}
	v, err := attest.NewVerifier(trust)
	if err != nil {
		return err
	}
	var policy attest.Policy
	pinned := len(initData) > 0
	if *policyPath != "" {
		p, err := attest.LoadPolicy(*policyPath)
		if err != nil {
			return err
		}
		policy = *p
		if len(policy.HostData) > 0 || len(policy.MRConfigID) > 0 {
			pinned = true
		}
	} else {
		m, err := manifest.Load(cfg.ManifestPath())
		if err != nil {
			return err
		}
		if policy.Measurements, err = attest.ExpectedMeasurements(m, tee); err != nil {
			return err
		}
		policy.MinTCB, policy.AllowDebug = cfg.Attestation.MinTCB, cfg.Attestation.AllowDebug
	}
	if !pinned && !*anyInitData {
		return errNoPins
	}
	if err := ensureCert(*certFile, *keyFile, strings.Split(*hosts, ","), stdout); err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler: &broker.Broker{Verifier: v, Policy: policy, Resources: broker.Dir(*dir),
			InitData: initData, AnyInitData: *anyInitData, AllowUnconfinedHost: *allowUnconfined},
		ReadHeaderTimeout: 10 * time.Second,
		// The broker logs its decisions to log.G of each request's
		// context: this command's, without its cancellation (Close ends
		// the requests).
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	fmt.Fprintf(stdout, "serving the KBS protocol on https://%s (tee %s, resources in %s)\n", l.Addr(), tee, *dir)
	if err := srv.ServeTLS(l, *certFile, *keyFile); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// errNoPins refuses to serve pods whose init data nobody pinned: the
// host launches a pod, so it would write the document (and a [policy] of
// its own).
var errNoPins = errors.New("pin the init data of the pods to serve: --init-data FILE (repeatable; a pod's io.c8s.initdata document, decoded), or --policy whose host_data (SNP) or mrconfigid (TDX) is its digest; --any-init-data, for development only, accepts whatever document the host launches a pod with")

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	*l = append(*l, s)
	return nil
}

// loadInitData reads the init data documents to pin, refusing one that
// does not parse or, unless allowUnconfined, one under which the host
// could run code of its choosing (the broker would refuse every pod
// launched with it).
func loadInitData(files []string, allowUnconfined bool) ([][]byte, error) {
	var docs [][]byte
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--init-data: %w", err)
		}
		d, err := initdata.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("--init-data %s: %w", f, err)
		}
		if unconfined, reason := d.HostCanRunCode(); unconfined && !allowUnconfined {
			fix := "add a [policy] section (c8s-measure policy can generate one)"
			if d.PolicyGoverns() {
				fix = "set policy.audit = false"
			}
			return nil, fmt.Errorf("--init-data %s: the broker would release nothing to pods launched with it: %s; %s", f, reason, fix)
		}
		docs = append(docs, b)
	}
	return docs, nil
}

// ensureCert creates a self-signed certificate and key when neither file
// exists.
func ensureCert(certFile, keyFile string, hosts []string, stdout io.Writer) error {
	_, cerr := os.Stat(certFile)
	_, kerr := os.Stat(keyFile)
	if cerr == nil && kerr == nil {
		return nil
	}
	if !errors.Is(cerr, os.ErrNotExist) || !errors.Is(kerr, os.ErrNotExist) {
		return fmt.Errorf("--cert %s and --key %s: give both existing files, or two missing ones to create", certFile, keyFile)
	}
	certPEM, keyPEM, err := broker.SelfSigned(hosts, 365*24*time.Hour)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(certFile, certPEM, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "created a self-signed certificate %s for %s: put it in the pods' init data as kbs.cert\n", certFile, strings.Join(hosts, ", "))
	return nil
}
