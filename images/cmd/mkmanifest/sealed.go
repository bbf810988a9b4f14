package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/c8s-dev/c8s/manifest"
	"github.com/c8s-dev/c8s/measurements/igvm"
	"github.com/c8s-dev/c8s/measurements/ovmf"
	"github.com/c8s-dev/c8s/measurements/snp"
	"github.com/c8s-dev/c8s/measurements/uki"
)

// sealedFlags are the flags of the sealed image's artefacts and digests.
type sealedFlags struct {
	initrdPlain, rootfs, uki, igvm string
	verity                         manifest.Verity
	snpFirmware, snpNote           string
	snpParams                      string
	snpVCPUs, snpVCPUType          string
	snpFeatures                    uint64
}

func (s *sealedFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.initrdPlain, "initrd-plain", "", "unsealed initramfs file name in -dir")
	fs.StringVar(&s.rootfs, "rootfs", "", "verity-protected root file system name in -dir (needs the -verity-* flags)")
	fs.StringVar(&s.uki, "uki", "", "UKI file name in -dir; its PCR 11 and Authenticode digests are recorded")
	fs.StringVar(&s.igvm, "igvm", "", "SNP IGVM file name in -dir (needs -snp-firmware); its digest must equal the direct boot's")
	v := &s.verity
	fs.StringVar(&v.Device, "verity-device", "/dev/vda", "guest device of the rootfs")
	fs.StringVar(&v.FSType, "verity-fstype", "erofs", "file system of the rootfs")
	fs.StringVar(&v.RootHash, "verity-root-hash", "", "hex root hash of the rootfs hash tree")
	fs.StringVar(&v.Salt, "verity-salt", "", "hex salt of the rootfs hash tree")
	fs.Uint64Var(&v.DataBlocks, "verity-data-blocks", 0, "4 KiB data blocks of the rootfs")
	fs.Uint64Var(&v.HashStartBlock, "verity-hash-start", 0, "first 4 KiB block of the hash tree")
	fs.StringVar(&v.UUID, "verity-uuid", "", "verity superblock UUID")
	fs.StringVar(&v.FSUUID, "rootfs-uuid", "", "file system UUID")
	fs.StringVar(&s.snpFirmware, "snp-firmware", "", "AmdSevX64 OVMF `PATH`; with it, the SNP launch digests are recorded")
	fs.StringVar(&s.snpNote, "snp-firmware-note", "", "where -snp-firmware comes from, when not a production build")
	fs.StringVar(&s.snpParams, "snp-params", "", "the SNP TEE's kernel `PARAMS` (c8s-launcher kernel-params -tee snp), after -cmdline in its digests and the IGVM's")
	fs.StringVar(&s.snpVCPUs, "snp-vcpus", "1,2,4,8", "vCPU counts to record SNP digests for")
	fs.StringVar(&s.snpVCPUType, "snp-vcpu-type", "EPYC-v4", "vCPU type of the SNP VMSAs")
	fs.Uint64Var(&s.snpFeatures, "snp-guest-features", 0x1, "SEV_FEATURES of the SNP VMSAs")
}

// apply adds the sealed artefacts and digests to m; dir holds the files.
func (s *sealedFlags) apply(m *manifest.Manifest, dir, kernel, initrd string) error {
	for role, name := range map[string]string{
		manifest.RoleInitrdPlain: s.initrdPlain, manifest.RoleRootfs: s.rootfs,
		manifest.RoleUKI: s.uki, manifest.RoleIGVM: s.igvm,
	} {
		if name == "" {
			continue
		}
		a, err := manifest.Describe(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("describe %s: %w", role, err)
		}
		m.Artifacts[role] = a
	}
	if s.rootfs != "" {
		v := s.verity
		v.HashAlgorithm, v.DataBlockSize, v.HashBlockSize = "sha256", 4096, 4096
		m.Verity = &v
	}
	if s.uki != "" {
		img, err := os.ReadFile(filepath.Join(dir, s.uki))
		if err != nil {
			return err
		}
		r, err := uki.Measure(img, uki.Options{})
		if err != nil {
			return fmt.Errorf("-uki %s: %w", s.uki, err)
		}
		d := manifest.UKIDigests{PCR11: map[string]string{}, Authenticode: hex.EncodeToString(r.AuthenticodeSHA256)}
		for b, v := range r.PCR11 {
			d.PCR11[string(b)] = hex.EncodeToString(v)
		}
		if err := m.SetUKI(d); err != nil {
			return err
		}
	}
	if s.snpFirmware != "" {
		cmdline, err := teeCmdline(m.Cmdline, "snp", s.snpParams)
		if err != nil {
			return err
		}
		d, err := s.snpDigests(cmdline, filepath.Join(dir, kernel), filepath.Join(dir, initrd))
		if err != nil {
			return err
		}
		if s.igvm != "" {
			if err := checkIGVM(&d, filepath.Join(dir, s.igvm)); err != nil {
				return err
			}
		}
		if err := m.SetSNP(d); err != nil {
			return err
		}
	} else if s.igvm != "" {
		return fmt.Errorf("-igvm needs -snp-firmware, the firmware it was made from")
	}
	return nil
}

// snpDigests computes the SNP launch digests of a direct boot.
func (s *sealedFlags) snpDigests(cmdline, kernel, initrd string) (manifest.SNPDigests, error) {
	d := manifest.SNPDigests{Cmdline: cmdline, VCPUType: s.snpVCPUType, GuestFeatures: s.snpFeatures,
		FirmwareNote: s.snpNote, ByVCPUs: map[string]string{}}
	counts, err := parseCounts("-snp-vcpus", s.snpVCPUs)
	if err != nil {
		return d, err
	}
	raw, err := os.ReadFile(s.snpFirmware)
	if err != nil {
		return d, fmt.Errorf("-snp-firmware: %w", err)
	}
	fw, err := ovmf.Parse(raw)
	if err != nil {
		return d, fmt.Errorf("-snp-firmware %s: %w", s.snpFirmware, err)
	}
	hashes, sig, err := bootInputs(kernel, initrd, cmdline, s.snpVCPUType)
	if err != nil {
		return d, err
	}
	digests, err := snp.LaunchDigestsSNP(fw, snp.Params{VCPUSig: uint64(sig), GuestFeatures: s.snpFeatures, Kernel: &hashes}, counts)
	if err != nil {
		return d, fmt.Errorf("-snp-firmware %s: %w", s.snpFirmware, err)
	}
	sum := sha256.Sum256(raw)
	d.Firmware = manifest.FileDigest{Path: s.snpFirmware, SHA256: hex.EncodeToString(sum[:])}
	for n, c := range counts {
		d.ByVCPUs[strconv.Itoa(c)] = digests[n].String()
	}
	return d, nil
}

// checkIGVM measures the IGVM file as QEMU's igvm-cfg loader does and
// requires the digest of the direct boot with as many vCPUs: the same
// firmware, kernel, initrd and SNP command line (c8s.tee=snp included).
func checkIGVM(d *manifest.SNPDigests, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	f, err := igvm.Parse(raw)
	if err != nil {
		return fmt.Errorf("-igvm %s: %w", path, err)
	}
	m, err := igvm.SNPLaunchDigest(f, igvm.MeasureOptions{})
	if err != nil {
		return fmt.Errorf("-igvm %s: %w", path, err)
	}
	n := len(m.VMSAs)
	want, ok := d.ByVCPUs[strconv.Itoa(n)]
	if !ok {
		return fmt.Errorf("-igvm %s has %d vCPUs, a shape -snp-vcpus does not list", path, n)
	}
	if got := m.Digest.String(); got != want {
		return fmt.Errorf("-igvm %s measures %s, but the direct boot of the same firmware, kernel, initrd and command line with %d vCPUs measures %s", path, got, n, want)
	}
	d.IGVM, d.IGVMVCPUs = m.Digest.String(), n
	return nil
}
