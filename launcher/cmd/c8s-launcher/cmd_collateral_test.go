package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/c8s-dev/c8s/launcher/attest"
)

// Genuine Intel collateral and a genuine quote of its platform
// (launcher/attest/testdata/tdx/README.md).
const (
	tdxTestdata = "../../attest/testdata/tdx/"
	genuineColl = tdxTestdata + "dcap-qvl/collateral-b0c06f"
	genuineTDX  = tdxTestdata + "dcap-qvl/tdx_quote"
)

// pcsServer serves the genuine collateral with Intel PCS's API.
func pcsServer(t *testing.T) *httptest.Server {
	read := func(n string) []byte {
		b, err := os.ReadFile(filepath.Join(genuineColl, n))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/tdx/certification/v4/tcb":
			w.Header().Set("TCB-Info-Issuer-Chain", url.QueryEscape(string(read(attest.TDXTCBInfoChainFile))))
			w.Write(read(attest.TDXTCBInfoFilePrefix + r.URL.Query().Get("fmspc") + ".json"))
		case "/tdx/certification/v4/qe/identity":
			w.Header().Set("SGX-Enclave-Identity-Issuer-Chain", url.QueryEscape(string(read(attest.TDXQEIdentityChainFile))))
			w.Write(read(attest.TDXQEIdentityFile))
		case "/sgx/certification/v4/pckcrl":
			w.Header().Set("SGX-PCK-CRL-Issuer-Chain", url.QueryEscape(string(read(attest.PCKCRLChainFile))))
			w.Write(read("pck_crl_" + r.URL.Query().Get("ca") + ".der"))
		case "/root.der":
			w.Write(read(attest.IntelRootCRLFile))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// collateral fetch writes the files verify-report --collateral reads, and
// the genuine quote verifies against them offline.
func TestCollateralFetchThenVerify(t *testing.T) {
	srv := pcsServer(t)
	dir := filepath.Join(t.TempDir(), "collateral")
	var out bytes.Buffer
	if err := tool.Run(context.Background(), "collateral", []string{"fetch", "--quote", genuineTDX, "--out", dir,
		"--pcs-url", srv.URL, "--root-crl-url", srv.URL + "/root.der"}, &out); err != nil {
		t.Fatal(err)
	}
	t.Logf("fetched:\n%s", out.String())
	for _, f := range []string{"tdx_tcb_info_b0c06f000000.json", attest.TDXQEIdentityFile, "pck_crl_platform.der", attest.IntelRootCRLFile} {
		want, _ := os.ReadFile(filepath.Join(genuineColl, f))
		got, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %v", f, err)
		}
	}

	q, err := attest.ParseTDXQuote(mustRead(t, genuineTDX))
	if err != nil {
		t.Fatal(err)
	}
	body := q.GetTdQuoteBody()
	policy := filepath.Join(t.TempDir(), "policy.json")
	doc := `{"mrtd": "` + hex.EncodeToString(body.GetMrTd()) + `", "nonce": "` + hex.EncodeToString(body.GetReportData()) + `"}`
	os.WriteFile(policy, []byte(doc), 0o644)
	out.Reset()
	err = tool.Run(context.Background(), "verify-report", []string{"--mode", "tdx", "--report", genuineTDX, "--policy", policy,
		"--collateral", dir, "--at", "2025-06-20T00:00:00Z", "--json"}, &out)
	var res struct {
		Verified bool `json:"verified"`
		TDX      struct {
			TCB *attest.TDXTCB `json:"tcb"`
		} `json:"tdx"`
	}
	if jerr := json.Unmarshal(out.Bytes(), &res); err != nil || jerr != nil || !res.Verified || res.TDX.TCB == nil || res.TDX.TCB.Status != "UpToDate" {
		t.Fatalf("verify-report --collateral: %v\n%s", err, out.String())
	}
	// A month after the collateral's next update it is stale.
	out.Reset()
	err = tool.Run(context.Background(), "verify-report", []string{"--mode", "tdx", "--report", genuineTDX, "--policy", policy,
		"--collateral", dir, "--at", "2025-08-20T00:00:00Z"}, &out)
	if err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("stale collateral: %v", err)
	}
}

// Without a network, collateral fetch and verify-report --fetch fail at
// once with a network error (before, --fetch took about 120 s and blamed
// the signature).
func TestFetchWithoutNetworkFailsFast(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	dead := srv.URL
	srv.Close()
	start := time.Now()
	err := tool.Run(context.Background(), "collateral", []string{"fetch", "--fmspc", "b0c06f000000", "--out", t.TempDir(), "--pcs-url", dead}, &bytes.Buffer{})
	if !strings.Contains(errString(err), "no network to Intel's PCS") || time.Since(start) > 10*time.Second {
		t.Errorf("collateral fetch: %v after %v", err, time.Since(start))
	}

	q, _ := attest.ParseTDXQuote(mustRead(t, genuineTDX))
	policy := filepath.Join(t.TempDir(), "policy.json")
	os.WriteFile(policy, []byte(`{"mrtd": "`+hex.EncodeToString(q.GetTdQuoteBody().GetMrTd())+`", "nonce": "`+hex.EncodeToString(q.GetTdQuoteBody().GetReportData())+`"}`), 0o644)
	var out bytes.Buffer
	start = time.Now()
	// Intel's real PCS: this machine has no route to it.
	err = tool.Run(context.Background(), "verify-report", []string{"--mode", "tdx", "--report", genuineTDX, "--policy", policy, "--fetch", "--json"}, &out)
	var res struct{ Kind string }
	json.Unmarshal(out.Bytes(), &res)
	if err == nil || res.Kind != "network" || time.Since(start) > 40*time.Second {
		t.Errorf("verify-report --fetch: kind %q, %v after %v\n%s", res.Kind, err, time.Since(start), out.String())
	}
	t.Logf("--fetch: %v (after %v)", err, time.Since(start).Round(time.Millisecond))
}

func mustRead(t *testing.T, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
