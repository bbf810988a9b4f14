package main

import (
	"crypto"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/c8s-dev/c8s/launcher/config"
	"github.com/c8s-dev/c8s/launcher/node"
	"github.com/c8s-dev/c8s/launcher/node/reattest"
	"github.com/c8s-dev/c8s/manifest"
)

// reattestFlags are the node agent's re-attestation flags.
type reattestFlags struct {
	interval, scan   time.Duration
	containerd, cri  string
	bundle, bundleCM string
	keys, onFailure  string
}

func addReattestFlags(fs *flag.FlagSet) *reattestFlags {
	f := &reattestFlags{}
	fs.DurationVar(&f.interval, "reattest-interval", reattest.DefaultInterval, "re-attest each running c8s pod this often with fresh evidence (0: no re-attestation)")
	fs.DurationVar(&f.scan, "reattest-scan", reattest.DefaultScan, "look for new pods and a new trust bundle this often; a new pod, and every pod after a new bundle, is re-attested at once")
	fs.StringVar(&f.containerd, "containerd-address", "/run/containerd/containerd.sock", "containerd's socket: the pods' shim sockets are derived from it")
	fs.StringVar(&f.cri, "cri-endpoint", "", "CRI socket, to name a sandbox's pod and to stop it (default: --containerd-address)")
	fs.StringVar(&f.bundle, "trust-bundle", "", "the pod owner's signed trust bundle file (compact JWS; c8s-launcher trust-bundle sign)")
	fs.StringVar(&f.bundleCM, "trust-bundle-configmap", "", "NAMESPACE/NAME of a ConfigMap holding the owner's signed bundle in key "+node.DefaultBundleKey)
	fs.StringVar(&f.keys, "trust-bundle-key", "", "PEM file of the owner's public key(s), Ed25519 or ECDSA P-256, that must sign the bundle")
	fs.StringVar(&f.onFailure, "reattest-on-failure", reattest.OnFailureReport, "what a pod that fails re-attestation gets unless the bundle says: report (condition and event) or stop (its sandbox is stopped too)")
	return f
}

// monitor returns the re-attestation monitor the flags describe, or nil
// when re-attestation is off.
func (f *reattestFlags) monitor(cfg config.Config, root string, client *node.KubeClient) (*reattest.Monitor, func(), error) {
	if f.interval <= 0 {
		if f.bundle != "" || f.bundleCM != "" {
			return nil, nil, errors.New("a trust bundle without re-attestation: --reattest-interval must be positive")
		}
		return nil, func() {}, nil
	}
	switch f.onFailure {
	case reattest.OnFailureReport, reattest.OnFailureStop:
	default:
		return nil, nil, fmt.Errorf("--reattest-on-failure %q: want %s or %s", f.onFailure, reattest.OnFailureReport, reattest.OnFailureStop)
	}
	var (
		keys    []crypto.PublicKey
		sources []reattest.Source
	)
	if f.keys != "" {
		b, err := os.ReadFile(f.keys)
		if err != nil {
			return nil, nil, fmt.Errorf("--trust-bundle-key: %w", err)
		}
		if keys, err = reattest.ParsePublicKeys(b); err != nil {
			return nil, nil, fmt.Errorf("--trust-bundle-key %s: %w", f.keys, err)
		}
	}
	if f.bundle != "" {
		sources = append(sources, reattest.FileSource(f.bundle))
	}
	if f.bundleCM != "" {
		ns, name, ok := strings.Cut(f.bundleCM, "/")
		if !ok || ns == "" || name == "" {
			return nil, nil, fmt.Errorf("--trust-bundle-configmap %q: want NAMESPACE/NAME", f.bundleCM)
		}
		sources = append(sources, node.ConfigMapSource{Clientset: client.Clientset, Namespace: ns, ConfigMap: name})
	}
	if len(keys) > 0 && len(sources) == 0 {
		return nil, nil, errors.New("--trust-bundle-key without a bundle: pass --trust-bundle or --trust-bundle-configmap")
	}
	store, err := reattest.NewStore(keys, sources...)
	if err != nil {
		return nil, nil, err
	}
	endpoint := f.cri
	if endpoint == "" {
		endpoint = f.containerd
	}
	cri, err := node.NewCRI(filepath.Join(root, strings.TrimPrefix(endpoint, "unix://")))
	if err != nil {
		return nil, nil, err
	}
	stateRoot := filepath.Join(root, cfg.Runtime.StateDir)
	collateralDir := cfg.Attestation.CollateralDir // the shim's: its TCB status, QE identity, CRLs
	if collateralDir != "" {
		collateralDir = filepath.Join(root, collateralDir)
	}
	m := &reattest.Monitor{
		Sandboxes: node.StateSandboxes{StateRoot: stateRoot, ProcRoot: filepath.Join(root, "proc")},
		Shims:     node.ShimEvidence{ContainerdAddress: f.containerd},
		Runtime:   cri,
		Reporter:  client,
		Checker: &reattest.Checker{
			Trusts:     reattest.NodeTrusts(stateRoot, collateralDir),
			Manifest:   func(p string) (*manifest.Manifest, error) { return manifest.Load(filepath.Join(root, p)) },
			MinTCB:     cfg.Attestation.MinTCB,
			AllowDebug: cfg.Attestation.AllowDebug,
		},
		Bundles:   store,
		OnFailure: f.onFailure,
		Interval:  f.interval,
		Scan:      f.scan,
	}
	return m, func() { cri.Close() }, nil
}
