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
