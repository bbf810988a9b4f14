// Package uki precomputes the measurements of a unified kernel image (UKI):
// a systemd-stub EFI executable carrying the kernel, initrd, command line
// and friends in PE sections.
//
// For a UKI it reports
//   - the image's Authenticode digests (SHA-256 and SHA-384), which firmware
//     measures when it loads the UKI (PCR 4, or RTMR1 under TDX) and which
//     Secure Boot signs;
//   - the SHA-256 and SHA-384 digest of every section systemd-stub knows;
//   - the PCR 11 value systemd-stub leaves behind, in the SHA-1, SHA-256,
//     SHA-384 and SHA-512 banks, as `systemd-measure calculate --phase=`
//     computes it from the same inputs, and after each of the boot phases
//     systemd-pcrphase measures later (DefaultPhases).
//
// systemd-stub's PCR 11 convention: starting from an all-zero PCR, for each
// section it measures, in the stub's canonical order
// (.linux .osrel .cmdline .initrd .ucode .splash .dtb .uname .sbat .pcrpkey),
// it extends PCR 11 twice: once with the digest of the section name
// including its terminating NUL, once with the digest of the section's
// in-memory contents (VirtualSize bytes: the file data, zero-filled when
// VirtualSize exceeds SizeOfRawData). .pcrsig is never measured. When a name
// occurs more than once the first section wins.
//
// Which sections are measured depends on the stub version, read from the
// stub's .sdmagic section ("#### LoaderInfo: systemd-stub 252.39 ####"):
// .uname and .sbat are measured from systemd 254 on and .ucode from 256 on
// (Debian 12 ships 252, whose stub carries an .sbat section it does not
// measure). Version 257 introduced multi-profile UKIs (.profile sections)
// and device-dependent sections (.dtbauto, .hwids, .efifw); their PCR 11
// depends on the profile and device chosen at boot, and Measure refuses
// them rather than guess.
//
// The package is pure: it takes the image bytes, does no file I/O and never
// panics on malformed input.
package uki

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"errors"
	"fmt"
	"hash"
	"io"
	"regexp"
	"slices"
	"strconv"

	"github.com/c8s-dev/c8s/measurements/uki/pecoff"
)

// Bank names a PCR bank (hash algorithm), spelled as systemd-measure does.
type Bank string

// The PCR banks systemd-measure computes.
const (
	SHA1   Bank = "sha1"
	SHA256 Bank = "sha256"
	SHA384 Bank = "sha384"
	SHA512 Bank = "sha512"
)

// Banks lists every bank Measure computes, in systemd-measure's order.
var Banks = []Bank{SHA1, SHA256, SHA384, SHA512}

// New returns a new hash of the bank's algorithm.
func (b Bank) New() (hash.Hash, error) {
	switch b {
	case SHA1:
		return sha1.New(), nil
	case SHA256:
		return sha256.New(), nil
	case SHA384:
		return sha512.New384(), nil
	case SHA512:
		return sha512.New(), nil
	}
	return nil, fmt.Errorf("uki: unknown PCR bank %q (want sha1, sha256, sha384 or sha512)", string(b))
}

// PCRIndex is the TPM PCR systemd-stub measures UKI sections into.
const PCRIndex = 11

// DefaultStubVersion is assumed when a UKI's stub does not identify itself
// in an .sdmagic section: the newest behaviour this package models.
const DefaultStubVersion = 256

// maxZeroFill bounds the zeros the stub's sections may gain in total when
// loaded (VirtualSize beyond SizeOfRawData). UKI sections hold file
// payloads whose VirtualSize is their exact size, so anything large is a
// malformed image rather than a real UKI (and would only burn CPU).
const maxZeroFill = 1 << 20

// canonical is systemd-stub's measurement order, with the first stub
// version that measures each section.
var canonical = []struct {
	name  string
	since int
}{
	{".linux", 0},
	{".osrel", 0},
	{".cmdline", 0},
	{".initrd", 0},
	{".ucode", 256},
	{".splash", 0},
	{".dtb", 0},
	{".uname", 254},
	{".sbat", 254},
	{".pcrpkey", 0},
}

// known lists every section name systemd-stub gives a meaning to.
var known = []string{".linux", ".osrel", ".cmdline", ".initrd", ".ucode", ".splash", ".dtb",
	".uname", ".sbat", ".pcrsig", ".pcrpkey", ".profile", ".dtbauto", ".hwids", ".efifw"}

// unsupported are sections whose measurement depends on boot-time choices.
var unsupported = []string{".profile", ".dtbauto", ".hwids", ".efifw"}

// MeasuredSections returns the names of the sections a stub of the given
// major version measures into PCR 11, in measurement order.
func MeasuredSections(stubVersion int) []string {
	var out []string
	for _, c := range canonical {
		if stubVersion >= c.since {
			out = append(out, c.name)
		}
	}
	return out
}

// Options tunes Measure.
type Options struct {
	// StubVersion overrides the systemd-stub major version read from the
	// .sdmagic section. Zero means detect, falling back to
	// DefaultStubVersion.
	StubVersion int
}

// Section describes one systemd-stub section of the image.
type Section struct {
	Name string
	// Size is the number of bytes measured: the section's VirtualSize.
	Size uint32
	// Measured is true when the stub extends this section into PCR 11.
	Measured bool
	SHA256   []byte
	SHA384   []byte
}

// Report is the result of Measure.
type Report struct {
	// StubVersion is the systemd-stub major version the prediction
	// assumes; StubVersionSource says where it came from.
	StubVersion       int
	StubVersionSource string
	// StubInfo is the stub's self-description from .sdmagic, if any.
	StubInfo           string
	AuthenticodeSHA256 []byte
	AuthenticodeSHA384 []byte
	Sections           []Section
	// PCR11 maps each bank to the predicted PCR 11 value after systemd-stub
	// ran (before systemd-pcrphase extends any boot phase).
	PCR11 map[Bank][]byte
	// Phases holds PCR 11 after each of the DefaultPhases.
	Phases []PhaseValue
}

var sdmagicRE = regexp.MustCompile(`systemd-stub ([0-9]+)`)

// stubVersion extracts the stub's major version from its .sdmagic text.
func stubVersion(magic []byte) (string, int, bool) {
	info := string(bytes.TrimRight(magic, "\x00"))
	m := sdmagicRE.FindStringSubmatch(info)
	if m == nil {
		return info, 0, false
	}
	v, err := strconv.Atoi(m[1])
	if err != nil || v <= 0 {
		return info, 0, false
	}
	return info, v, true
}

// ErrNotUKI is wrapped by Measure when the image has no .linux section.
var ErrNotUKI = errors.New("uki: image has no .linux section; is it a unified kernel image built on systemd-stub?")

// Measure computes the Authenticode digests, the section digests and the
// PCR 11 prediction of the UKI img.
func Measure(img []byte, opts Options) (*Report, error) {
	f, err := pecoff.Parse(img)
	if err != nil {
		return nil, err
	}
	if _, ok := f.Section(".linux"); !ok {
		return nil, ErrNotUKI
	}
	for _, name := range unsupported {
		if _, ok := f.Section(name); ok {
			return nil, fmt.Errorf("uki: image has a %s section: the PCR 11 value of multi-profile or device-specific UKIs depends on choices made at boot and is not predicted", name)
		}
	}
	r := &Report{PCR11: map[Bank][]byte{}}
	if r.AuthenticodeSHA256, err = f.AuthenticodeSHA256(); err != nil {
		return nil, err
	}
	if r.AuthenticodeSHA384, err = f.AuthenticodeSHA384(); err != nil {
		return nil, err
	}

	r.StubVersion, r.StubVersionSource = DefaultStubVersion, "default (no systemd-stub version in .sdmagic)"
	if s, ok := f.Section(".sdmagic"); ok {
		info, v, ok := stubVersion(f.FileData(s))
		r.StubInfo = info
		if ok {
			r.StubVersion, r.StubVersionSource = v, ".sdmagic"
		}
	}
	if opts.StubVersion != 0 {
		r.StubVersion, r.StubVersionSource = opts.StubVersion, "option"
	}

	measured := map[string]bool{}
	for _, n := range MeasuredSections(r.StubVersion) {
		measured[n] = true
	}
	var order []pecoff.Section
	zeroFill := uint64(0)
	for _, name := range known {
		s, ok := f.Section(name)
		if !ok {
			continue
		}
		if s.VirtualSize > s.SizeOfRawData {
			zeroFill += uint64(s.VirtualSize - s.SizeOfRawData)
		}
		if zeroFill > maxZeroFill {
			return nil, fmt.Errorf("uki: section %s has VirtualSize %#x but only %#x bytes of data; refusing to zero-fill more than %d MiB in all",
				name, s.VirtualSize, s.SizeOfRawData, maxZeroFill>>20)
		}
		d256, d384 := sha256.New(), sha512.New384()
		if err := f.WriteMemoryData(io.MultiWriter(d256, d384), s); err != nil {
			return nil, err
		}
		r.Sections = append(r.Sections, Section{Name: name, Size: s.VirtualSize, Measured: measured[name],
			SHA256: d256.Sum(nil), SHA384: d384.Sum(nil)})
	}
	for _, c := range canonical {
		if !measured[c.name] {
			continue
		}
		if s, ok := f.Section(c.name); ok && s.VirtualSize > 0 {
			order = append(order, s)
		}
	}
	for _, b := range Banks {
		pcr, err := extendSections(b, f, order)
		if err != nil {
			return nil, err
		}
		r.PCR11[b] = pcr
	}
	if r.Phases, err = phaseValues(r.PCR11); err != nil {
		return nil, err
	}
	return r, nil
}

// extendSections computes PCR 11 in bank b over the given sections.
func extendSections(b Bank, f *pecoff.File, secs []pecoff.Section) ([]byte, error) {
	h, err := b.New()
	if err != nil {
		return nil, err
	}
	pcr := make([]byte, h.Size())
	for _, s := range secs {
		h.Reset()
		h.Write(append([]byte(s.Name), 0))
		pcr = Extend(b, pcr, h.Sum(nil))
		h.Reset()
		if err := f.WriteMemoryData(h, s); err != nil {
			return nil, err
		}
		pcr = Extend(b, pcr, h.Sum(nil))
	}
	return pcr, nil
}

// Extend returns the TPM extend of pcr with digest in bank b:
// H(pcr || digest). An unknown bank yields nil.
func Extend(b Bank, pcr, digest []byte) []byte {
	h, err := b.New()
	if err != nil {
		return nil
	}
	h.Write(pcr)
	h.Write(digest)
	return h.Sum(nil)
}

// PCR11 computes the PCR 11 value in bank b that systemd-stub of the given
// version produces for a UKI whose sections hold the given contents, keyed
// by section name (".linux", ".cmdline", ...). It lets a UKI be measured
// before it is assembled; sections the stub version does not measure, and
// empty ones, are skipped as the stub skips them.
func PCR11(b Bank, stubVersion int, sections map[string][]byte) ([]byte, error) {
	h, err := b.New()
	if err != nil {
		return nil, err
	}
	for name := range sections {
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("uki: %q is not a section systemd-stub knows (want one of %v)", name, known)
		}
	}
	pcr := make([]byte, h.Size())
	for _, name := range MeasuredSections(stubVersion) {
		data := sections[name]
		if len(data) == 0 {
			continue
		}
		for _, m := range [][]byte{append([]byte(name), 0), data} {
			h.Reset()
			h.Write(m)
			pcr = Extend(b, pcr, h.Sum(nil))
		}
	}
	return pcr, nil
}

// AuthenticodeSHA256 returns the SHA-256 Authenticode digest of any PE
// image (a UKI or a plain EFI-stub kernel).
func AuthenticodeSHA256(img []byte) ([]byte, error) {
	f, err := pecoff.Parse(img)
	if err != nil {
		return nil, err
	}
	return f.AuthenticodeSHA256()
}

// AuthenticodeSHA384 returns the SHA-384 Authenticode digest of any PE
// image; TDX firmware extends this digest of a booted kernel into RTMR1.
func AuthenticodeSHA384(img []byte) ([]byte, error) {
	f, err := pecoff.Parse(img)
	if err != nil {
		return nil, err
	}
	return f.AuthenticodeSHA384()
}
