package install

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/c8s-dev/c8s/launcher/admin/ctrdconfig"
	"github.com/c8s-dev/c8s/packaging"
)

// Markers around the handler block that install appends to a containerd
// config that imports no drop-in directory.
const (
	blockBegin = "# BEGIN c8s runtime handlers (added by c8s-launcher install; c8s-launcher uninstall removes this block)\n"
	blockEnd   = "# END c8s runtime handlers\n"
)

// dropInHeader starts every drop-in install writes.
const dropInHeader = "# c8s runtime handlers for containerd, written by c8s-launcher install\n# (c8s-launcher uninstall removes this file).\n"

// DropInName is the file name of the drop-in in an imported directory.
const DropInName = "c8s.toml"

// handlerTables returns the runtime handler tables of the packaged drop-in
// (packaging/containerd/c8s.toml), moved under the CRI plugin of a config
// of the given version.
func handlerTables(version int, paths packaging.Paths) (string, error) {
	tmpl, err := packaging.Render("containerd/c8s.toml", paths)
	if err != nil {
		return "", err
	}
	i := strings.Index(tmpl, "\n[plugins.")
	if i < 0 {
		return "", fmt.Errorf("packaged containerd drop-in has no [plugins...] table")
	}
	tables := tmpl[i+1:]
	plugin, err := ctrdconfig.CRIPlugin(version)
	if err != nil {
		return "", err
	}
	if version != 2 && version != 3 {
		return "", fmt.Errorf("containerd config version %d: c8s supports versions 2 and 3; migrate it with `containerd config migrate`", version)
	}
	tables = strings.ReplaceAll(tables, "'io.containerd.cri.v1.runtime'", `"`+plugin+`"`)
	// Check the result registers the handlers where containerd looks.
	f, err := ctrdconfig.Parse("generated", []byte(fmt.Sprintf("version = %d\n%s", version, tables)))
	if err != nil {
		return "", err
	}
	if len(f.Handlers) == 0 {
		return "", fmt.Errorf("generated handler tables for version %d register no handler", version)
	}
	return tables, nil
}

// handlerNames returns the handler names the packaged drop-in registers.
func handlerNames(paths packaging.Paths) ([]string, error) {
	tables, err := handlerTables(3, paths)
	if err != nil {
		return nil, err
	}
	f, err := ctrdconfig.Parse("generated", []byte("version = 3\n"+tables))
	if err != nil {
		return nil, err
	}
	var names []string
	for n := range f.Handlers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

func dropInContent(version int, paths packaging.Paths) (string, error) {
	tables, err := handlerTables(version, paths)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%sversion = %d\n\n%s", dropInHeader, version, tables), nil
}

func blockContent(version int, paths packaging.Paths) (string, error) {
	tables, err := handlerTables(version, paths)
	if err != nil {
		return "", err
	}
	return blockBegin + tables + blockEnd, nil
}

// splitBlock returns data without the c8s block (and the blank line install
// put before it), and the block itself ("" when there is none).
func splitBlock(data []byte) (rest []byte, block string, err error) {
	s := string(data)
	i := strings.Index(s, blockBegin)
	if i < 0 {
		return data, "", nil
	}
	j := strings.Index(s[i:], blockEnd)
	if j < 0 {
		return nil, "", fmt.Errorf("the c8s block has a BEGIN marker but no END marker: fix or remove it by hand")
	}
	end := i + j + len(blockEnd)
	block = s[i:end]
	start := i
	if strings.HasSuffix(s[:start], "\n\n") {
		start-- // the separator line appendBlock added
	}
	return []byte(s[:start] + s[end:]), block, nil
}

// appendBlock appends block to data, separated by a blank line.
func appendBlock(data []byte, block string) []byte {
	var b bytes.Buffer
	b.Write(data)
	if len(data) > 0 && !bytes.HasSuffix(data, []byte("\n")) {
		b.WriteByte('\n')
	}
	if len(data) > 0 {
		b.WriteByte('\n')
	}
	b.WriteString(block)
	return b.Bytes()
}

// importingDropIn returns the host path of a drop-in named DropInName that
// one of the main config's imports matches, or "".
func importingDropIn(mainPath string, imports []string) string {
	for _, imp := range imports {
		pattern := ctrdconfig.ImportPattern(mainPath, imp)
		candidate := filepath.Join(filepath.Dir(pattern), DropInName)
		if ok, err := filepath.Match(pattern, candidate); err == nil && ok {
			return candidate
		}
	}
	return ""
}

// containerdRecord says how install registered the handlers.
type containerdRecord struct {
	// Mode is "drop-in" (a file in an imported directory), "edit" (a block
	// appended to the main config) or "created" (install created the main
	// config, importing a drop-in directory, and the drop-in).
	Mode   string `json:"mode"`
	Config string `json:"config"`
	DropIn string `json:"drop_in,omitempty"`
	// Original is the first backup of the main config (mode edit).
	Original string `json:"original,omitempty"`
	// Backups are all backups install made, oldest first.
	Backups []string `json:"backups,omitempty"`
	// Created is the content install gave the main config (mode created).
	Created string `json:"created,omitempty"`
}

// installContainerd registers the handlers in containerd's config.
func (in *installer) installContainerd(rec *record) error {
	o := in.o
	mainPath := o.ContainerdConfig
	cfg, err := ctrdconfig.Load(o.Root, mainPath)
	if err != nil {
		return fmt.Errorf("%w (fix containerd's config first; containerd refuses it too)", err)
	}
	names, err := handlerNames(in.paths)
	if err != nil {
		return err
	}
	prev := rec.Containerd
	// Handlers registered by hand stay as they are.
	for _, n := range names {
		h, ok := cfg.Handlers[n]
		if !ok || (prev != nil && (h.File == prev.DropIn || h.File == prev.Config)) {
			continue
		}
		if h.File == mainPath {
			data, _ := os.ReadFile(in.path(mainPath))
			if _, block, _ := splitBlock(data); block != "" {
				continue
			}
		}
		in.report("kept", h.File, fmt.Sprintf("handler %s is already registered there (not by c8s-launcher); left as it is", n))
		return nil
	}

	if !cfg.Exists {
		version := o.ContainerdConfigVersion
		dir := filepath.Join(filepath.Dir(mainPath), "conf.d")
		created := fmt.Sprintf("# containerd config created by c8s-launcher install: containerd's defaults\n# plus the drop-ins in %s.\nversion = %d\nimports = [%q]\n", dir, version, dir+"/*.toml")
		dropIn, err := dropInContent(version, in.paths)
		if err != nil {
			return err
		}
		if err := in.writeFile(mainPath, []byte(created), 0o644, "created", ""); err != nil {
			return err
		}
		if _, err := in.syncFile(filepath.Join(dir, DropInName), []byte(dropIn), 0o644, "registers "+strings.Join(names, ", ")); err != nil {
			return err
		}
		rec.Containerd = &containerdRecord{Mode: "created", Config: mainPath, DropIn: filepath.Join(dir, DropInName), Created: created}
		in.containerdChanged = true
		return nil
	}

	main := cfg.Files[0]
	data, err := os.ReadFile(in.path(mainPath))
	if err != nil {
		return err
	}
	_, oldBlock, err := splitBlock(data)
	if err != nil {
		return fmt.Errorf("%s: %w", mainPath, err)
	}
	if dropIn := importingDropIn(mainPath, main.Imports); dropIn != "" && oldBlock == "" {
		content, err := dropInContent(main.Version, in.paths)
		if err != nil {
			return fmt.Errorf("%s: %w", mainPath, err)
		}
		changed, err := in.syncFile(dropIn, []byte(content), 0o644, "registers "+strings.Join(names, ", "))
		if err != nil {
			return err
		}
		in.containerdChanged = in.containerdChanged || changed
		if prev == nil || prev.DropIn != dropIn {
			rec.Containerd = &containerdRecord{Mode: "drop-in", Config: mainPath, DropIn: dropIn}
		}
		return nil
	}

	block, err := blockContent(main.Version, in.paths)
	if err != nil {
		return fmt.Errorf("%s: %w", mainPath, err)
	}
	if oldBlock == block {
		in.report("unchanged", mainPath, "c8s handlers already in it")
		return nil
	}
	rest, _, _ := splitBlock(data)
	edited := appendBlock(rest, block)
	if _, err := ctrdconfig.Parse(mainPath, edited); err != nil {
		return fmt.Errorf("adding the c8s handlers to %s would make it invalid (%v): add them by hand or give it an imports entry for a drop-in directory", mainPath, err)
	}
	backup := fmt.Sprintf("%s.c8s-backup-%s", mainPath, o.Now().UTC().Format("20060102T150405Z"))
	for i := 1; ; i++ { // never overwrite an earlier backup (two edits in one second)
		if _, err := os.Lstat(in.path(backup)); errors.Is(err, os.ErrNotExist) {
			break
		}
		backup = fmt.Sprintf("%s.c8s-backup-%s-%d", mainPath, o.Now().UTC().Format("20060102T150405Z"), i)
	}
	if err := in.writeFile(backup, data, 0o600, "backed up", "copy of "+mainPath+" before the edit"); err != nil {
		return err
	}
	if err := in.writeFile(mainPath, edited, 0o644, "edited", "appended the c8s handler block: no imported drop-in directory"); err != nil {
		return err
	}
	if prev == nil || prev.Mode != "edit" {
		rec.Containerd = &containerdRecord{Mode: "edit", Config: mainPath, Original: backup}
	}
	rec.Containerd.Backups = append(rec.Containerd.Backups, backup)
	in.containerdChanged = true
	return nil
}

// uninstallContainerd undoes installContainerd.
func (in *installer) uninstallContainerd(c *containerdRecord) error {
	switch c.Mode {
	case "drop-in":
		return in.removeIfOurs(c.DropIn, []byte(dropInHeader))
	case "created":
		if err := in.removeIfOurs(c.DropIn, []byte(dropInHeader)); err != nil {
			return err
		}
		data, err := os.ReadFile(in.path(c.Config))
		if err != nil {
			return nil
		}
		if string(data) != c.Created {
			in.report("kept", c.Config, "changed since install created it")
			return nil
		}
		return in.remove(c.Config)
	case "edit":
		data, err := os.ReadFile(in.path(c.Config))
		if err != nil {
			in.report("kept", c.Config, "cannot read it: "+err.Error())
			return nil
		}
		rest, block, err := splitBlock(data)
		if err != nil {
			return fmt.Errorf("%s: %w", c.Config, err)
		}
		original, _ := os.ReadFile(in.path(c.Original))
		if block == "" && !bytes.Equal(data, original) {
			in.report("kept", c.Config, "the c8s block is gone already")
			return nil
		}
		// appendBlock ends an unterminated last line: that newline is ours too.
		if bytes.Equal(rest, original) || (!bytes.HasSuffix(original, []byte("\n")) && bytes.Equal(rest, append(original, '\n'))) {
			if err := in.writeFile(c.Config, original, 0o644, "restored", "from "+c.Original); err != nil {
				return err
			}
			for _, b := range c.Backups {
				if err := in.remove(b); err != nil {
					return err
				}
			}
			return nil
		}
		if err := in.writeFile(c.Config, rest, 0o644, "edited", "removed the c8s block; kept later changes and the backups"); err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("install record: unknown containerd mode %q", c.Mode)
}
