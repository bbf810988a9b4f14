package packaging

import (
	"embed"
	"strings"
)

//go:embed containerd/c8s.toml c8s/config.toml c8s/config-sim.toml c8s/config-snp.toml c8s/config-tdx.toml kubernetes/runtimeclasses.yaml kubernetes/runtimeclasses-gpu.yaml kubernetes/c8s.yaml kubernetes/node-agent.yaml
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

// Configs are the packaged c8s configs by path under packaging/: the
// default one and one per TEE handler of the containerd drop-in (each
// handler's ConfigPath). Each installs as SYSCONFDIR/<path>.
var Configs = []string{"c8s/config.toml", "c8s/config-sim.toml", "c8s/config-snp.toml", "c8s/config-tdx.toml"}
