package verity

import (
	"strings"
	"testing"
)

func sample() Params {
	return Params{
		Device: "/dev/vda", FSType: "erofs",
		RootHash:   strings.Repeat("ab", 32),
		Salt:       strings.Repeat("01", 32),
		DataBlocks: 100, HashStartBlock: 101,
	}
}

func TestKernelParamsRoundTrip(t *testing.T) {
	p := sample()
	cmdline := "console=ttyS0 quiet " + strings.Join(p.KernelParams(), " ") + " panic=-1"
	got, ok, err := FromCmdline(cmdline)
	if err != nil || !ok {
		t.Fatalf("FromCmdline(%q) = %v, %v", cmdline, ok, err)
	}
	if got != p {
		t.Fatalf("round trip: got %+v, want %+v", got, p)
	}
}

func TestFromCmdlineWithoutVerity(t *testing.T) {
	if _, ok, err := FromCmdline("console=ttyS0 quiet"); ok || err != nil {
		t.Fatalf("a command line without %s: ok=%v err=%v, want false, nil", ParamRoot, ok, err)
	}
}

func TestFromCmdlineRejects(t *testing.T) {
	good := sample().KernelParams()
	for _, tc := range []struct {
		name, drop, add, want string
	}{
		{"no blocks", ParamBlocks, "", ParamBlocks + "= is missing"},
		{"no hash start", ParamHashStart, "", ParamHashStart + "= is missing"},
		{"bad blocks", ParamBlocks, ParamBlocks + "=x", "not a block count"},
		{"short root hash", ParamRootHash, ParamRootHash + "=abcd", "not a hex sha256"},
		{"no root hash", ParamRootHash, "", "not a hex sha256"},
		{"overlap", ParamHashStart, ParamHashStart + "=50", "overlaps"},
		{"bad fs", ParamFSType, ParamFSType + "=vfat", "not erofs"},
		{"bad device", ParamRoot, ParamRoot + "=vda", "not a /dev path"},
		// A second value, which would otherwise win over the image's.
		{"root hash twice", "", ParamRootHash + "=" + strings.Repeat("e", 64), ParamRootHash + "= given more than once"},
		{"device twice", "", ParamRoot + "=/dev/vdb", ParamRoot + "= given more than once"},
		{"blocks twice", "", ParamBlocks + "=50", ParamBlocks + "= given more than once"},
		{"same value twice", "", sample().KernelParams()[5], ParamHashStart + "= given more than once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fields []string
			for _, f := range good {
				if !strings.HasPrefix(f, tc.drop+"=") {
					fields = append(fields, f)
				}
			}
			if tc.add != "" {
				fields = append(fields, tc.add)
			}
			_, ok, err := FromCmdline(strings.Join(fields, " "))
			if !ok || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ok=%v err=%v, want an error containing %q", ok, err, tc.want)
			}
		})
	}
}

func TestTable(t *testing.T) {
	p := sample()
	want := "1 /dev/vda /dev/vda 4096 4096 100 101 sha256 " + p.RootHash + " " + p.Salt
	if got := p.Table(); got != want {
		t.Fatalf("Table() = %q, want %q", got, want)
	}
	if p.Sectors() != 800 {
		t.Fatalf("Sectors() = %d, want 800", p.Sectors())
	}
	p.Salt = ""
	if got := p.Table(); !strings.HasSuffix(got, " -") {
		t.Fatalf("Table() without salt = %q, want the salt as -", got)
	}
}

func TestLayer(t *testing.T) {
	root := strings.Repeat("0f", 32)
	p := Layer("/dev/sdb", root, 1187)
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	// As veritysetup format --no-superblock --salt=- --data-blocks=1187
	// --hash-offset=1187*4096 writes it, data and tree on one device.
	want := "1 /dev/sdb /dev/sdb 4096 4096 1187 1187 sha256 " + root + " -"
	if got := p.Table(); got != want {
		t.Fatalf("table %q, want %q", got, want)
	}
}
