package tee

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/c8s-dev/c8s/guest/api/teeparam"
	"github.com/c8s-dev/c8s/launcher/config"
)

// SNP is AMD SEV-SNP: a sev-snp-guest object with kernel-hashes=on (so the
// direct-boot kernel, initrd and command line are measured) and host-data,
// over guest memory from a memory-backend-memfd.
type SNP struct{}

func init() { Register(SNP{}) }

const (
	snpObjectID = "snp0"
	snpMemoryID = "ram0"
	snpIDBlock  = 96
	snpIDAuth   = 4096
	snpHostData = 32
)

// Name implements Backend.
func (SNP) Name() string { return teeparam.SNP }

// KernelParams implements Backend: c8s.tee=snp.
func (SNP) KernelParams() []string { return []string{teeparam.Format(teeparam.SNP)} }

// QEMU implements Backend.
func (SNP) QEMU(h config.Hypervisor) (Pieces, error) {
	s := h.SNP
	if h.Firmware == "" && h.IGVM == "" {
		return Pieces{}, errors.New("tee snp needs hypervisor.firmware (an OVMF built with SEV-SNP support) or hypervisor.igvm")
	}
	if h.Firmware != "" && h.IGVM != "" {
		return Pieces{}, errors.New("hypervisor.igvm carries the firmware: unset hypervisor.firmware")
	}
	if s.CBitPos == 0 || s.ReducedPhysBits == 0 {
		return Pieces{}, errors.New("hypervisor.snp.cbitpos and hypervisor.snp.reduced_phys_bits must be set (typically 51 and 1)")
	}
	hostData, err := decodeHex("hypervisor.snp.host_data", s.HostData, snpHostData, true)
	if err != nil {
		return Pieces{}, err
	}
	if (s.IDBlock == "") != (s.IDAuth == "") {
		return Pieces{}, errors.New("hypervisor.snp.id_block and hypervisor.snp.id_auth must be set together")
	}
	if err := checkBase64("hypervisor.snp.id_block", s.IDBlock, snpIDBlock); err != nil {
		return Pieces{}, err
	}
	if err := checkBase64("hypervisor.snp.id_auth", s.IDAuth, snpIDAuth); err != nil {
		return Pieces{}, err
	}
	policy := s.Policy
	if h.IGVM != "" {
		return snpIGVM(h, hostData)
	}
	props := []string{
		"sev-snp-guest", "id=" + snpObjectID,
		fmt.Sprintf("cbitpos=%d", s.CBitPos),
		fmt.Sprintf("reduced-phys-bits=%d", s.ReducedPhysBits),
		"kernel-hashes=on",
	}
	if s.IDBlock != "" {
		props = append(props, "id-block="+s.IDBlock, "id-auth="+s.IDAuth)
	}
	props = append(props, fmt.Sprintf("policy=%d", policy))
	if hostData != nil {
		props = append(props, "host-data="+base64.StdEncoding.EncodeToString(hostData))
	}
	args := []string{
		"-object", fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,share=true,prealloc=false", snpMemoryID, h.DefaultMemoryMiB),
		"-object", strings.Join(props, ","),
	}
	return Pieces{
		MachineOptions: []string{"confidential-guest-support=" + snpObjectID, "memory-backend=" + snpMemoryID},
		Args:           args,
		Firmware:       h.Firmware,
		KernelParams:   SNP{}.KernelParams(),
		RequiresKVM:    true,
		QOMTypes:       []string{"sev-snp-guest", "memory-backend-memfd"},
		Ports:          []string{KBSPort},
	}, nil
}

// decodeHex decodes a hex setting of exactly n bytes (or at most n when
// !exact). An empty value gives nil.
func decodeHex(key, value string, n int, exact bool) ([]byte, error) {
	if value == "" {
		return nil, nil
	}
	b, err := hex.DecodeString(value)
	if err != nil {
		return nil, fmt.Errorf("%s is not hex: %v", key, err)
	}
	if (exact && len(b) != n) || len(b) > n {
		what := "exactly"
		if !exact {
			what = "at most"
		}
		return nil, fmt.Errorf("%s is %d bytes, want %s %d (%d hex digits)", key, len(b), what, n, 2*n)
	}
	return b, nil
}

func checkBase64(key, value string, n int) error {
	if value == "" {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(value)
	if err != nil {
		return fmt.Errorf("%s is not base64: %v", key, err)
	}
	if len(b) != n {
		return fmt.Errorf("%s decodes to %d bytes, want %d", key, len(b), n)
	}
	return nil
}

// igvmID is the igvm-cfg object's ID.
const igvmID = "igvm0"

// snpIGVM renders an SEV-SNP launch from an IGVM file through igvm-cfg
// (QEMU ≥ 10.1): the file replaces -bios and carries the SEV metadata pages
// and the kernel hashes table, so the sev-snp-guest object has
// kernel-hashes=off (QEMU must not add a second table).
func snpIGVM(h config.Hypervisor, hostData []byte) (Pieces, error) {
	s := h.SNP
	if s.IDBlock != "" {
		return Pieces{}, errors.New("hypervisor.snp.id_block with hypervisor.igvm: put the ID block into the IGVM file (c8s-measure igvm) instead")
	}
	props := []string{
		"sev-snp-guest", "id=" + snpObjectID,
		fmt.Sprintf("cbitpos=%d", s.CBitPos),
		fmt.Sprintf("reduced-phys-bits=%d", s.ReducedPhysBits),
		fmt.Sprintf("policy=%d", s.Policy),
		"kernel-hashes=off",
	}
	if hostData != nil {
		props = append(props, "host-data="+base64.StdEncoding.EncodeToString(hostData))
	}
	return Pieces{
		MachineOptions: []string{"confidential-guest-support=" + snpObjectID, "memory-backend=" + snpMemoryID, "igvm-cfg=" + igvmID},
		Args: []string{
			"-object", fmt.Sprintf("memory-backend-memfd,id=%s,size=%dM,share=true,prealloc=false", snpMemoryID, h.DefaultMemoryMiB),
			"-object", "igvm-cfg,id=" + igvmID + ",file=" + h.IGVM,
			"-object", strings.Join(props, ","),
		},
		// The IGVM's kernel hashes cover the command line QEMU passes:
		// the same parameters.
		KernelParams: SNP{}.KernelParams(),
		RequiresKVM:  true,
		QOMTypes:     []string{"sev-snp-guest", "memory-backend-memfd", "igvm-cfg"},
	}, nil
}
