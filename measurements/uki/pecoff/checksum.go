package pecoff

import "encoding/binary"

// TimeDateStamp returns the COFF header's TimeDateStamp.
func (f *File) TimeDateStamp() uint32 { return binary.LittleEndian.Uint32(f.data[f.stampOff:]) }

// CheckSum returns the optional header's CheckSum field as the image
// carries it.
func (f *File) CheckSum() uint32 { return binary.LittleEndian.Uint32(f.data[f.checksumOff:]) }

// ComputeCheckSum returns the PE image checksum of the image: the
// one's-complement style sum of the file's 16-bit little-endian words,
// with the CheckSum field taken as zero, folded to 16 bits, plus the file
// length.
func (f *File) ComputeCheckSum() uint32 {
	b := f.data
	var s uint64
	for i := 0; i+1 < len(b); i += 2 {
		if i == f.checksumOff || i == f.checksumOff+2 {
			continue
		}
		s += uint64(binary.LittleEndian.Uint16(b[i:]))
		s = (s & 0xffff) + (s >> 16)
	}
	if len(b)%2 == 1 {
		s += uint64(b[len(b)-1])
		s = (s & 0xffff) + (s >> 16)
	}
	s = (s & 0xffff) + (s >> 16)
	return uint32(s) + uint32(len(b))
}

// SetTimeDateStamp writes t into the COFF header's TimeDateStamp and
// recomputes the optional header's CheckSum, in the bytes Parse was given:
// what makes an image objcopy stamped with the current time reproducible.
func (f *File) SetTimeDateStamp(t uint32) {
	binary.LittleEndian.PutUint32(f.data[f.stampOff:], t)
	binary.LittleEndian.PutUint32(f.data[f.checksumOff:], f.ComputeCheckSum())
}
