package attest

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"github.com/google/go-sev-guest/kds"
	"github.com/google/go-sev-guest/verify/trust"

	"github.com/c8s-dev/c8s/launcher/attest/snpext"
)

// DefaultFetchTimeout bounds one fetch from AMD's KDS when Trust sets
// none.
const DefaultFetchTimeout = 10 * time.Second

// amdKDS is AMD's Key Distribution Service.
const amdKDS = "https://kdsintf.amd.com"

// kdsGetter fetches from AMD's KDS once, without go-sev-guest's default
// retries (which wait up to two minutes on a host without a network): a
// failure is reported at once, as a network error.
type kdsGetter struct {
	client *http.Client
}

func newKDSGetter(timeout time.Duration) *kdsGetter {
	if timeout <= 0 {
		timeout = DefaultFetchTimeout
	}
	dial := &net.Dialer{Timeout: timeout}
	return &kdsGetter{client: &http.Client{
		Timeout: timeout,
		Transport: &http.Transport{
			Proxy:               proxyFromEnvironment,
			DialContext:         dial.DialContext,
			TLSHandshakeTimeout: timeout,
		},
	}}
}

// proxyFromEnvironment is http.ProxyFromEnvironment, read at each request
// rather than once per process.
func proxyFromEnvironment(r *http.Request) (*url.URL, error) {
	return httpproxy.FromEnvironment().ProxyFunc()(r.URL)
}

// Get implements trust.HTTPSGetter.
func (g *kdsGetter) Get(addr string) ([]byte, error) { return g.GetContext(context.Background(), addr) }

// GetContext implements trust.ContextHTTPSGetter.
func (g *kdsGetter) GetContext(ctx context.Context, addr string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, addr, nil)
	if err != nil {
		return nil, err
	}
	resp, err := g.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", addr, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, 1<<20))
}

// fetch gets url with g (nil: a kdsGetter with the default timeout) and
// turns any failure into a KindNetwork error naming what was fetched.
func fetch(ctx context.Context, g trust.HTTPSGetter, what, addr string) ([]byte, error) {
	if g == nil {
		g = newKDSGetter(0)
	}
	b, err := trust.GetWith(ctx, g, addr)
	if err == nil {
		return b, nil
	}
	hint := "the node has no network to AMD's KDS: fetch the collateral where there is one (c8s-launcher collateral fetch) and verify offline with it"
	var ue interface{ Timeout() bool }
	if errors.As(err, &ue) && ue.Timeout() {
		hint = "AMD's KDS did not answer in time; " + hint
	}
	return nil, &Error{Kind: KindNetwork, Field: what, Err: err, Hint: hint}
}

// vcekURL is the KDS address of the VCEK of a chip (its CHIP_ID) at a
// TCB: Milan and Genoa take the 64-byte HWID and four SPLs (as
// go-sev-guest builds it); Turin takes the 8-byte HWID and an FMC SPL as
// well (VCEK/KDS specification 57230).
func vcekURL(line string, chipID []byte, tcb snpext.TCB) (string, error) {
	if len(chipID) != 64 || allZero(chipID) {
		return "", errors.New("the report's CHIP_ID is masked (MASK_CHIP_ID): the VCEK cannot be looked up by chip, send it with the report")
	}
	if !snpext.HasFMC(line) {
		return kds.VCEKCertURL(line, chipID, kds.TCBVersion(tcb.Raw())), nil
	}
	hwid := chipID[:snpext.HWIDSize(snpext.StructVersion(line))]
	return fmt.Sprintf("%s/vcek/v1/%s/%s?fmcSPL=%d&blSPL=%d&teeSPL=%d&snpSPL=%d&ucodeSPL=%d", amdKDS, line,
		hex.EncodeToString(hwid), tcb.FMC, tcb.Bootloader, tcb.TEE, tcb.SNP, tcb.Microcode), nil
}

// amdProductLine normalizes a product name for the KDS ("milan" is Milan;
// Siena and Bergamo are Genoa-line).
func amdProductLine(product string) (string, error) {
	switch p := strings.ToLower(product); p {
	case "milan", "genoa", "turin":
		return strings.ToUpper(p[:1]) + p[1:], nil
	case "siena", "bergamo":
		return snpext.Genoa, nil
	}
	return "", fmt.Errorf("AMD product %q: want Milan, Genoa (Siena, Bergamo) or Turin", product)
}

// FetchAMDCRL fetches AMD's certificate revocation list for product
// ("Milan", "Genoa", "Turin"; "Siena" and "Bergamo" are Genoa) from the
// KDS endpoint of the VCEK chain (vcek/v1/<product>/crl, which revokes
// ASKs) and checks that AMD's ARK for the product signed it. It returns
// the CRL in DER, as a Trust.AMDCRLs entry (or an AMDCRLFile) takes it. A
// nil getter fetches once with DefaultFetchTimeout; a failure to fetch is
// a KindNetwork *Error.
func FetchAMDCRL(ctx context.Context, product string, g trust.HTTPSGetter) ([]byte, error) {
	return fetchAMDCRL(ctx, product, snpext.VCEK, g)
}

// FetchAMDVLEKCRL is FetchAMDCRL for the VLEK chain's endpoint
// (vlek/v1/<product>/crl, which revokes ASVKs).
func FetchAMDVLEKCRL(ctx context.Context, product string, g trust.HTTPSGetter) ([]byte, error) {
	return fetchAMDCRL(ctx, product, snpext.VLEK, g)
}

func fetchAMDCRL(ctx context.Context, product string, key snpext.Key, g trust.HTTPSGetter) ([]byte, error) {
	line, err := amdProductLine(product)
	if err != nil {
		return nil, configErr("%v", err)
	}
	addr := fmt.Sprintf("%s/%s/v1/%s/crl", amdKDS, strings.ToLower(string(key)), line)
	b, err := fetch(ctx, g, "AMD "+line+" CRL", addr)
	if err != nil {
		return nil, err
	}
	roots, err := amdRoots()
	if err != nil {
		return nil, failure(KindConfig, "trust", err, "")
	}
	if _, err := parseAMDCRL(b, roots); err != nil {
		return nil, err
	}
	return b, nil
}
