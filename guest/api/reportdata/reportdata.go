// Package reportdata is how c8s binds data into the REPORT_DATA of a TEE
// report (SNP) or quote (TDX), one domain per use, so that evidence made
// for one use can never pass for another's.
//
// The host may ask the agent for evidence (GetEvidence) to check its pod
// for itself, but the host is not trusted: if the agent signed whatever
// 64 bytes the host chose, the host could run a key broker's handshake
// itself, have the pod's TEE sign the broker's binding of the host's own
// key, and receive the pod's secrets. So the agent never signs the
// host's bytes: it signs Host(nonce), a SHA-512 over a domain label and
// the nonce. Matching another use's REPORT_DATA (a KBS handshake binds
// SHA-384 or SHA-512 of its runtime data, chosen by the guest's own
// client) would take a preimage of SHA-512.
//
// The attested mesh has a domain of its own (MeshKey): the pod binds the
// public key of its workload certificate and the mesh CA's nonce, so that
// evidence made for the host, or for a key broker, never gets a key a
// certificate, and a mesh binding never answers a host's challenge.
//
// Both sides use this package: the agent to make the binding, the shim,
// the migration path and `c8s-launcher verify-report --host-nonce` to
// check the host's, the mesh CA (launcher/broker) the mesh's.
package reportdata

import "crypto/sha512"

// Size is the size of REPORT_DATA in SNP reports and TDX quotes.
const Size = 64

// MaxNonce bounds the host's nonce.
const MaxNonce = 64

// HostDomain labels evidence the host asked for.
const HostDomain = "c8s host attestation"

// Host is the REPORT_DATA of evidence the host asked for with nonce:
// SHA-512(HostDomain || 0x00 || nonce).
func Host(nonce []byte) [Size]byte {
	h := sha512.New()
	h.Write([]byte(HostDomain))
	h.Write([]byte{0})
	h.Write(nonce)
	var rd [Size]byte
	h.Sum(rd[:0])
	return rd
}

// MeshKeyDomain labels evidence that binds a mesh workload key.
const MeshKeyDomain = "c8s mesh key"

// MeshKey is the REPORT_DATA of evidence that binds the public key of a
// pod's mesh certificate, spki (its DER SubjectPublicKeyInfo, which is
// self-delimiting), to the mesh CA's nonce:
// SHA-512(MeshKeyDomain || 0x00 || spki || nonce).
func MeshKey(spki, nonce []byte) [Size]byte {
	h := sha512.New()
	h.Write([]byte(MeshKeyDomain))
	h.Write([]byte{0})
	h.Write(spki)
	h.Write(nonce)
	var rd [Size]byte
	h.Sum(rd[:0])
	return rd
}
