package mesh

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	meshapi "github.com/c8s-dev/c8s/guest/api/mesh"
)

// Store keeps the pod's certificate, key and mesh CA in Dir, which the
// agent bind-mounts (the directory, so that renewals show) into the
// containers the init data names. A renewal replaces all three at once,
// as Kubernetes' atomic writer does for projected volumes: the files are
// written to a new version directory, the "..data" symlink is switched to
// it by a rename, and cert.pem, key.pem and ca.pem are symlinks through
// "..data". A reader never sees a key from one issue and a certificate
// from another.
type Store struct {
	// Dir is the directory (guest: guest/api/mesh.Dir on a tmpfs).
	Dir string

	version int
}

// dataLink is the symlink to the current version directory.
const dataLink = "..data"

var files = []string{meshapi.CertFile, meshapi.KeyFile, meshapi.CAFile}

// Write makes c the pod's certificate.
func (s *Store) Write(c *Certificate) error {
	if err := os.MkdirAll(s.Dir, 0o755); err != nil {
		return err
	}
	s.version++
	name := ".v" + strconv.Itoa(s.version)
	vdir := filepath.Join(s.Dir, name)
	_ = os.RemoveAll(vdir)
	if err := os.Mkdir(vdir, 0o755); err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	// The workload may run as any user: the files are readable by all.
	// Only the containers the init data names see the directory.
	for f, data := range map[string][]byte{meshapi.CertFile: c.CertPEM, meshapi.KeyFile: c.KeyPEM, meshapi.CAFile: c.CAPEM} {
		p := filepath.Join(vdir, f)
		if err := os.WriteFile(p, data, 0o444); err != nil {
			return fmt.Errorf("mesh: write %s: %w", f, err)
		}
		if err := os.Chmod(p, 0o444); err != nil {
			return err
		}
	}
	tmp := filepath.Join(s.Dir, dataLink+".tmp")
	_ = os.Remove(tmp)
	if err := os.Symlink(name, tmp); err != nil {
		return fmt.Errorf("mesh: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, dataLink)); err != nil {
		return fmt.Errorf("mesh: switch to the new certificate: %w", err)
	}
	for _, f := range files {
		link := filepath.Join(s.Dir, f)
		if target, err := os.Readlink(link); err == nil && target == filepath.Join(dataLink, f) {
			continue
		}
		_ = os.Remove(link)
		if err := os.Symlink(filepath.Join(dataLink, f), link); err != nil {
			return fmt.Errorf("mesh: %w", err)
		}
	}
	return s.prune(name)
}

// prune removes the version directories but keep.
func (s *Store) prune(keep string) error {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".v") && e.Name() != keep {
			errs = append(errs, os.RemoveAll(filepath.Join(s.Dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// Remove deletes the certificate, key and CA: the pod has no identity.
func (s *Store) Remove() error {
	var errs []error
	for _, f := range append(files, dataLink) {
		if err := os.Remove(filepath.Join(s.Dir, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if _, err := os.Stat(s.Dir); errors.Is(err, os.ErrNotExist) {
		return errors.Join(errs...)
	}
	errs = append(errs, s.prune(""))
	return errors.Join(errs...)
}
