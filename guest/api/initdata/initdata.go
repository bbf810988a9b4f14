// Package initdata is the pod's init data: a small TOML document, chosen
// per pod, that binds what the untrusted host may ask of the agent to the
// VM's measurement. Its digest is placed in SNP HOST_DATA (and the sim
// report's HOST_DATA) or TDX MRCONFIGID at launch; the agent accepts the
// document only when its digest matches what its own evidence reports,
// then enforces the agent policy in it.
//
// Two formats are read. c8s's own (below): the digest is the SHA-256 of
// the document for HOST_DATA, its SHA-384 for MRCONFIGID. CoCo's init
// data (coco.go), which Trustee's KBS reads: detected by its top-level
// algorithm key or [data] table, digested as its specification says, with
// c8s's settings in its "c8s.toml" data entry.
//
//	version = "0.1"
//
//	[agent_policy]
//	allow_exec = false   # refuse `ctr task exec` / `kubectl exec` from the host
//	allow_devices = ["c 10:200"]   # devices the host may give containers (devices.go)
//	allow_port_forward = [8080]    # pod ports the host may port-forward to
//
//	[kbs]                # optional: secrets from a KBS-protocol key broker (see KBS)
//	url = "https://kbs.example:8080"
//	cert = "-----BEGIN CERTIFICATE-----..."
//	[[kbs.secrets]]
//	resource = "kbs:///default/key/db-password"
//	path = "/run/secrets/db-password"
//
//	[mesh]               # optional: the attested mesh (mesh.go)
//	url = "https://mesh-ca.example:8443"
//	identity = "spiffe://example.org/ns/default/sa/db"
//
// allow_devices lists the character devices beyond the standard ones
// (/dev/null, zero, full, random, urandom, tty, console, ptmx, ptys) that
// the host may have created in the pod's containers: "c MAJOR:MINOR" or
// "c MAJOR:*" (DeviceRule). With any init data, absent means none. The
// pod VM's own devices (block devices, memory and the kernel log, misc
// with the TEE guest devices, the channels to the host; guest/spec) are
// refused even when listed.
//
// A [policy] section (guest/api/policy) governs every host request,
// default-deny: which containers the host may create and with what image,
// args, env, mounts, capabilities and namespaces; exec; logs and stdin;
// signals; which containers get which secrets. Without one, init data
// restricts devices (and, by allow_exec, exec) only: the host can still
// create containers of its own, which get the pod's secrets, so c8s's key
// broker releases secrets only to a pod with an enforced [policy] whose
// rules bind their containers to the owner's images (HostCanRunCode).
//
// Empty init data means the default policy (everything allowed but the
// pod VM's own devices) and an all-zero HOST_DATA. Both sides of the host-guest API use this package,
// so that they agree on the format and the digest.
package initdata

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"

	"github.com/c8s-dev/c8s/guest/api/policy"
)

// Version is the init data format version this package reads.
const Version = "0.1"

// Annotation carries a pod's init data (base64 of the TOML document).
const Annotation = "io.c8s.initdata"

// InitData is the parsed document.
type InitData struct {
	Version string      `toml:"version"`
	Agent   AgentPolicy `toml:"agent_policy"`
	// KBS names the pod's key broker and the secrets it releases to the
	// pod once its evidence verifies.
	KBS KBS `toml:"kbs"`
	// Policy, when present, governs every request of the host to the
	// agent, default-deny (schema: guest/api/policy; enforced by
	// guest/policy).
	Policy *policy.Policy `toml:"policy"`
	// Mesh, when present, puts the pod in the owner's attested mesh
	// (mesh.go): its workload certificate and the ports the agent's proxy
	// wraps in mutual TLS.
	Mesh *Mesh `toml:"mesh"`

	// Format is FormatC8s or FormatCoCo; CoCo is the CoCo document.
	Format string `toml:"-"`
	CoCo   *CoCo  `toml:"-"`
}

// AgentPolicy says which host requests the agent serves.
type AgentPolicy struct {
	// AllowExec permits exec processes from the host (default true).
	// Without a [policy] section the host can still create containers of
	// its own, so it does not keep the pod's secrets from the host
	// (HostCanRunCode).
	AllowExec *bool `toml:"allow_exec"`
	// AllowDevices lists the character devices, beyond the standard ones,
	// that the host may create in the pod's containers and let them open
	// (linux.devices and the device cgroup of their OCI specs, as CRI
	// device requests, device plugins and NRI plugins write them):
	// "c MAJOR:MINOR" or "c MAJOR:*" (DeviceRule). Absent or empty in init
	// data: none. The guest's own devices (TEE guest devices, its disks,
	// memory, the channels to the host) are refused even when listed.
	AllowDevices []string `toml:"allow_devices"`
	// AllowPortForward lists the TCP ports of the pod that the host may
	// open connections to (CRI port-forward, `kubectl port-forward`): a
	// channel from the host into the pod. Absent or empty in init data:
	// none. Without init data every port is allowed.
	AllowPortForward []uint32 `toml:"allow_port_forward"`

	// restrictDevices is set by Parse for any init data (DevicesRestricted):
	// then devices and ports it does not list are refused.
	restrictDevices bool
}

// ExecAllowed reports whether the host may exec into the pod's containers.
func (p AgentPolicy) ExecAllowed() bool { return p.AllowExec == nil || *p.AllowExec }

// PortForwardAllowed reports whether the host may port-forward to port.
func (p AgentPolicy) PortForwardAllowed(port uint32) bool {
	if !p.restrictDevices {
		return true
	}
	return slices.Contains(p.AllowPortForward, port)
}

// AnyPortForwardAllowed reports whether the host may port-forward to
// any port of the pod at all.
func (p AgentPolicy) AnyPortForwardAllowed() bool {
	return !p.restrictDevices || len(p.AllowPortForward) > 0
}

// Digest is the HOST_DATA of a VM launched with data: all zero for empty
// init data; for a CoCo document, its algorithm's digest of the document
// cut to (sha384, sha512) or zero-padded to 32 bytes; otherwise its
// SHA-256. A document Parse refuses has no meaningful digest.
func Digest(data []byte) [32]byte {
	var d [32]byte
	if len(data) == 0 {
		return d
	}
	if h, ok := cocoDigest(data); ok {
		copy(d[:], h) // truncates or zero-pads, as the specification says
		return d
	}
	return sha256.Sum256(data)
}

// DigestTDX is the MRCONFIGID of a TDX VM launched with data: all zero
// for empty init data; for a CoCo document, its algorithm's digest cut to
// or zero-padded to 48 bytes; otherwise its SHA-384.
func DigestTDX(data []byte) [48]byte {
	var d [48]byte
	if len(data) == 0 {
		return d
	}
	if h, ok := cocoDigest(data); ok {
		copy(d[:], h)
		return d
	}
	return sha512.Sum384(data)
}

// Parse reads init data strictly, in either format: an unknown key is an
// error naming it. Empty data gives the default policy.
func Parse(data []byte) (*InitData, error) {
	if len(data) == 0 {
		return &InitData{Version: Version, Format: FormatC8s}, nil
	}
	if len(bytes.TrimSpace(data)) == 0 {
		// Its digest is not zero, so the VM counts as launched with init
		// data, yet it would mean the allow-all default: refused, so that
		// no document both looks measured and allows everything.
		return nil, errors.New("init data: the document is only white space; give no init data at all, or a document with its version")
	}
	var (
		d   *InitData
		err error
	)
	if IsCoCo(data) {
		d, err = parseCoCo(data)
	} else if d, err = parseC8s(data); err == nil {
		err = d.KBS.validate()
	}
	if err != nil {
		return nil, err
	}
	// A pod with init data has stated what the host may ask of it: devices
	// it does not list are refused.
	d.Agent.restrictDevices = true
	return d, nil
}

// parseC8s reads c8s's own format; the kbs section is not validated yet.
func parseC8s(data []byte) (*InitData, error) {
	d := &InitData{Version: Version, Format: FormatC8s}
	if err := decodeStrict(data, d, "version, agent_policy.allow_exec, agent_policy.allow_devices, agent_policy.allow_port_forward, kbs.url, kbs.cert, kbs.secrets.resource, kbs.secrets.path, policy, mesh"); err != nil {
		return nil, fmt.Errorf("init data: %w", err)
	}
	if err := d.checkPolicy(); err != nil {
		return nil, err
	}
	if err := d.Agent.checkDevices(); err != nil {
		return nil, fmt.Errorf("init data: %w", err)
	}
	if err := d.Agent.checkPorts(); err != nil {
		return nil, fmt.Errorf("init data: %w", err)
	}
	if err := d.Mesh.validate(d.Agent); err != nil {
		return nil, err
	}
	if d.Version != Version {
		return nil, fmt.Errorf("init data: version %q is not supported; this agent reads version %q", d.Version, Version)
	}
	return d, nil
}

// decodeStrict decodes TOML data into v; an unknown key, or a known one
// in another case (exactKeys), is an error naming it and the known ones.
func decodeStrict(data []byte, v any, known string) error {
	if err := exactKeys(data, v); err != nil && toml.Unmarshal(data, new(map[string]any)) == nil {
		return err
	}
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	var strict *toml.StrictMissingError
	if errors.As(err, &strict) && len(strict.Errors) > 0 {
		var keys []string
		for _, e := range strict.Errors {
			if msg, ok := unknownPolicyKey(v, e.Key()); ok {
				return errors.New(msg)
			}
			keys = append(keys, strings.Join(e.Key(), "."))
		}
		return fmt.Errorf("unknown key %s (known: %s)", strings.Join(keys, ", "), known)
	}
	return err
}

// checkPorts refuses port numbers TCP does not have.
func (p AgentPolicy) checkPorts() error {
	for i, port := range p.AllowPortForward {
		if port == 0 || port > 65535 {
			return fmt.Errorf("agent_policy.allow_port_forward[%d] = %d is not a TCP port: use 1 to 65535", i, port)
		}
	}
	return nil
}
