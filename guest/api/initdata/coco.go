package initdata

import (
	"crypto"
	"fmt"
	"hash"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// CoCo's init data format (trustee kbs/docs/initdata.md, "Initdata
// Specification"; read by Trustee's attestation service and
// guest-components' attestation agent as the TOML struct Initdata
// {version, algorithm, data}):
//
//	version = "0.1.0"
//	algorithm = "sha384"          # sha256, sha384 or sha512
//	[data]
//	"c8s.toml" = '''             # c8s's own settings: agent_policy, kbs
//	[agent_policy]
//	allow_exec = false
//	[kbs]
//	url = "https://kbs.example:8080"
//	cert = """..."""
//	[[kbs.secrets]]
//	resource = "kbs:///default/key/db-password"
//	path = "/run/secrets/db-password"
//	'''
//	"cdh.toml" = '''...'''        # CoCo's data hub config: [kbc] url, kbs_cert
//	"aa.toml" = '''...'''         # CoCo's attestation agent: [token_configs.kbs]
//
// Its digest is the named hash over the whole document as written, cut or
// zero-padded to the TEE field: the first 32 bytes for SNP HOST_DATA, 48
// for TDX MRCONFIGID.
const (
	// CoCoVersion is the only version the specification defines.
	CoCoVersion = "0.1.0"
	// CoCoC8sKey is the data entry holding c8s's settings.
	CoCoC8sKey = "c8s.toml"
	// CoCoCDHKey and CoCoAAKey are CoCo's guest component configs, from
	// which the broker URL and certificate are taken when c8s.toml names
	// secrets but no broker.
	CoCoCDHKey = "cdh.toml"
	CoCoAAKey  = "aa.toml"
	// CoCoPolicyKey is a Kata agent policy, which c8s does not evaluate:
	// a document carrying one is refused.
	CoCoPolicyKey = "policy.rego"
)

// Formats of init data.
const (
	FormatC8s  = "c8s"
	FormatCoCo = "coco"
)

// CoCo is a parsed CoCo init data document.
type CoCo struct {
	Version   string            `toml:"version"`
	Algorithm string            `toml:"algorithm"`
	Data      map[string]string `toml:"data"`
}

// CoCoAlgorithms are the digest algorithms this package computes.
var CoCoAlgorithms = []string{"sha256", "sha384", "sha512"}

var cocoHashes = map[string]crypto.Hash{"sha256": crypto.SHA256, "sha384": crypto.SHA384, "sha512": crypto.SHA512}

func cocoHash(alg string) (hash.Hash, error) {
	if h, ok := cocoHashes[alg]; ok {
		return h.New(), nil
	}
	return nil, fmt.Errorf("init data: algorithm %q is not supported (use one of %s)", alg, strings.Join(CoCoAlgorithms, ", "))
}

// IsCoCo reports whether data is in CoCo's format: a TOML document with a
// top-level algorithm key or data table. c8s's own format has neither.
func IsCoCo(data []byte) bool {
	var top map[string]any
	if toml.Unmarshal(data, &top) != nil {
		return false
	}
	_, alg := top["algorithm"]
	_, dat := top["data"]
	return alg || dat
}

// ParseCoCo reads a CoCo init data document strictly: version 0.1.0, a
// supported algorithm, string values in data, no other top-level key.
func ParseCoCo(data []byte) (*CoCo, error) {
	var c CoCo
	if err := decodeStrict(data, &c, "version, algorithm, data"); err != nil {
		return nil, fmt.Errorf("init data (CoCo format): %w", err)
	}
	if c.Version != CoCoVersion {
		return nil, fmt.Errorf("init data (CoCo format): version %q is not supported; the specification defines %q", c.Version, CoCoVersion)
	}
	if _, err := cocoHash(c.Algorithm); err != nil {
		return nil, err
	}
	return &c, nil
}

// cocoDigest is the specification's init data digest of data, before it
// is fitted to a TEE field, or false when data is not a valid CoCo
// document.
func cocoDigest(data []byte) ([]byte, bool) {
	if !IsCoCo(data) {
		return nil, false
	}
	c, err := ParseCoCo(data)
	if err != nil {
		return nil, false
	}
	h, _ := cocoHash(c.Algorithm) // checked by ParseCoCo
	h.Write(data)
	return h.Sum(nil), true
}

// cdhConfig is the part of CoCo's confidential data hub config that names
// the broker.
type cdhConfig struct {
	KBC struct {
		Name    string `toml:"name"`
		URL     string `toml:"url"`
		KBSCert string `toml:"kbs_cert"`
	} `toml:"kbc"`
}

// aaConfig is the part of CoCo's attestation agent config that names the
// broker.
type aaConfig struct {
	TokenConfigs struct {
		KBS struct {
			URL  string `toml:"url"`
			Cert string `toml:"cert"`
		} `toml:"kbs"`
	} `toml:"token_configs"`
}

// parseCoCo reads a CoCo document into c8s's settings: those of its
// c8s.toml entry (c8s's own format, version optional), with the broker
// taken from cdh.toml or aa.toml when c8s.toml names secrets but no
// broker.
func parseCoCo(data []byte) (*InitData, error) {
	c, err := ParseCoCo(data)
	if err != nil {
		return nil, err
	}
	// The owner wrote a policy the guest would not enforce: refused,
	// with or without c8s's own, rather than silently ignored.
	if _, ok := c.Data[CoCoPolicyKey]; ok {
		return nil, fmt.Errorf("init data: entry %s is a Kata agent policy, which c8s does not evaluate and would ignore: remove it and state the agent policy in the entry %q (its [agent_policy] and [policy] sections, guest/api/policy)", CoCoPolicyKey, CoCoC8sKey)
	}
	d := &InitData{Version: Version}
	if body, ok := c.Data[CoCoC8sKey]; ok {
		if d, err = parseC8s([]byte(body)); err != nil {
			return nil, fmt.Errorf("init data entry %s: %w", CoCoC8sKey, err)
		}
	}
	d.Format, d.CoCo = FormatCoCo, c
	if d.KBS.URL == "" && len(d.KBS.Secrets) > 0 {
		if d.KBS.URL, d.KBS.Cert, err = cocoBroker(c); err != nil {
			return nil, err
		}
	}
	if err := d.KBS.validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// cocoBroker returns the broker URL and certificate CoCo's own configs
// give: cdh.toml's [kbc] (a cc_kbc), else aa.toml's [token_configs.kbs].
// Their other keys are CoCo's, not read here; one of those read in
// another case ([KBC], URL) is refused, as CoCo's components would not
// read it.
func cocoBroker(c *CoCo) (url, cert string, err error) {
	var cdh cdhConfig
	if body, ok := c.Data[CoCoCDHKey]; ok {
		if err := exactKeys([]byte(body), &cdh); err != nil {
			return "", "", fmt.Errorf("init data entry %s: %w", CoCoCDHKey, err)
		}
		if toml.Unmarshal([]byte(body), &cdh) == nil && cdh.KBC.URL != "" && (cdh.KBC.Name == "" || cdh.KBC.Name == "cc_kbc") {
			return cdh.KBC.URL, cdh.KBC.KBSCert, nil
		}
	}
	var aa aaConfig
	if body, ok := c.Data[CoCoAAKey]; ok {
		if err := exactKeys([]byte(body), &aa); err != nil {
			return "", "", fmt.Errorf("init data entry %s: %w", CoCoAAKey, err)
		}
		if toml.Unmarshal([]byte(body), &aa) == nil && aa.TokenConfigs.KBS.URL != "" {
			return aa.TokenConfigs.KBS.URL, aa.TokenConfigs.KBS.Cert, nil
		}
	}
	return "", "", nil
}
