package packaging

import (
	"embed"
	"strings"
)

//go:embed containerd/c8s.toml c8s/config.toml kubernetes/c8s.yaml
var files embed.FS

// Paths are the install locations substituted into the templates.
type Paths struct {
	// SysconfDir holds c8s/config.toml, e.g. /etc.
	SysconfDir string
	// DataDir holds c8s/vmlinuz and c8s/initrd.img, e.g. /usr/local/share.
	DataDir string
}

// Render returns a packaged file (by its path under packaging/) with the
// install paths filled in, exactly as hack/install.sh writes it.
func Render(name string, p Paths) (string, error) {
	data, err := files.ReadFile(name)
	if err != nil {
		return "", err
	}
	r := strings.NewReplacer("@SYSCONFDIR@", p.SysconfDir, "@DATADIR@", p.DataDir)
	return r.Replace(string(data)), nil
}
