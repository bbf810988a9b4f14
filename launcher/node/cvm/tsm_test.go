package cvm

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-configfs-tsm/configfs/configfsi"
	"github.com/google/go-configfs-tsm/configfs/faketsm"
	sevclient "github.com/google/go-sev-guest/client"
	sevtest "github.com/google/go-sev-guest/testing"
	"github.com/google/go-tdx-guest/testing/testdata"

	guestattest "github.com/c8s-dev/c8s/guest/attest"
	"github.com/c8s-dev/c8s/launcher/attest"
	"github.com/c8s-dev/c8s/launcher/attest/fakecvm"
	"github.com/c8s-dev/c8s/launcher/node/discovery"
)

// fakeConfigfs is go-configfs-tsm's fake configfs whose report provider
// answers as the kernel driver provider does: sev_guest with the report
// and certificate table answer gives for inblob, tdx_guest with quote and
// no auxblob. It counts the report entries left behind.
func fakeConfigfs(provider string, answer func(inblob []byte) (report, certs []byte, err error), quote []byte) (*faketsm.Client, *faketsm.ReportSubsystem) {
	sub := faketsm.ReportV7(0)
	stock := sub.ReadAttr
	sub.ReadAttr = func(e *faketsm.ReportEntry, attr string) ([]byte, error) {
		switch {
		case attr == "provider":
			return []byte(provider + "\n"), nil
		case provider == "tdx_guest" && attr == "auxblob":
			return nil, os.ErrNotExist
		case provider == "tdx_guest" && attr == "outblob":
			return quote, nil
		case provider == "sev_guest" && (attr == "outblob" || attr == "auxblob"):
			report, certs, err := answer(e.InAttrs["inblob"].Value)
			if attr == "auxblob" {
				return certs, err
			}
			return report, err
		}
		return stock(e, attr)
	}
	return &faketsm.Client{Subsystems: map[string]configfsi.Client{"report": sub}}, sub
}

func TestTSMSNPNode(t *testing.T) {
	signer := fakecvm.Signer(t, sevtest.DefaultAmdKeys())
	nonce := bytes.Repeat([]byte{0x42}, 32)
	device := fakecvm.Device(t, signer, nonce, fakecvm.Policy)
	client, sub := fakeConfigfs("sev_guest", func(inblob []byte) ([]byte, []byte, error) {
		var rd [64]byte
		copy(rd[:], inblob)
		if err := device.Open(""); err != nil {
			return nil, nil, err
		}
		defer device.Close()
		//lint:ignore SA1019 the fake device answers the device-level call; QuoteProvider would open the real one
		return sevclient.GetRawExtendedReport(device, rd)
	}, nil)
	a := snpAttester(t, signer, guestattest.NewConfigfsTSM(client), nonce, Policy{Digests: []attest.Hex{fakecvm.Digest}})
	res := a.Attest(context.Background(), discovery.SNP)
	if !res.Verified || res.Digest.String() != attest.Hex(fakecvm.Digest).String() || res.TCB != fakecvm.TCBString || res.Reference != ReferenceMatched {
		t.Fatalf("SNP node through configfs-tsm: %+v", res)
	}
	if len(sub.Entries) != 0 {
		t.Errorf("%d report entries left in configfs", len(sub.Entries))
	}
}

func TestTSMTDXNode(t *testing.T) {
	v := newVerifier(t, attest.Trust{Mode: attest.ModeTDX, Now: func() time.Time { return time.Date(2023, time.July, 1, 1, 0, 0, 0, time.UTC) }})
	_, rd := tdxNode(t)
	client, sub := fakeConfigfs("tdx_guest", nil, testdata.RawQuote)
	a := &Attester{Source: guestattest.NewConfigfsTSM(client), Verifier: v, Nonce: fixedNonce(rd), Now: func() time.Time { return verifiedAt }}
	res := a.Attest(context.Background(), discovery.TDX)
	if !res.Verified || res.Digest.String() != sampleMRTD || res.Reference != ReferenceNone {
		t.Fatalf("TDX node through configfs-tsm: %+v", res)
	}
	if len(sub.Entries) != 0 {
		t.Errorf("%d report entries left in configfs", len(sub.Entries))
	}
	// Another provider is refused.
	client, _ = fakeConfigfs("arm_cca_guest", nil, nil)
	if _, err := guestattest.NewConfigfsTSM(client).Evidence(context.Background(), [64]byte{}); err == nil || !strings.Contains(err.Error(), `unknown provider "arm_cca_guest"`) {
		t.Fatalf("unknown provider: %v", err)
	}
}
