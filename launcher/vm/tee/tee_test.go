package tee

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/c8s-dev/c8s/launcher/config"
)

func hypervisor() config.Hypervisor {
	h := config.Default().Hypervisor
	h.Firmware = "/fw.fd"
	return h
}

func TestSNPErrors(t *testing.T) {
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(make([]byte, n)) }
	cases := []struct {
		name   string
		mutate func(*config.Hypervisor)
		want   string
	}{
		{"no-firmware", func(h *config.Hypervisor) { h.Firmware = "" }, "hypervisor.firmware"},
		{"no-cbitpos", func(h *config.Hypervisor) { h.SNP.CBitPos = 0 }, "cbitpos"},
		{"host-data-short", func(h *config.Hypervisor) { h.SNP.HostData = "abcd" }, "host_data is 2 bytes, want exactly 32"},
		{"host-data-not-hex", func(h *config.Hypervisor) { h.SNP.HostData = "xyz" }, "host_data is not hex"},
		{"id-block-alone", func(h *config.Hypervisor) { h.SNP.IDBlock = b64(96) }, "set together"},
		{"id-block-size", func(h *config.Hypervisor) { h.SNP.IDBlock, h.SNP.IDAuth = b64(95), b64(4096) }, "id_block decodes to 95 bytes"},
		{"id-auth-not-b64", func(h *config.Hypervisor) { h.SNP.IDBlock, h.SNP.IDAuth = b64(96), "!!" }, "id_auth is not base64"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := hypervisor()
			c.mutate(&h)
			_, err := SNP{}.QEMU(h)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
	h := hypervisor()
	h.SNP.IDBlock, h.SNP.IDAuth = b64(96), b64(4096)
	p, err := SNP{}.QEMU(h)
	if err != nil {
		t.Fatal(err)
	}
	obj := p.Args[len(p.Args)-1]
	if !strings.Contains(obj, "id-block="+b64(96)) || !strings.Contains(obj, "id-auth="+b64(4096)) || !strings.Contains(obj, "kernel-hashes=on") {
		t.Fatalf("sev-snp-guest object %q lacks id-block/id-auth/kernel-hashes", obj)
	}
	if !p.RequiresKVM {
		t.Fatal("snp must require KVM")
	}
}

func TestTDX(t *testing.T) {
	cases := []struct {
		qgs, want, err string
	}{
		{"", `"quote-generation-socket":{"type":"unix","path":"/var/run/tdx-qgs/qgs.socket"}`, ""},
		{"/run/qgs.sock", `"quote-generation-socket":{"type":"unix","path":"/run/qgs.sock"}`, ""},
		{"vsock:4050", `"quote-generation-socket":{"type":"vsock","cid":"2","port":"4050"}`, ""},
		{"vsock:x", "", "vsock:<port>"},
		{"qgs.sock", "", "absolute unix socket path"},
	}
	for _, c := range cases {
		h := hypervisor()
		h.TDX.QuoteGenerationSocket = c.qgs
		p, err := TDX{}.QEMU(h)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("qgs %q: err = %v, want %q", c.qgs, err, c.err)
			}
			continue
		}
		if err != nil || !strings.Contains(p.Args[1], c.want) {
			t.Errorf("qgs %q: object %v, err %v; want %s", c.qgs, p.Args, err, c.want)
		}
		if strings.Contains(p.Args[1], "mrconfigid") {
			t.Errorf("mrconfigid rendered although not configured: %s", p.Args[1])
		}
	}
	h := hypervisor()
	h.TDX.MRConfigID = strings.Repeat("00", 49)
	if _, err := (TDX{}).QEMU(h); err == nil || !strings.Contains(err.Error(), "want at most 48") {
		t.Fatalf("49-byte mrconfigid: err = %v", err)
	}
	h.TDX.MRConfigID = "01"
	p, err := TDX{}.QEMU(h)
	want := base64.StdEncoding.EncodeToString(append([]byte{1}, make([]byte, 47)...))
	if err != nil || !strings.Contains(p.Args[1], `"mrconfigid":"`+want+`"`) {
		t.Fatalf("mrconfigid 01: %v, %v; want padded to 48 bytes", p.Args, err)
	}
}
