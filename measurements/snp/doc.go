// Package snp computes AMD SEV-SNP launch digests (SHA-384 PAGE_INFO chain)
// and SEV / SEV-ES launch digests (SHA-256) from the bytes a guest is
// launched with, as the reference tool virtee/sev-snp-measure does. It is
// pure: bytes and parameters in, digests out; no file I/O.
//
// # Launch digest primitive (stable API, also used for IGVM)
//
//   - NewLaunchDigest() / LaunchDigestFromSeed(Digest) start a chain from
//     zero or from a seed (for example an OVMF-only hash).
//   - (*LaunchDigest).UpdatePage(PageType, gpa, page) measures one 4 KiB
//     page: PageNormal and PageVMSA hash their contents, PageZero,
//     PageUnmeasured, PageSecrets and PageCPUID take none.
//   - Update(PageType, gpa, Digest) and UpdatePageInfo(PageInfo) are the
//     raw forms (precomputed contents hash; IMI flag and VMPL permissions).
//   - UpdateNormalPages(gpa, data), UpdateZeroPages(gpa, len),
//     UpdateUnmeasuredPages(gpa, len), UpdateSecretsPage(gpa),
//     UpdateCPUIDPage(gpa) and UpdateVMSAPage(vmsa) cover ranges.
//   - Digest() returns the current value; Clone() forks the chain.
//
// # VMSA pages
//
// BuildVMSA(VMSAParams{VMM, EIP, VCPUSig, Features}), BSPVMSA and APVMSA
// return the 4 KiB VMSA of a vCPU at reset for VMMQEMU, VMMEC2 or VMMGCE;
// SVSMVMSA the one QEMU builds for a Coconut-SVSM entry point. vCPU
// signatures come from CPUSig(family, model, stepping) or VCPUTypeSig
// ("EPYC-v4", "EPYC-Milan", ...).
//
// # Whole-guest digests
//
//   - LaunchDigestSNP / LaunchDigestsSNP(fw, Params, counts): OVMF pages at
//     4 GiB minus their size, the SEV metadata sections
//     (UpdateMetadataSections), then one VMSA per vCPU. The plural form
//     returns one digest per vCPU count, sharing the common prefix.
//   - OVMFHash(fw): the chain after the firmware pages only
//     (Params.OVMFHash reuses it as a seed).
//   - LaunchDigestSVSM / LaunchDigestsSVSM: SNP with a Coconut-SVSM image.
//   - LaunchDigestSEV, LaunchDigestSEVES / LaunchDigestsSEVES.
//
// Direct kernel boot is described by KernelHashes (NewKernelHashes, or
// fill the SHA-256 fields from streamed hashes), which also builds QEMU's
// SEV hashes table (Table, Page).
package snp
