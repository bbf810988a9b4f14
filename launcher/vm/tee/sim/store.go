package sim

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/c8s-dev/c8s/launcher/vm/tee/sim/simtrust"
	"github.com/google/go-sev-guest/abi"
	"github.com/google/go-sev-guest/kds"
)

const (
	// IdentityFile is the file in the state directory that holds the keys
	// and certificates (mode 0600).
	IdentityFile = "simsp.json"
	// CertChainFile is the file in the state directory that holds the ASK
	// and the ARK, PEM: the trust anchor a sim-mode verifier is configured
	// with (simtrust.CertChainFile).
	CertChainFile = simtrust.CertChainFile

	formatVersion = 1
)

// stored is the on-disk form of an identity.
type stored struct {
	Version     int    `json:"version"`
	Note        string `json:"note"`
	ProductLine string `json:"product_line"`
	ChipID      string `json:"chip_id"`
	TCB         uint64 `json:"tcb"`
	ARKKey      string `json:"ark_key"`
	ASKKey      string `json:"ask_key"`
	VCEKKey     string `json:"vcek_key"`
	ARK         string `json:"ark"`
	ASK         string `json:"ask"`
	VCEK        string `json:"vcek"`
}

// Open returns the simulated secure processor whose identity lives in dir,
// creating the directory and a new identity (fresh keys, random chip id,
// DefaultTCB) when there is none yet. Concurrent first calls on one node
// agree on a single identity. A damaged identity file is an error naming
// the file; it is never silently replaced.
func Open(dir string) (*SP, error) {
	sp, err := Load(dir)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return sp, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("sim: creating the state dir: %w", err)
	}
	created, err := New(DefaultTCB)
	if err != nil {
		return nil, err
	}
	won, err := created.save(dir)
	if err != nil {
		return nil, err
	}
	if !won {
		// Another process created the identity first: use theirs.
		return Load(dir)
	}
	return created, nil
}

// Load returns the identity stored in dir. A missing identity is an error
// that matches fs.ErrNotExist.
func Load(dir string) (*SP, error) {
	path := filepath.Join(dir, IdentityFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: reading the simulated identity: %w", err)
	}
	sp, err := decode(b)
	if err != nil {
		return nil, fmt.Errorf("sim: %s is damaged (%v); remove it to create a new simulated identity (pods then need a verifier with the new %s)", path, err, CertChainFile)
	}
	// The published chain is derived data: rewrite it if it is missing or stale.
	chainPath := filepath.Join(dir, CertChainFile)
	if cur, err := os.ReadFile(chainPath); err != nil || string(cur) != string(sp.CertChainPEM()) {
		if err := writeAtomic(chainPath, sp.CertChainPEM(), 0o644); err != nil {
			return nil, err
		}
	}
	return sp, nil
}

// New returns a fresh identity that lives in memory only: new keys, a
// random chip id and the given TCB.
func New(tcb kds.TCBParts) (*SP, error) {
	if _, err := kds.ComposeTCBParts(tcb); err != nil {
		return nil, fmt.Errorf("sim: TCB: %w", err)
	}
	k, err := newKeys()
	if err != nil {
		return nil, err
	}
	var chipID [abi.ChipIDSize]byte
	if _, err := rand.Read(chipID[:]); err != nil {
		return nil, fmt.Errorf("sim: chip id: %w", err)
	}
	c, err := newChain(k, chipID, tcb, time.Now())
	if err != nil {
		return nil, err
	}
	return &SP{keys: k, chain: c, chipID: chipID, tcb: tcb}, nil
}

func pemBlock(typ string, der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
}

func (sp *SP) encode() ([]byte, error) {
	var keyPEM [3]string
	for i, k := range []any{sp.keys.ark, sp.keys.ask, sp.keys.vcek} {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("sim: encoding a key: %w", err)
		}
		keyPEM[i] = pemBlock("PRIVATE KEY", der)
	}
	tcb, err := kds.ComposeTCBParts(sp.tcb)
	if err != nil {
		return nil, fmt.Errorf("sim: TCB: %w", err)
	}
	return json.MarshalIndent(stored{
		Version:     formatVersion,
		Note:        "c8s simulated AMD secure processor identity: TEST ONLY, not an AMD key",
		ProductLine: ProductLine,
		ChipID:      hex.EncodeToString(sp.chipID[:]),
		TCB:         uint64(tcb),
		ARKKey:      keyPEM[0],
		ASKKey:      keyPEM[1],
		VCEKKey:     keyPEM[2],
		ARK:         pemBlock("CERTIFICATE", sp.chain.ark.Raw),
		ASK:         pemBlock("CERTIFICATE", sp.chain.ask.Raw),
		VCEK:        pemBlock("CERTIFICATE", sp.chain.vcek.Raw),
	}, "", "  ")
}

func decode(b []byte) (*SP, error) {
	var s stored
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("not valid JSON: %w", err)
	}
	if s.Version != formatVersion {
		return nil, fmt.Errorf("format version %d, this c8s reads %d", s.Version, formatVersion)
	}
	if s.ProductLine != ProductLine {
		return nil, fmt.Errorf("product line %q, expected %q", s.ProductLine, ProductLine)
	}
	sp := &SP{keys: &keys{}, chain: &chain{}, tcb: kds.DecomposeTCBVersion(kds.TCBVersion(s.TCB))}
	id, err := hex.DecodeString(s.ChipID)
	if err != nil || len(id) != abi.ChipIDSize {
		return nil, fmt.Errorf("chip_id is not %d hex bytes", abi.ChipIDSize)
	}
	copy(sp.chipID[:], id)
	var ok bool
	if sp.keys.ark, ok = parseKey(s.ARKKey).(*rsa.PrivateKey); !ok {
		return nil, errors.New("ark_key is not an RSA private key")
	}
	if sp.keys.ask, ok = parseKey(s.ASKKey).(*rsa.PrivateKey); !ok {
		return nil, errors.New("ask_key is not an RSA private key")
	}
	if sp.keys.vcek, ok = parseKey(s.VCEKKey).(*ecdsa.PrivateKey); !ok {
		return nil, errors.New("vcek_key is not an ECDSA private key")
	}
	for _, c := range []struct {
		name string
		pem  string
		dst  **x509.Certificate
	}{{"ark", s.ARK, &sp.chain.ark}, {"ask", s.ASK, &sp.chain.ask}, {"vcek", s.VCEK, &sp.chain.vcek}} {
		blk, _ := pem.Decode([]byte(c.pem))
		if blk == nil || blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s is not a PEM certificate", c.name)
		}
		if *c.dst, err = x509.ParseCertificate(blk.Bytes); err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	if err := sp.check(); err != nil {
		return nil, err
	}
	return sp, nil
}

func parseKey(s string) any {
	blk, _ := pem.Decode([]byte(s))
	if blk == nil || blk.Type != "PRIVATE KEY" {
		return nil
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		return nil
	}
	return k
}

// check verifies that the stored keys, certificates, chip id and TCB belong
// together.
func (sp *SP) check() error {
	if !sp.keys.ark.PublicKey.Equal(sp.chain.ark.PublicKey) {
		return errors.New("the ARK certificate is not for ark_key")
	}
	if !sp.keys.ask.PublicKey.Equal(sp.chain.ask.PublicKey) {
		return errors.New("the ASK certificate is not for ask_key")
	}
	if !sp.keys.vcek.PublicKey.Equal(sp.chain.vcek.PublicKey) {
		return errors.New("the VCEK certificate is not for vcek_key")
	}
	if err := sp.chain.ask.CheckSignatureFrom(sp.chain.ark); err != nil {
		return fmt.Errorf("the ASK is not signed by the ARK: %w", err)
	}
	if err := sp.chain.vcek.CheckSignatureFrom(sp.chain.ask); err != nil {
		return fmt.Errorf("the VCEK is not signed by the ASK: %w", err)
	}
	exts, err := kds.VcekCertificateExtensions(sp.chain.vcek)
	if err != nil {
		return fmt.Errorf("VCEK extensions: %w", err)
	}
	if string(exts.HWID) != string(sp.chipID[:]) {
		return errors.New("chip_id differs from the VCEK's HWID")
	}
	if tcb, _ := kds.ComposeTCBParts(sp.tcb); tcb != exts.TCBVersion {
		return fmt.Errorf("tcb %#x differs from the VCEK's TCB %#x", uint64(tcb), uint64(exts.TCBVersion))
	}
	return nil
}

// save writes the identity into dir unless one exists already; it reports
// whether this identity is the one now stored.
func (sp *SP) save(dir string) (bool, error) {
	b, err := sp.encode()
	if err != nil {
		return false, err
	}
	tmp, err := writeTemp(dir, IdentityFile, b, 0o600)
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	// link(2) fails if the target exists: the first creator wins, atomically.
	if err := os.Link(tmp, filepath.Join(dir, IdentityFile)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("sim: storing the simulated identity: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return false, err
	}
	return true, writeAtomic(filepath.Join(dir, CertChainFile), sp.CertChainPEM(), 0o644)
}

// writeTemp writes data to a new, synced temporary file next to name.
func writeTemp(dir, name string, data []byte, mode os.FileMode) (string, error) {
	f, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return "", fmt.Errorf("sim: %w", err)
	}
	tmp := f.Name()
	err = f.Chmod(mode)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("sim: writing %s: %w", name, err)
	}
	return tmp, nil
}

// writeAtomic replaces path with data (temporary file, fsync, rename).
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	tmp, err := writeTemp(dir, filepath.Base(path), data, mode)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("sim: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sim: syncing %s: %w", dir, err)
	}
	return nil
}
