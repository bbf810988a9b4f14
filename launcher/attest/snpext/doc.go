// Package snpext extends go-sev-guest v0.15.0 where it cannot read genuine
// AMD evidence: it tells a report's AMD product line for every SEV-SNP
// processor (Siena and Bergamo, CPUID family 19h model A0h, are Genoa-line;
// go-sev-guest maps them to "Unknown"), and it reads the TCB of a VCEK or
// VLEK certificate in both layouts AMD's KDS issues (VCEK/KDS
// specification 57230): structure version 0 (Milan, Genoa: bootloader,
// TEE, SNP, four reserved and microcode security patch levels, a 64-byte
// HWID) and structure version 1 (Turin: an FMC security patch level,
// OID 1.3.6.1.4.1.3704.1.3.9, that go-sev-guest rejects as unknown, no
// spl_4, an 8-byte HWID).
//
// Its behaviour follows the upstream changes that add the same (google/
// go-sev-guest pull requests 167 and 192 for Siena, 193, 198 and 199 for
// Turin): on what go-sev-guest v0.15.0 reads, it reads the same values
// (tests compare them). Drop it, and use go-sev-guest's kds and abi
// packages directly, once a go-sev-guest release handles Turin
// certificates and Genoa-line model A0h.
//
// The product-line table and the TCB layouts themselves live in
// guest/api/kbs (SNPProductLine, SNPTCB), the one home c8s has for them.
package snpext
