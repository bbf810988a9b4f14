// Package sim is the host side of c8s's `sim` TEE, for development and CI
// machines without SEV-SNP or TDX: everything the host does for a sim pod
// VM lives here. Its guest side is guest/attest's sim provider, and its
// launch digest is defined by measurements/sim.
//
// # The QEMU backend
//
// Backend is the launcher/vm/tee backend registered as "sim": a plain q35
// VM without confidential-guest-support booting Firmware (QEMU's SeaBIOS)
// with the AttestPort virtio-serial port and the FreePageReporting balloon
// (a sim guest hands the memory it frees back to the host; no hardware
// TEE's guest can).
//
// # The launch measurement and GetReport
//
// LaunchFromArgv and Measure measure what the VM is launched with, exactly
// the files and command line handed to QEMU. A Host is the host side of
// one VM: NewHost measures before QEMU starts, Attach serves the simulated
// secure processor's GetReport (guest/api/attest/v1) on the VM's
// attestation port once it runs, signing reports with the node's identity.
// The shim's pod VMs and the VMs a node receives by migration use it
// alike.
//
// # The simulated secure processor
//
// SP is the simulated AMD secure processor: a per-node, TEST-ONLY identity
// made of an AMD-style certificate chain ARK → ASK → VCEK, a random chip id
// and a TCB, that signs real SEV-SNP ATTESTATION_REPORTs (ABI layout, ECDSA
// P-384 with SHA-384) for pod VMs that run without SEV-SNP hardware.
//
// The chain has the shape go-sev-guest's verify package checks for AMD's
// Key Distribution Service certificates (RSA-PSS-signed, KDS extensions for
// the TCB security patch levels, the hardware id and the product name), so
// the verifier runs the production code path on simulated evidence. It is
// marked as simulated wherever verify lets it be: the ARK's common name is
// ARKCommonName and every certificate's subject carries the description
// attribute SimMarker. A verifier configured for real hardware trusts only
// AMD's roots and refuses these chains (see launcher/attest).
//
// The identity is created once, on first use, in a node state directory
// (Open; the node's is launcher/config/statedir's SimSP) and reused
// afterwards; private keys never leave that directory's 0600 identity file.
package sim
