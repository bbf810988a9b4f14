// Package attest is the simulated secure processor API of the `sim` TEE:
// the ttrpc service the guest calls on its attestation port, generated from
// simsp.proto by `make protos`.
package attest
