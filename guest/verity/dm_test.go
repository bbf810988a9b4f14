package verity

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	api "github.com/c8s-dev/c8s/guest/api/verity"
)

func TestTableLoadLayout(t *testing.T) {
	p := api.Params{Device: "/dev/vda", FSType: "erofs", RootHash: strings.Repeat("0f", 32), Salt: "aa", DataBlocks: 7, HashStartBlock: 8}
	buf := tableLoad("c8s-root", p)
	h := hdr(buf)
	if int(h.Data_size) != len(buf) || h.Data_start != unix.SizeofDmIoctl || h.Target_count != 1 {
		t.Fatalf("header: size %d (buffer %d), start %d, targets %d", h.Data_size, len(buf), h.Data_start, h.Target_count)
	}
	if h.Flags&unix.DM_READONLY_FLAG == 0 {
		t.Fatal("the verity table is not loaded read-only")
	}
	if h.Version[0] != unix.DM_VERSION_MAJOR {
		t.Fatalf("version %v", h.Version)
	}
	if name := string(bytes.TrimRight(h.Name[:], "\x00")); name != "c8s-root" {
		t.Fatalf("name %q", name)
	}
	spec := buf[unix.SizeofDmIoctl:]
	if got := binary.NativeEndian.Uint64(spec[8:]); got != 7*8 {
		t.Fatalf("target length %d sectors, want 56", got)
	}
	if tt := string(bytes.TrimRight(spec[24:40], "\x00")); tt != "verity" {
		t.Fatalf("target type %q", tt)
	}
	params := string(bytes.TrimRight(spec[unix.SizeofDmTargetSpec:], "\x00"))
	if params != p.Table() {
		t.Fatalf("params %q, want %q", params, p.Table())
	}
	if len(buf)%8 != 0 {
		t.Fatalf("request of %d bytes is not 8-byte aligned", len(buf))
	}
}

func TestOpenRejectsBadParams(t *testing.T) {
	if _, err := Open("x", api.Params{Device: "/dev/vda"}, "/dev", 0); err == nil || !strings.Contains(err.Error(), "file system type") {
		t.Fatalf("Open with incomplete params: %v", err)
	}
}

func TestParseCorrupted(t *testing.T) {
	for st, want := range map[string]bool{"V": false, "V - -": false, "C": true, "C - -": true} {
		got, err := ParseCorrupted(st)
		if err != nil || got != want {
			t.Errorf("ParseCorrupted(%q) = %v, %v; want %v", st, got, err, want)
		}
	}
	if _, err := ParseCorrupted(""); err == nil {
		t.Error("an empty status line read as a verity status")
	}
}

func TestUUIDFits(t *testing.T) {
	root := strings.Repeat("ab", 32)
	u := uuid("c8s-layer-"+strings.Repeat("cd", 32), root)
	if len(u) > 128 || !strings.HasPrefix(u, "C8S-VERITY-"+root[:32]) {
		t.Fatalf("uuid %q (%d bytes)", u, len(u))
	}
	if uuid("a", root) == uuid("b", root) {
		t.Fatal("two mappings of one tree share a UUID")
	}
}
