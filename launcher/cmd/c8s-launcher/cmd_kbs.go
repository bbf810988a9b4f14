package main

import (
	"context"
	"crypto"
	"errors"
	"flag"
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
	register("kbs", "serve the KBS protocol as the workload owner's relying party: the owner's reference values and resource policy, secrets from a directory (single node; Trustee is the multi-node path)", runKBS)
}

// kbsFlags are the kbs subcommand's settings.
type kbsFlags struct {
	dir, listen, certFile, keyFile, hosts string
	configPath, policyPath, simDir, tee   string
	initData, referenceValues             stringList
	referenceKey, resourcePolicy          string
	collateralDir                         string
	noCollateral                          bool
	anyInitData, allowUnconfined          bool
	allowHostRootfs                       bool
	fromNode                              bool
}

func runKBS(ctx context.Context, args []string, stdout io.Writer) error {
	var o kbsFlags
	fs := newFlags("kbs")
	fs.StringVar(&o.dir, "dir", "", "directory of secrets: DIR/REPO/TYPE/TAG (required)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8443", "address to serve HTTPS on")
	fs.StringVar(&o.certFile, "cert", "", "TLS certificate (PEM); with --key. Both missing files: a self-signed pair for --hosts is created")
	fs.StringVar(&o.keyFile, "key", "", "TLS key (PEM)")
	fs.StringVar(&o.hosts, "hosts", "127.0.0.1", "comma-separated names and addresses of a created certificate")
	o.registerVerification(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.dir == "" || o.certFile == "" || o.keyFile == "" {
		return errors.New("--dir, --cert and --key are required")
	}
	b, tee, err := newKBSBroker(o, stdout)
	if err != nil {
		return err
	}
	b.Resources = broker.Dir(o.dir)
	return o.serveHTTPS(ctx, b, stdout, func(addr net.Addr) string {
		return fmt.Sprintf("serving the KBS protocol on https://%s (tee %s, resources in %s)", addr, tee, o.dir)
	})
}

// serveHTTPS serves h on --listen over TLS with --cert and --key (a
// self-signed pair for --hosts is created when both are missing) until
// ctx ends, and prints banner's line once it listens (kbs, mesh-ca).
func (o *kbsFlags) serveHTTPS(ctx context.Context, h http.Handler, stdout io.Writer, banner func(net.Addr) string) error {
	if err := ensureCert(o.certFile, o.keyFile, strings.Split(o.hosts, ","), stdout); err != nil {
		return err
	}
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// The handlers log their decisions to log.G of each request's
		// context: this command's, without its cancellation (Close ends
		// the requests).
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	fmt.Fprintln(stdout, banner(l.Addr()))
	if err := srv.ServeTLS(l, o.certFile, o.keyFile); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// registerVerification adds the flags that say how pods' evidence is
// verified: the owner's reference values, policies and init data pins
// (kbs, mesh-ca).
func (o *kbsFlags) registerVerification(fs *flag.FlagSet) {
	fs.StringVar(&o.tee, "tee", "", "the TEE of the pods served: snp, tdx or sim (sim: also --sim-dir, the node's simulated root, for development). Required unless --reference-values-from-node")
	fs.Var(&o.referenceValues, "reference-values", "the owner's image manifest `FILE` (manifest.json as images/build.sh and c8s-measure write it): a pod's launch measurement must be one of its digests for --tee (repeatable: any file matches)")
	fs.StringVar(&o.referenceKey, "reference-key", "", "the owner's public key `FILE` (PEM; Ed25519, ECDSA P-256 or P-384): every --reference-values FILE must then carry a valid signature over its bytes in FILE"+broker.SignatureSuffix)
	fs.StringVar(&o.resourcePolicy, "resource-policy", "", "the owner's resource policy `FILE` (TOML, or JSON for *.json; see launcher/broker.ResourcePolicy): which workloads (launch measurement, init data digest, TCB, TEE, debug) may read which resource; a resource no rule covers is refused")
	fs.StringVar(&o.policyPath, "policy", "", "the owner's attestation policy (JSON, as verify-report reads it): min_tcb, allow_debug, vmpl, chip_id; its measurements or mrtd count as reference values; its host_data (SNP) or mrconfigid (TDX) pins one pod's init data")
	fs.Var(&o.initData, "init-data", "init data `FILE` of a pod the broker serves (repeatable): only evidence whose HOST_DATA or MRCONFIGID is the digest of one of these documents, sent with that document, is accepted")
	fs.BoolVar(&o.anyInitData, "any-init-data", false, "development only: accept whatever init data a pod sends (the host launches the pod, so it could write a [policy] of its own)")
	fs.BoolVar(&o.allowUnconfined, "allow-unconfined-host", false, "development only: also release to pods whose init data lets the host run code of its choosing in them (no [policy] section, or one in audit mode), which could read the secrets back")
	fs.BoolVar(&o.allowHostRootfs, "allow-host-rootfs-pods", false, "also release to pods whose enforced [policy] has rules that pin no image layers, so that the node supplies those containers' files and its binaries run under the owner's argv: only if the owner trusts the node with them (a workload's allow_host_rootfs in --resource-policy is the narrower form)")
	fs.BoolVar(&o.fromNode, "reference-values-from-node", false, "DEVELOPMENT ONLY, INSECURE: take the launch reference values, min_tcb and allow_debug from the node's own config (--config) and image manifest, which the host controls and can widen; never with --reference-values or --resource-policy")
	fs.StringVar(&o.configPath, "config", "/etc/c8s/config.toml", "with --reference-values-from-node only: the node's c8s config (TEE, image manifest, state dir)")
	fs.StringVar(&o.collateralDir, "collateral", "", "snp and tdx: a `DIR` of offline collateral (c8s-launcher collateral fetch): tdx pods' platform TCB status, quoting enclave identity and PCK revocation are checked with Intel's files in it, snp pods' certificates against AMD's CRLs in it")
	fs.BoolVar(&o.noCollateral, "no-collateral", false, "snp and tdx, development only: accept evidence without --collateral, so without the platform's TCB status (tdx) and certificate revocation (both)")
	fs.StringVar(&o.simDir, "sim-dir", "", "sim: the node's simulated secure processor state dir (with --reference-values-from-node, default STATE_DIR/node/sim-sp)")
}

// errNoReferences refuses to serve without launch reference values.
var errNoReferences = errors.New("give the owner's launch reference values: --reference-values FILE (the image manifest the image builder ships; signed: --reference-key KEY) with --tee, and --resource-policy FILE for which workload reads what; or --policy FILE with measurements (SNP) or mrtd (TDX). --reference-values-from-node takes the node's own manifest, which the host controls (development only)")

// newKBSBroker builds the broker o describes, without its resources, and
// returns the TEE it verifies. In owner mode (anything but
// --reference-values-from-node) the node's config and image manifest are
// never read: reference values, the attestation policy and the resource
// policy come from the owner's files only.
func newKBSBroker(o kbsFlags, stdout io.Writer) (*broker.Broker, string, error) {
	owner := len(o.referenceValues) > 0 || o.resourcePolicy != ""
	if owner && o.fromNode {
		return nil, "", errors.New("--reference-values-from-node cannot be combined with --reference-values or --resource-policy: the owner's files are the only reference values, and the node's manifest is not consulted")
	}
	b := &broker.Broker{AnyInitData: o.anyInitData, AllowUnconfinedHost: o.allowUnconfined, AllowHostRootfsPods: o.allowHostRootfs}
	var err error
	if o.resourcePolicy != "" {
		if b.ResourcePolicy, err = broker.LoadResourcePolicy(o.resourcePolicy); err != nil {
			return nil, "", err
		}
	}
	var base *attest.Policy
	if o.policyPath != "" {
		if base, err = attest.LoadPolicy(o.policyPath); err != nil {
			return nil, "", err
		}
		b.Policy = *base
	}
	pinned := len(o.initData) > 0 || len(b.Policy.HostData) > 0 || len(b.Policy.MRConfigID) > 0 ||
		(b.ResourcePolicy != nil && len(b.ResourcePolicy.InitDataDigests()) > 0)
	if !pinned && !o.anyInitData {
		return nil, "", errNoPins // before anything else: the pins name the pods served
	}
	acceptHostRootfs := func(doc []byte) bool { return o.allowHostRootfs || b.ResourcePolicy.AllowsHostRootfs(doc) }
	if b.InitData, err = loadInitData(o.initData, o.allowUnconfined, acceptHostRootfs); err != nil {
		return nil, "", err
	}
	if !owner && !o.fromNode && base == nil {
		return nil, "", errNoReferences
	}
	var tee string
	if o.fromNode {
		fmt.Fprintln(stdout, "WARNING: --reference-values-from-node: the launch reference values, min_tcb and allow_debug come from the node's own config and manifest, which the host controls: development only")
		if tee, err = nodeReferences(b, o, base); err != nil {
			return nil, "", err
		}
	} else if tee, err = ownerReferences(b, o, base); err != nil {
		return nil, "", err
	}
	return b, tee, nil
}

// trust returns what the broker verifies evidence of TEE tee with: the
// TEE's roots and, with --collateral, the offline collateral.
func (o kbsFlags) trust(tee, simDir string) (attest.Trust, error) {
	trust, err := attest.TrustFor(tee, simDir)
	if err != nil {
		return trust, err
	}
	if o.collateralDir == "" {
		if trust.Mode != attest.ModeSim && !o.noCollateral {
			return trust, fmt.Errorf("--tee %s: give --collateral DIR (c8s-launcher collateral fetch, refreshed before the files' next update): without it the broker would not judge the platform's TCB status (tdx) nor whether its certificates were revoked (a leaked key signs any evidence); --no-collateral accepts that, for development only", tee)
		}
		return trust, nil
	}
	if trust.Mode == attest.ModeSim {
		return trust, errors.New("--collateral is hardware collateral (Intel's, AMD's): the sim TEE takes none; drop it or use --tee snp|tdx")
	}
	if err := trust.LoadCollateral(o.collateralDir); err != nil {
		return trust, fmt.Errorf("--collateral: %w", err)
	}
	return trust, nil
}

// ownerReferences sets the verifier and the launch reference values from
// the owner's flags and files.
func ownerReferences(b *broker.Broker, o kbsFlags, base *attest.Policy) (string, error) {
	switch o.tee {
	case "snp", "tdx":
	case "sim":
		if o.simDir == "" {
			return "", errors.New("--tee sim needs --sim-dir: the node's simulated secure processor, the root its pods' reports are signed with")
		}
	case "":
		return "", errors.New("--tee snp|tdx|sim is required: the owner says which TEE's evidence the broker accepts (the node's config is not read)")
	default:
		return "", fmt.Errorf("--tee %q: want snp, tdx or sim", o.tee)
	}
	trust, err := o.trust(o.tee, o.simDir)
	if err != nil {
		return "", err
	}
	if b.Verifier, err = attest.NewVerifier(trust); err != nil {
		return "", err
	}
	var key crypto.PublicKey
	if o.referenceKey != "" {
		pemBytes, err := os.ReadFile(o.referenceKey)
		if err != nil {
			return "", fmt.Errorf("--reference-key: %w", err)
		}
		if key, err = broker.ParsePublicKey(pemBytes); err != nil {
			return "", fmt.Errorf("--reference-key %s: %w", o.referenceKey, err)
		}
	}
	for _, f := range o.referenceValues {
		ref, err := broker.LoadReferenceValues(f, o.tee, key)
		if err != nil {
			return "", err
		}
		b.References = append(b.References, ref)
	}
	if base != nil {
		if err := bootPinned(base, o.tee, o.policyPath); err != nil {
			return "", err
		}
		ref := broker.Reference{Source: o.policyPath, TEE: o.tee, Measurements: base.Measurements, MRTD: base.MRTD, RTMRs: base.RTMRs}
		if (o.tee == "tdx" && len(ref.MRTD) > 0) || (o.tee != "tdx" && len(ref.Measurements) > 0) {
			b.References = append(b.References, ref)
		}
	}
	if len(b.References) == 0 {
		return "", errNoReferences
	}
	return o.tee, nil
}

// nodeReferences is --reference-values-from-node: the verifier, the
// reference values, min_tcb and allow_debug from the node's config and
// image manifest (or --policy's launch values), as the broker did before
// owner mode.
func nodeReferences(b *broker.Broker, o kbsFlags, base *attest.Policy) (string, error) {
	cfg, err := config.Load(o.configPath)
	if err != nil {
		return "", err
	}
	tee := cfg.Hypervisor.TEE
	simDir := o.simDir
	if simDir == "" {
		simDir = statedir.SimSP(cfg.Runtime.StateDir)
	}
	if tee == "sim" {
		// The node's simulated secure processor: the one its pods' reports
		// come from, created here if no pod has run yet.
		if _, err := sim.Open(simDir); err != nil {
			return "", err
		}
	}
	if o.collateralDir == "" && tee != "sim" {
		o.collateralDir = cfg.Attestation.CollateralDir // as the node's shim
	}
	trust, err := o.trust(tee, simDir)
	if err != nil {
		return "", err
	}
	if b.Verifier, err = attest.NewVerifier(trust); err != nil {
		return "", err
	}
	if base != nil {
		if err := bootPinned(base, tee, o.policyPath); err != nil {
			return "", err
		}
	}
	if base == nil {
		m, err := manifest.Load(cfg.ManifestPath())
		if err != nil {
			return "", err
		}
		if b.Policy.Measurements, err = attest.ExpectedMeasurements(m, tee); err != nil {
			return "", err
		}
		b.Policy.MinTCB, b.Policy.AllowDebug = cfg.Attestation.MinTCB, cfg.Attestation.AllowDebug
	}
	return tee, nil
}

// bootPinned refuses a --policy under which the broker would serve a TD
// whatever it booted: MRTD is the TD's firmware only. Its kernel, initrd
// and command line (the guest's dm-verity root) are RTMR1 and RTMR2,
// pinned directly or through tdx_boot, whose event log the verifier
// replays to them (as reference values from a manifest must pin them).
func bootPinned(p *attest.Policy, tee, path string) error {
	if tee != "tdx" || len(p.MRTD) == 0 || p.TDXBoot != nil {
		return nil
	}
	if len(p.RTMRs) > 2 && len(p.RTMRs[1]) > 0 && len(p.RTMRs[2]) > 0 {
		return nil
	}
	return fmt.Errorf("--policy %s: mrtd without tdx_boot or rtmrs[1] and rtmrs[2]: MRTD covers only the TD's firmware, so the broker would serve a TD that booted any kernel, initrd and command line (any dm-verity root); add tdx_boot (`c8s-measure tdx` prints it) or the image manifest's rtmr1 and rtmr2", path)
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
// launched with it); acceptHostRootfs says whether the owner accepts a
// document's rules that pin no layers (--allow-host-rootfs-pods, a
// workload's allow_host_rootfs).
func loadInitData(files []string, allowUnconfined bool, acceptHostRootfs func([]byte) bool) ([][]byte, error) {
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
		accept := acceptHostRootfs(b)
		if unconfined, reason := d.HostCanRunCodeWith(initdata.HostCodeOptions{AcceptHostRootfs: accept}); unconfined && !allowUnconfined {
			return nil, fmt.Errorf("--init-data %s: the broker would release nothing to pods launched with it: %s; %s", f, reason, broker.HostCodeFix(d, accept))
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
