package teeparam

import (
	"strings"
	"testing"
)

func TestFormatParses(t *testing.T) {
	for _, tee := range Names {
		got, ok, err := FromCmdline("console=ttyS0 quiet panic=-1 no_timer_check c8s.root=/dev/vda " + Format(tee) + " debug")
		if err != nil || !ok || got != tee {
			t.Errorf("FromCmdline(... %s ...) = %q, %v, %v; want %q", Format(tee), got, ok, err, tee)
		}
	}
	if Format(SNP) != "c8s.tee=snp" {
		t.Errorf("Format(snp) = %q", Format(SNP))
	}
}

func TestFromCmdline(t *testing.T) {
	for _, tc := range []struct {
		cmdline string
		tee     string
		ok      bool
		err     string
	}{
		{"", "", false, ""},
		{"console=ttyS0 quiet\n", "", false, ""},
		// Another parameter whose name merely starts like it.
		{"c8s.tee_x=snp c8s.teeth=sim", "", false, ""},
		{"c8s.tee=tdx\n", TDX, true, ""},
		{"c8s.tee=sgx", "", true, `unknown TEE "sgx"`},
		{"c8s.tee=", "", true, `unknown TEE ""`},
		{"c8s.tee", "", true, `unknown TEE ""`},
		{"c8s.tee=SNP", "", true, `unknown TEE "SNP"`},
		{`c8s.tee="snp"`, "", true, "unknown TEE"},
		// Never the first or the last of two: which one the host added
		// is not for the guest to guess.
		{"c8s.tee=snp c8s.tee=sim", "", true, "more than once"},
		{"c8s.tee=snp c8s.tee=snp", "", true, "more than once"},
	} {
		tee, ok, err := FromCmdline(tc.cmdline)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || tee != "" {
				t.Errorf("FromCmdline(%q) = %q, %v; want an error with %q", tc.cmdline, tee, err, tc.err)
			}
			continue
		}
		if err != nil || tee != tc.tee || ok != tc.ok {
			t.Errorf("FromCmdline(%q) = %q, %v, %v; want %q, %v", tc.cmdline, tee, ok, err, tc.tee, tc.ok)
		}
	}
}
