package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-tdx-guest/pcs"

	"github.com/c8s-dev/c8s/launcher/attest"
)

func init() {
	register("collateral", "collateral fetch: write Intel's TDX collateral (TCB info, QE identity, PCK and root CRLs) and AMD's KDS CRLs to a directory for offline verification", runCollateral)
}

func runCollateral(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "fetch" {
		return errors.New("usage: c8s-launcher collateral fetch --out DIR [--quote TDX_QUOTE | --fmspc FMSPC --ca platform,processor] [--amd Milan,Genoa,Turin]")
	}
	fs := newFlags("collateral fetch")
	out := fs.String("out", "", "directory to write the collateral files to (created; existing files of the same names are replaced)")
	quotePath := fs.String("quote", "", "a TDX quote: fetch the collateral of its platform (FMSPC and PCK CA from its PCK certificate)")
	fmspc := fs.String("fmspc", "", "tdx: the platform's FMSPC (6 bytes hex), instead of --quote")
	cas := fs.String("ca", "platform,processor", "tdx: the PCK CAs whose CRLs to fetch, with --fmspc")
	amd := fs.String("amd", "", "snp: comma-separated AMD product lines (Milan, Genoa, Turin) whose KDS CRLs (VCEK and VLEK chains) to fetch")
	pcsURL := fs.String("pcs-url", attest.IntelPCSURL, "Intel PCS (API v4) base URL, or a caching service with its API")
	rootCRLURL := fs.String("root-crl-url", attest.IntelRootCRLURL, "the Intel SGX root CA's CRL")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("--out is required")
	}
	files := map[string][]byte{}
	if *quotePath != "" || *fmspc != "" {
		if *quotePath != "" && *fmspc != "" {
			return errors.New("give --quote or --fmspc, not both")
		}
		fm, caList := *fmspc, strings.Split(*cas, ",")
		if *quotePath != "" {
			var err error
			if fm, caList, err = platformOfQuote(*quotePath); err != nil {
				return err
			}
		}
		client := &attest.PCSClient{BaseURL: *pcsURL, RootCRLURL: *rootCRLURL}
		tdx, err := client.FetchTDX(ctx, fm, caList)
		if err != nil {
			return err
		}
		// What was fetched must be usable: Intel's signatures are checked
		// when a quote is verified, the structure now.
		if _, err := attest.NewTDXCollateral(*pcsURL, tdx); err != nil {
			return err
		}
		for k, v := range tdx {
			files[k] = v
		}
	}
	for _, line := range strings.Split(*amd, ",") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		crl, err := attest.FetchAMDCRL(ctx, line, nil)
		if err != nil {
			return err
		}
		files[attest.AMDCRLFile(line, false)] = crl
		if crl, err = attest.FetchAMDVLEKCRL(ctx, line, nil); err != nil {
			return err
		}
		files[attest.AMDCRLFile(line, true)] = crl
	}
	if len(files) == 0 {
		return errors.New("nothing to fetch: give --quote or --fmspc (TDX) and/or --amd (SNP)")
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(*out, name), files[name], 0o644); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\t%d bytes\n", filepath.Join(*out, name), len(files[name]))
	}
	return nil
}

// platformOfQuote reads the FMSPC and the PCK CA of a TDX quote's PCK
// certificate (not verified: collateral is verified when it is used).
func platformOfQuote(path string) (string, []string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	q, err := attest.ParseTDXQuote(b)
	if err != nil {
		return "", nil, err
	}
	chain := q.GetSignedData().GetCertificationData().GetQeReportCertificationData().GetPckCertificateChainData().GetPckCertChain()
	var certs [][]byte
	for {
		var blk *pem.Block
		if blk, chain = pem.Decode(chain); blk == nil {
			break
		}
		certs = append(certs, blk.Bytes)
	}
	if len(certs) < 2 {
		return "", nil, fmt.Errorf("%s: the quote carries no PCK certificate chain", path)
	}
	pck, err := x509.ParseCertificate(certs[0])
	if err != nil {
		return "", nil, err
	}
	ca, err := x509.ParseCertificate(certs[1])
	if err != nil {
		return "", nil, err
	}
	ext, err := pcs.PckCertificateExtensions(pck)
	if err != nil {
		return "", nil, fmt.Errorf("%s: PCK certificate: %w", path, err)
	}
	kind := "platform"
	if strings.Contains(ca.Subject.CommonName, "Processor") {
		kind = "processor"
	}
	return strings.ToLower(ext.FMSPC), []string{kind}, nil
}
