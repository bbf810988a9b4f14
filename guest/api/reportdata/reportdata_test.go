package reportdata

import (
	"encoding/hex"
	"testing"
)

// The binding is fixed: verifiers outside this repository (an owner's
// relying party) recompute it, so it must not change by accident. The
// vector is `printf 'c8s host attestation\0nonce' | sha512sum`.
func TestHostVector(t *testing.T) {
	const want = "9d33e0727fb1f9ca0810a7398451daeba072345ae4887d43279416936d0a7ae18942b3e00addb62667676d217f4b612f41041eddc26bc782274f23f4e62c18c9"
	got := Host([]byte("nonce"))
	if hex.EncodeToString(got[:]) != want {
		t.Fatalf("Host(\"nonce\") = %x, want %s", got, want)
	}
	// The host's chosen bytes never come back as REPORT_DATA.
	var chosen [Size]byte
	copy(chosen[:], "bytes the host chose")
	if Host(chosen[:]) == chosen {
		t.Fatal("Host returned the host's bytes")
	}
	if Host(nil) == Host([]byte{0}) {
		t.Fatal("different nonces gave the same binding")
	}
}

// The mesh binding is fixed for the same reason; the vector is
// `printf 'c8s mesh key\0SPKInonce' | sha512sum`. It is never the host's
// binding of the same bytes.
func TestMeshKeyVector(t *testing.T) {
	const want = "0222397009a4eecfb6d43e1d326fcaefd093c8a1e164289d004075e20bd2b94bea5992866d2aa8d3c299932cb243767668c909813adcb3c7ef7843ad8d5b14b0"
	got := MeshKey([]byte("SPKI"), []byte("nonce"))
	if hex.EncodeToString(got[:]) != want {
		t.Fatalf("MeshKey = %x, want %s", got, want)
	}
	if got == Host([]byte("SPKInonce")) {
		t.Fatal("the mesh binding equals the host's")
	}
	if MeshKey([]byte("SPKI"), []byte("nonce")) == MeshKey([]byte("SPKI"), []byte("nonc3")) {
		t.Fatal("different nonces gave the same binding")
	}
}
