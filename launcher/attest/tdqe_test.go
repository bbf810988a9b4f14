package attest

import (
	"errors"
	"testing"

	"github.com/google/go-tdx-guest/testing/testdata"
)

// TestTDXQuoteOfAnotherEnclaveRefused: a quote whose PCK chain is genuine
// but whose quoting enclave is not Intel's TD quoting enclave (one the
// host ran with the provisioning key's attribute, which the PCE certifies
// as well) is refused, collateral or not. The genuine sample is signed by
// Intel's TD QE; pinning another identity stands in for a quote of
// another enclave, which no test can sign under Intel's root.
func TestTDXQuoteOfAnotherEnclaveRefused(t *testing.T) {
	if _, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, samplePolicy(t)); err != nil {
		t.Fatalf("the genuine quote: %v", err)
	}
	signer, prod := tdQEMRSigner, tdQEProdID
	t.Cleanup(func() { tdQEMRSigner, tdQEProdID = signer, prod })

	tdQEMRSigner = append([]byte(nil), signer...)
	tdQEMRSigner[0] ^= 1
	_, err := tdxVerifier(t).VerifyTDX(testdata.RawQuote, samplePolicy(t))
	if ae := (*Error)(nil); !errors.As(err, &ae) || ae.Field != "QE MRSIGNER" {
		t.Fatalf("another enclave's signer: %v, want a QE MRSIGNER mismatch", err)
	}
	tdQEMRSigner, tdQEProdID = signer, 1 // the SGX quoting enclave's
	_, err = tdxVerifier(t).VerifyTDX(testdata.RawQuote, samplePolicy(t))
	if ae := (*Error)(nil); !errors.As(err, &ae) || ae.Field != "QE ISVPRODID" {
		t.Fatalf("the SGX quoting enclave: %v, want a QE ISVPRODID mismatch", err)
	}
}

// TestCheckTDQE: Intel's TD quoting enclave as its identity names it;
// a debug enclave of Intel's is refused too.
func TestCheckTDQE(t *testing.T) {
	good := qeReport{MRSigner: tdQEMRSigner, ISVProdID: 2, Attributes: []byte{0x11, 0, 0, 0, 0, 0, 0, 0, 0xe7, 0, 0, 0, 0, 0, 0, 0}}
	if err := checkTDQE(good); err != nil {
		t.Fatalf("Intel's TD QE (XFRM bits are not judged): %v", err)
	}
	debug := good
	debug.Attributes = append([]byte{0x13}, good.Attributes[1:]...) // DEBUG, bit 1
	if err := checkTDQE(debug); err == nil {
		t.Fatal("a debug quoting enclave was accepted")
	}
	misc := good
	misc.MiscSelect = 1
	if err := checkTDQE(misc); err == nil {
		t.Fatal("a quoting enclave with MISCSELECT bits was accepted")
	}
}
