package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// Every layer disk is ext4 and so has an empty /lost+found the image never
// had: hidden, unless a layer's shows the image made it.
func TestArtefactLostFound(t *testing.T) {
	layer := func(mode os.FileMode, entry bool) string {
		d := t.TempDir()
		lf := filepath.Join(d, "lost+found")
		if err := os.Mkdir(lf, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(lf, mode); err != nil {
			t.Fatal(err)
		}
		if entry {
			if err := os.WriteFile(filepath.Join(lf, "#12"), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	bare := t.TempDir()
	for name, c := range map[string]struct {
		dirs []string
		want bool
	}{
		"converter's in every layer": {[]string{layer(0o700, false), layer(0o700, false)}, true},
		"none at all":                {[]string{bare}, false},
		"one layer's holds an entry": {[]string{layer(0o700, false), layer(0o700, true)}, false},
		"the image's own mode":       {[]string{layer(0o755, false), layer(0o700, false)}, false},
	} {
		if got := artefactLostFound(c.dirs); got != c.want {
			t.Errorf("%s: artefactLostFound = %v, want %v", name, got, c.want)
		}
	}
}
