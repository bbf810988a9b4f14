package reattest

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
)

// ErrNoBundle is what a Source returns when it holds no bundle (no file,
// no ConfigMap): not an error, nothing to take.
var ErrNoBundle = errors.New("no trust bundle")

// Source is where the owner's signed bundle is published: a file on the
// node or a ConfigMap.
type Source interface {
	// Name names the source in messages ("file /etc/c8s/bundle.jws").
	Name() string
	// Read returns the compact JWS, or an error wrapping ErrNoBundle
	// when the source holds none.
	Read(ctx context.Context) ([]byte, error)
}

// FileSource is a bundle file.
type FileSource string

// Name implements Source.
func (f FileSource) Name() string { return "file " + string(f) }

// Read implements Source.
func (f FileSource) Read(context.Context) ([]byte, error) {
	b, err := os.ReadFile(string(f))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", f.Name(), ErrNoBundle)
	}
	return b, err
}

// Store holds the bundle in force: the verified bundle with the highest
// serial read from its sources so far. A source that holds a bundle with
// a bad signature, a malformed one, an older one or a different one with
// the same serial changes nothing; Refresh reports it. A bundle that
// disappears from its source stays in force: removing it must not undo a
// revocation.
type Store struct {
	keys    []crypto.PublicKey
	sources []Source

	mu  sync.Mutex
	cur *Signed
	// seen is the last content read per source, so that a rejection is
	// reported once, not at every refresh.
	seen map[string][]byte
}

// NewStore returns a store that takes bundles from sources signed with
// one of keys.
func NewStore(keys []crypto.PublicKey, sources ...Source) (*Store, error) {
	if len(keys) == 0 && len(sources) > 0 {
		return nil, errors.New("trust bundle sources without an owner key: pass the owner's public key (--trust-bundle-key)")
	}
	for _, k := range keys {
		if err := checkKey(k); err != nil {
			return nil, err
		}
	}
	return &Store{keys: keys, sources: sources, seen: map[string][]byte{}}, nil
}

// Current returns the bundle in force, nil for none.
func (s *Store) Current() *Signed {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// Refresh reads every source and takes the newest bundle that verifies.
// It returns whether the bundle in force changed and, once per new
// content of a source, why that content was refused.
func (s *Store) Refresh(ctx context.Context) (changed bool, rejected []error) {
	if s == nil {
		return false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, src := range s.sources {
		data, err := src.Read(ctx)
		if errors.Is(err, ErrNoBundle) {
			delete(s.seen, src.Name())
			continue
		}
		if err != nil {
			// A read failure (API server away) keeps what is in force.
			rejected = append(rejected, fmt.Errorf("%s: %w", src.Name(), err))
			continue
		}
		if prev, ok := s.seen[src.Name()]; ok && bytes.Equal(prev, data) {
			continue
		}
		s.seen[src.Name()] = data
		b, err := Verify(data, s.keys)
		if err != nil {
			rejected = append(rejected, fmt.Errorf("%s: %w; the bundle in force (%s) stays", src.Name(), err, s.describe()))
			continue
		}
		switch {
		case s.cur == nil || b.Serial > s.cur.Serial:
			s.cur, changed = b, true
		case b.Serial == s.cur.Serial && b.Digest != s.cur.Digest:
			rejected = append(rejected, fmt.Errorf("%s: serial %d with content other than the bundle in force with the same serial: refused (the owner numbers each new bundle higher)", src.Name(), b.Serial))
		case b.Serial < s.cur.Serial:
			rejected = append(rejected, fmt.Errorf("%s: serial %d is older than the bundle in force (serial %d): refused, a rollback", src.Name(), b.Serial, s.cur.Serial))
		}
	}
	return changed, rejected
}

// describe names the bundle in force; s.mu is held.
func (s *Store) describe() string {
	if s.cur == nil {
		return "none"
	}
	return fmt.Sprintf("serial %d", s.cur.Serial)
}
