package sharedfs

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Mount points strictly below the directory, relative, shallowest first;
// escapes undone; the directory itself, its neighbours with a common
// prefix and the rest of the tree are not.
func TestSubmountsIn(t *testing.T) {
	mountinfo := strings.Join([]string{
		"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
		"30 22 0:40 / /srv/vol rw shared:2 - ext4 /dev/sdb rw",
		"31 30 0:41 / /srv/vol/cache/deep rw - tmpfs tmpfs rw",
		"32 30 0:42 / /srv/vol/tmpfs rw - tmpfs tmpfs rw",
		`33 30 0:43 / /srv/vol/with\040space rw - tmpfs tmpfs rw`,
		"34 22 0:44 / /srv/volume rw - tmpfs tmpfs rw",
		"35 32 0:45 / /srv/vol/tmpfs rw - tmpfs tmpfs rw", // stacked: once
		"36 22 0:46 / /proc rw - proc proc rw",
	}, "\n")
	got, err := submountsIn(strings.NewReader(mountinfo), "/srv/vol/")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"tmpfs", "with space", "cache/deep"}; !slices.Equal(got, want) {
		t.Fatalf("submounts %q, want %q", got, want)
	}
	var many []string
	for i := range MaxSubmounts + 10 {
		many = append(many, fmt.Sprintf("%d 30 0:1 / /srv/vol/m%03d rw - tmpfs tmpfs rw", 100+i, i))
	}
	many = append(many, "99 30 0:1 / /srv/vol/a/b rw - tmpfs tmpfs rw")
	got, err = submountsIn(strings.NewReader(strings.Join(many, "\n")), "/srv/vol")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != MaxSubmounts || got[0] != "m000" || slices.Contains(got, "a/b") {
		t.Fatalf("past the bound: %d submounts, first %q; want %d, the shallowest", len(got), got[0], MaxSubmounts)
	}
}

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{`/a\040b`: "/a b", `/t\011ab`: "/t\tab", `/b\134s`: `/b\s`, `/x\09`: `/x\09`, `/end\04`: `/end\04`, "/plain": "/plain"} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescape %q = %q, want %q", in, got, want)
		}
	}
}
