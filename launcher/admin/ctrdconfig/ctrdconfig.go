// Package ctrdconfig reads containerd's configuration the way containerd
// loads it (the main file, then every file its imports name, globs
// included, relative paths against the importing file's directory) far
// enough to tell which CRI runtime handlers are registered and in which
// file. c8s-launcher check uses it to see whether the c8s handlers are
// registered; launcher/admin/install uses it to decide between a drop-in and an
// edit of the main file.
//
// Every path is a host path; Load reads it under a root directory, so that
// fixture trees and staging roots (DESTDIR) work like the real host.
//
// Config versions: version 3 (containerd 2.x) registers handlers under the
// plugin "io.containerd.cri.v1.runtime", version 2 (containerd 1.x, also
// read by 2.x) under "io.containerd.grpc.v1.cri", and version 1 or no
// version under "cri".
package ctrdconfig

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// DefaultPath is containerd's default main configuration file.
const DefaultPath = "/etc/containerd/config.toml"

// RuntimeType is the runtime_type of the c8s shim.
const RuntimeType = "io.containerd.c8s.v2"

// CRIPlugin returns the ID of the plugin that holds the CRI runtime
// handlers in a config file of the given version.
func CRIPlugin(version int) (string, error) {
	switch version {
	case 0, 1:
		return "cri", nil
	case 2:
		return "io.containerd.grpc.v1.cri", nil
	case 3:
		return "io.containerd.cri.v1.runtime", nil
	}
	return "", fmt.Errorf("containerd config version %d is not known (want 2 or 3)", version)
}

// Handler is one CRI runtime handler (plugins.<cri>.containerd.runtimes.<name>).
type Handler struct {
	Name        string `json:"name"`
	RuntimeType string `json:"runtime_type"`
	// ConfigPath is options.ConfigPath: for c8s handlers, the c8s config
	// the shim reads ("" when not set).
	ConfigPath string `json:"config_path,omitempty"`
	// File is the host path of the file that defines it (the last one, if
	// several do).
	File string `json:"file"`
}

// File is one loaded config file.
type File struct {
	// Path is the host path.
	Path    string
	Version int
	// Imports are the file's imports entries as written.
	Imports []string
	// Handlers are the handlers this file defines, by name.
	Handlers map[string]Handler
	// DiscardUnpackedLayers is the file's CRI discard_unpacked_layers
	// (nil when it does not set it).
	DiscardUnpackedLayers *bool
}

// Config is containerd's configuration as loaded from the main file.
type Config struct {
	// Path is the host path of the main file.
	Path string
	// Exists is false when the main file does not exist (containerd then
	// runs on its built-in defaults, which register no c8s handler).
	Exists bool
	// Version is the main file's version (0 when absent).
	Version int
	// Files are the main file followed by the imported files, in load order.
	Files []File
	// Handlers are the merged handlers: a later file overrides an earlier one.
	Handlers map[string]Handler
	// DiscardUnpackedLayers is CRI's discard_unpacked_layers as the last
	// file that sets it says (containerd's default: false), and
	// DiscardFile that file. When true, CRI deletes an image's layer
	// blobs once unpacked, and c8s's layer mode can convert only layers
	// its cache already holds.
	DiscardUnpackedLayers bool
	DiscardFile           string
}

// C8sHandlers returns the names of the handlers whose runtime_type is
// RuntimeType, sorted.
func (c *Config) C8sHandlers() []string {
	var names []string
	for n, h := range c.Handlers {
		if h.RuntimeType == RuntimeType {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

// Load reads the main config at the host path mainPath under root and
// every file it imports. A missing main file is not an error (Exists is
// false); a missing or malformed imported file is, as it is for containerd.
func Load(root, mainPath string) (*Config, error) {
	if mainPath == "" {
		mainPath = DefaultPath
	}
	cfg := &Config{Path: mainPath, Handlers: map[string]Handler{}}
	if _, err := os.Stat(RootJoin(root, mainPath)); errors.Is(err, os.ErrNotExist) {
		return cfg, nil
	}
	cfg.Exists = true
	loaded := map[string]bool{}
	pending := []string{mainPath}
	for len(pending) > 0 {
		p := pending[0]
		pending = pending[1:]
		if loaded[p] {
			continue
		}
		loaded[p] = true
		f, err := ReadFile(root, p)
		if err != nil {
			return nil, err
		}
		if len(cfg.Files) == 0 {
			cfg.Version = f.Version
		}
		cfg.Files = append(cfg.Files, *f)
		for n, h := range f.Handlers {
			cfg.Handlers[n] = h
		}
		if f.DiscardUnpackedLayers != nil {
			cfg.DiscardUnpackedLayers, cfg.DiscardFile = *f.DiscardUnpackedLayers, p
		}
		imports, err := ResolveImports(root, p, f.Imports)
		if err != nil {
			return nil, err
		}
		pending = append(pending, imports...)
	}
	return cfg, nil
}

// ReadFile parses one config file (host path p under root).
func ReadFile(root, p string) (*File, error) {
	data, err := os.ReadFile(RootJoin(root, p))
	if err != nil {
		return nil, fmt.Errorf("containerd config %s: %w", p, err)
	}
	return Parse(p, data)
}

// Parse parses the config file content data, read from host path p.
func Parse(p string, data []byte) (*File, error) {
	var doc struct {
		Version int            `toml:"version"`
		Imports []string       `toml:"imports"`
		Plugins map[string]any `toml:"plugins"`
	}
	if err := toml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("containerd config %s is not valid TOML: %w", p, err)
	}
	f := &File{Path: p, Version: doc.Version, Imports: doc.Imports, Handlers: map[string]Handler{}}
	plugin, err := CRIPlugin(doc.Version)
	if err != nil {
		return nil, fmt.Errorf("containerd config %s: %w", p, err)
	}
	runtimes := lookupTable(doc.Plugins, plugin, "containerd", "runtimes")
	for name, v := range runtimes {
		rt, _ := v.(map[string]any)
		typ, _ := rt["runtime_type"].(string)
		opts, _ := rt["options"].(map[string]any)
		cfgPath, _ := opts["ConfigPath"].(string)
		f.Handlers[name] = Handler{Name: name, RuntimeType: typ, ConfigPath: cfgPath, File: p}
	}
	// Version 3 has it in the CRI images plugin, version 2 in the CRI
	// plugin's containerd table.
	images := lookupTable(doc.Plugins, "io.containerd.cri.v1.images")
	if doc.Version < 3 {
		images = lookupTable(doc.Plugins, plugin, "containerd")
	}
	if v, ok := images["discard_unpacked_layers"].(bool); ok {
		f.DiscardUnpackedLayers = &v
	}
	return f, nil
}

func lookupTable(m map[string]any, keys ...string) map[string]any {
	for _, k := range keys {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

// ResolveImports turns the imports of the file at host path parent into
// host paths, expanding globs under root, as containerd does.
func ResolveImports(root, parent string, imports []string) ([]string, error) {
	var out []string
	for _, imp := range imports {
		p := ImportPattern(parent, imp)
		if !strings.Contains(p, "*") {
			out = append(out, p)
			continue
		}
		matches, err := filepath.Glob(RootJoin(root, p))
		if err != nil {
			return nil, fmt.Errorf("containerd config %s: import %q: %w", parent, imp, err)
		}
		for _, m := range matches {
			out = append(out, RootRel(root, m))
		}
	}
	return out, nil
}

// ImportPattern returns the cleaned, absolute form of one imports entry of
// the file at host path parent.
func ImportPattern(parent, imp string) string {
	p := filepath.Clean(imp)
	if !filepath.IsAbs(p) {
		p = filepath.Join(filepath.Dir(parent), p)
	}
	return p
}

// RootJoin returns where host path p is found under root.
func RootJoin(root, p string) string {
	if root == "" || root == "/" {
		return p
	}
	return filepath.Join(root, p)
}

// RootRel is the inverse of RootJoin: the host path of a file found at
// full under root.
func RootRel(root, full string) string {
	if root == "" || root == "/" {
		return full
	}
	rel, err := filepath.Rel(root, full)
	if err != nil {
		return full
	}
	return "/" + rel
}
