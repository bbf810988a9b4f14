package attest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Intel's Provisioning Certification Service and the SGX root CA's CRL.
const (
	IntelPCSURL        = "https://api.trustedservices.intel.com"
	IntelRootCRLURL    = "https://certificates.trustedservices.intel.com/IntelSGXRootCA.der"
	pcsDialTimeout     = 5 * time.Second
	pcsRequestTimeout  = 30 * time.Second
	maxCollateralBytes = 4 << 20
)

// PCSClient fetches TDX collateral from Intel's PCS (API v4). The zero
// value uses Intel's endpoints with short timeouts, so that a node without
// network learns it in seconds, not minutes.
type PCSClient struct {
	// BaseURL replaces IntelPCSURL (a caching service with PCS's API, or
	// a test server).
	BaseURL string
	// RootCRLURL replaces IntelRootCRLURL.
	RootCRLURL string
	// HTTP replaces the default client (5 s dial, 30 s per request).
	HTTP *http.Client
}

func (c *PCSClient) client() *http.Client {
	if c != nil && c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{
		Timeout: pcsRequestTimeout,
		Transport: &http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: pcsDialTimeout}).DialContext,
			TLSHandshakeTimeout: pcsDialTimeout,
		},
	}
}

func (c *PCSClient) base() string {
	if c != nil && c.BaseURL != "" {
		return strings.TrimSuffix(c.BaseURL, "/")
	}
	return IntelPCSURL
}

func (c *PCSClient) rootCRL() string {
	if c != nil && c.RootCRLURL != "" {
		return c.RootCRLURL
	}
	return IntelRootCRLURL
}

// FetchTDX fetches the collateral of a platform with FMSPC fmspc whose
// PCK certificates come from the PCK CAs cas ("platform", "processor"),
// and returns it as the files of a collateral directory. A network that
// does not answer is a KindNetwork error.
func (c *PCSClient) FetchTDX(ctx context.Context, fmspc string, cas []string) (map[string][]byte, error) {
	fmspc = strings.ToLower(fmspc)
	if len(fmspc) != 12 || strings.Trim(fmspc, "0123456789abcdef") != "" {
		return nil, configErr("FMSPC %q: want 6 bytes in hex", fmspc)
	}
	files := map[string][]byte{}
	get := func(u, chainHeader, body, chain string) error {
		b, h, err := c.get(ctx, u)
		if err != nil {
			return err
		}
		files[body] = b
		if chainHeader == "" {
			return nil
		}
		pemChain, err := url.QueryUnescape(h.Get(chainHeader))
		if err != nil || pemChain == "" {
			return failure(KindFormat, "PCS response "+u, fmt.Errorf("no %s header", chainHeader), "")
		}
		files[chain] = []byte(pemChain)
		return nil
	}
	if err := get(c.base()+"/tdx/certification/v4/tcb?fmspc="+fmspc, "TCB-Info-Issuer-Chain", TDXTCBInfoFilePrefix+fmspc+".json", TDXTCBInfoChainFile); err != nil {
		return nil, err
	}
	if err := get(c.base()+"/tdx/certification/v4/qe/identity", "SGX-Enclave-Identity-Issuer-Chain", TDXQEIdentityFile, TDXQEIdentityChainFile); err != nil {
		return nil, err
	}
	for _, ca := range cas {
		if ca != "platform" && ca != "processor" {
			return nil, configErr("PCK CA %q: want platform or processor", ca)
		}
		if err := get(c.base()+"/sgx/certification/v4/pckcrl?ca="+ca+"&encoding=der", "SGX-PCK-CRL-Issuer-Chain", PCKCRLFilePrefix+ca+".der", PCKCRLChainFile); err != nil {
			return nil, err
		}
	}
	if err := get(c.rootCRL(), "", IntelRootCRLFile, ""); err != nil {
		return nil, err
	}
	return files, nil
}

func (c *PCSClient) get(ctx context.Context, u string) ([]byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, nil, configErr("%s: %v", u, err)
	}
	resp, err := c.client().Do(req)
	if err != nil {
		return nil, nil, &Error{Kind: KindNetwork, Field: "collateral " + u, Err: err,
			Hint: "no network to Intel's PCS: fetch the collateral where a network exists (c8s-launcher collateral fetch) and verify with --collateral DIR"}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCollateralBytes+1))
	if err != nil {
		return nil, nil, &Error{Kind: KindNetwork, Field: "collateral " + u, Err: err}
	}
	if len(b) > maxCollateralBytes {
		return nil, nil, failure(KindFormat, "collateral "+u, errors.New("response larger than 4 MiB"), "")
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, &Error{Kind: KindNetwork, Field: "collateral " + u, Err: fmt.Errorf("HTTP %s", resp.Status),
			Hint: "the PCS has no such collateral (an unknown FMSPC?) or refused the request"}
	}
	return b, resp.Header, nil
}
