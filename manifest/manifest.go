// Package manifest defines manifest.json, the description of a built c8s guest
// image (kernel, initramfs, versions, recommended command line), and reads,
// writes and verifies it. images/build.sh writes it; the launcher reads it.
package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Schema identifies the version of the manifest format.
//
// v2 added the sealed image: the rootfs, initrd-plain, uki and igvm
// artefacts, the verity parameters and the snp and uki digests.
//
// v3 measures each TEE over its own command line: Cmdline followed by the
// TEE's parameters (c8s.tee=<tee>), recorded in digests.<tee>.cmdline
// (new for tdx). A v2 image's digests assume a command line the launcher
// no longer boots.
const Schema = "c8s.io/image-manifest/v3"

// FileName is the name of the manifest inside an image directory.
const FileName = "manifest.json"

// Artifact roles used as keys in Manifest.Artifacts.
const (
	RoleKernel = "kernel"
	RoleInitrd = "initrd"
)

// Manifest describes one built guest image.
type Manifest struct {
	// Schema is always the Schema constant.
	Schema string `json:"schema"`
	// Artifacts maps a role (RoleKernel, RoleInitrd) to its file.
	Artifacts map[string]Artifact `json:"artifacts"`
	// Kernel names the Debian package the kernel and modules come from.
	Kernel Kernel `json:"kernel"`
	// Runc names the Debian package runc in the initramfs comes from.
	Runc Package `json:"runc"`
	// Packages lists every Debian package whose files are in the image
	// (kernel, runc and the libraries it links), and, as src:NAME, the
	// Debian source packages built into it (crun, images/crun.sh) with
	// the packages whose compiler and static libraries went into them,
	// sorted by name after the kernel: the provenance needed to rebuild
	// the image byte for byte.
	Packages []Package `json:"packages"`
	// Cmdline is the part of the kernel command line every TEE shares:
	// the launcher's built-in parameters and, for a sealed image, the
	// verity parameters of the root. A pod VM boots it followed by its
	// TEE's own parameters (c8s.tee=<tee>, which the guest trusts to pick
	// its attestation provider), so each TEE's digests are over its own
	// command line, recorded with them (digests.<tee>.cmdline). The UKI's
	// .cmdline is this common line: the launcher does not boot the UKI.
	Cmdline string `json:"cmdline"`
	// Verity describes the rootfs artefact's hash tree; nil for an unsealed
	// image.
	Verity *Verity `json:"verity,omitempty"`
	// AgentSHA256 is the hex sha256 of the agent binary (/init of the
	// measured initrd.img, which runs the first stage; /init of
	// initrd-plain.img too).
	AgentSHA256 string `json:"agent_sha256"`
	// SourceDateEpoch is the timestamp of every file in the initramfs.
	SourceDateEpoch int64 `json:"source_date_epoch"`
	// Digests holds expected launch digests, keyed by platform (for example
	// "sev-snp", "tdx"). The value format of each platform is defined by
	// the measurements package; it is empty until measurements are added.
	Digests map[string]json.RawMessage `json:"digests"`
}

// Kernel identifies the guest kernel.
type Kernel struct {
	Package string `json:"package"`
	Version string `json:"version"`
	// Release is the kernel release (uname -r), e.g. 6.12.107+deb12-cloud-amd64.
	Release string `json:"release"`
}

// Package identifies a Debian package by name and version.
type Package struct {
	Package string `json:"package"`
	Version string `json:"version"`
}

// Artifact is one file of the image, relative to the image directory.
type Artifact struct {
	File   string `json:"file"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Validate reports the first structural problem of m: wrong schema, missing
// kernel or initrd, an artefact path that leaves the image directory, or a
// malformed digest.
func (m *Manifest) Validate() error {
	if m.Schema != Schema {
		return fmt.Errorf("manifest schema is %q, want %q; rebuild the image with 'make image'", m.Schema, Schema)
	}
	for _, role := range []string{RoleKernel, RoleInitrd} {
		if _, ok := m.Artifacts[role]; !ok {
			return fmt.Errorf("manifest has no %q artifact", role)
		}
	}
	for _, role := range slices.Sorted(maps.Keys(m.Artifacts)) {
		a := m.Artifacts[role]
		if a.File == "" || filepath.IsAbs(a.File) || a.File != filepath.Clean(a.File) ||
			strings.HasPrefix(a.File, "..") || strings.ContainsRune(a.File, '/') {
			return fmt.Errorf("manifest artifact %q has invalid file name %q: want a plain file name", role, a.File)
		}
		if !isSHA256(a.SHA256) {
			return fmt.Errorf("manifest artifact %q has invalid sha256 %q", role, a.SHA256)
		}
		if a.Size < 0 {
			return fmt.Errorf("manifest artifact %q has negative size %d", role, a.Size)
		}
	}
	for _, p := range m.Packages {
		if p.Package == "" || p.Version == "" {
			return fmt.Errorf("manifest package entry %+v lacks a name or version", p)
		}
	}
	if _, ok := m.Artifacts[RoleRootfs]; ok && m.Verity == nil {
		return errors.New("manifest has a rootfs artifact but no verity parameters; rebuild the image with 'make image'")
	}
	if m.Verity != nil {
		if err := m.Verity.Validate(); err != nil {
			return err
		}
	}
	if m.AgentSHA256 != "" && !isSHA256(m.AgentSHA256) {
		return fmt.Errorf("manifest agent_sha256 %q is not a hex sha256", m.AgentSHA256)
	}
	return nil
}

func isSHA256(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == sha256.Size && strings.ToLower(s) == s
}

// Parse decodes and validates a manifest. Unknown fields are rejected, so
// that a manifest from a newer schema is not half understood.
func Parse(data []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("decode manifest: %w", err)
	}
	if dec.More() {
		return nil, errors.New("decode manifest: trailing data after the JSON object")
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return &m, nil
}

// Load reads and validates the manifest at path.
func Load(path string) (*Manifest, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read image manifest: %w (build the image with 'make image')", err)
	}
	m, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Marshal encodes m as indented JSON with a trailing newline. The output is
// deterministic: map keys are sorted.
func (m *Manifest) Marshal() ([]byte, error) {
	if m.Digests == nil {
		m.Digests = map[string]json.RawMessage{}
	}
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Path returns the path of the artefact with the given role in dir.
func (m *Manifest) Path(dir, role string) (string, error) {
	a, ok := m.Artifacts[role]
	if !ok {
		return "", fmt.Errorf("manifest has no %q artifact", role)
	}
	return filepath.Join(dir, a.File), nil
}

// Describe hashes the file at path and returns its Artifact, named by its
// base name.
func Describe(path string) (Artifact, error) {
	size, sum, err := hashFile(path)
	if err != nil {
		return Artifact{}, err
	}
	return Artifact{File: filepath.Base(path), Size: size, SHA256: sum}, nil
}

func hashFile(path string) (int64, string, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", fmt.Errorf("hash %s: %w", path, err)
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}

// Mismatch is one artefact whose file does not match the manifest.
type Mismatch struct {
	Role    string
	File    string
	Want    Artifact
	GotSize int64
	GotHash string
	Problem string // set when the file could not be read
}

func (m Mismatch) String() string {
	if m.Problem != "" {
		return fmt.Sprintf("%s (%s): %s", m.Role, m.File, m.Problem)
	}
	return fmt.Sprintf("%s (%s): size %d sha256 %s, manifest says size %d sha256 %s",
		m.Role, m.File, m.GotSize, m.GotHash, m.Want.Size, m.Want.SHA256)
}

// VerifyError lists every artefact that does not match its manifest entry.
type VerifyError struct {
	Dir        string
	Mismatches []Mismatch
}

func (e *VerifyError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "image in %s does not match its manifest (rebuild it with 'make image'):", e.Dir)
	for _, m := range e.Mismatches {
		b.WriteString("\n  ")
		b.WriteString(m.String())
	}
	return b.String()
}

// Verify loads dir/manifest.json, rehashes every artefact and returns the
// manifest. When a file is missing or differs in size or sha256, it returns
// a *VerifyError that names each one.
func Verify(dir string) (*Manifest, error) {
	m, err := Load(filepath.Join(dir, FileName))
	if err != nil {
		return nil, err
	}
	var bad []Mismatch
	for _, role := range slices.Sorted(maps.Keys(m.Artifacts)) {
		want := m.Artifacts[role]
		size, sum, err := hashFile(filepath.Join(dir, want.File))
		switch {
		case err != nil:
			bad = append(bad, Mismatch{Role: role, File: want.File, Want: want, Problem: err.Error()})
		case size != want.Size || sum != want.SHA256:
			bad = append(bad, Mismatch{Role: role, File: want.File, Want: want, GotSize: size, GotHash: sum})
		}
	}
	if len(bad) > 0 {
		return m, &VerifyError{Dir: dir, Mismatches: bad}
	}
	return m, nil
}
