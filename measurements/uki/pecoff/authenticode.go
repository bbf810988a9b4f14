package pecoff

import (
	"crypto/sha256"
	"crypto/sha512"
	"fmt"
	"hash"
	"sort"
)

// Authenticode returns the Authenticode digest of the image, computed with
// a fresh hash from newHash, following the PE/COFF specification's
// "Calculating the PE Image Hash" as EDK II's measured-boot and image
// verification code implement it:
//
//  1. the headers up to SizeOfHeaders, leaving out the optional header's
//     CheckSum field and the certificate-table data directory entry;
//  2. the raw data of every section with a non-zero SizeOfRawData, in
//     ascending order of PointerToRawData;
//  3. any data after the sections, up to the file size minus the size of
//     the certificate table (which signing tools append at the end).
//
// No padding is added: signing tools (sbsign, osslsigncode) first pad an
// unsigned image whose length is not a multiple of 8 with zeros, so for such
// a file the digest they sign is that of the padded image.
func (f *File) Authenticode(newHash func() hash.Hash) ([]byte, error) {
	h := newHash()
	hdrEnd := int(f.SizeOfHeaders)
	if f.checksumOff+4 > hdrEnd {
		return nil, fmt.Errorf("pecoff: SizeOfHeaders %#x ends inside the optional header", f.SizeOfHeaders)
	}
	h.Write(f.data[:f.checksumOff])
	if f.certDirOff >= 0 {
		if f.certDirOff+8 > hdrEnd {
			return nil, fmt.Errorf("pecoff: SizeOfHeaders %#x ends inside the data directory", f.SizeOfHeaders)
		}
		h.Write(f.data[f.checksumOff+4 : f.certDirOff])
		h.Write(f.data[f.certDirOff+8 : hdrEnd])
	} else {
		h.Write(f.data[f.checksumOff+4 : hdrEnd])
	}

	secs := make([]Section, 0, len(f.Sections))
	for _, s := range f.Sections {
		if s.SizeOfRawData > 0 {
			secs = append(secs, s)
		}
	}
	sort.SliceStable(secs, func(i, j int) bool { return secs[i].PointerToRawData < secs[j].PointerToRawData })
	hashed := uint64(hdrEnd)
	for _, s := range secs {
		// Parse checked that every section lies inside the file.
		h.Write(f.data[s.PointerToRawData : s.PointerToRawData+s.SizeOfRawData])
		hashed += uint64(s.SizeOfRawData)
	}

	size := uint64(len(f.data))
	if cert := uint64(f.certDir.Size); size > hashed+cert {
		// As in the specification, the trailing data starts where the
		// sections would end if they were laid out back to back after
		// the headers (the sum of the bytes hashed so far).
		h.Write(f.data[hashed : size-cert])
	}
	return h.Sum(nil), nil
}

// AuthenticodeSHA256 is Authenticode with SHA-256, the digest UEFI Secure
// Boot and the TPM's SHA-256 bank use.
func (f *File) AuthenticodeSHA256() ([]byte, error) { return f.Authenticode(sha256.New) }

// AuthenticodeSHA384 is Authenticode with SHA-384, the digest TDX firmware
// extends into the RTMRs.
func (f *File) AuthenticodeSHA384() ([]byte, error) { return f.Authenticode(sha512.New384) }
