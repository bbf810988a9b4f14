package discovery

import (
	"bufio"
	"bytes"
	"io/fs"
	"strconv"
	"strings"
)

// Misc cgroup resource names (Documentation/admin-guide/cgroup-v2.rst).
const (
	MiscSEV    = "sev"     // plain SEV ASIDs
	MiscSEVES  = "sev_es"  // SEV-ES ASIDs, which SEV-SNP guests use too
	MiscTDX    = "tdx"     // TDX private keys (HKIDs)
	MiscSGXEPC = "sgx_epc" // SGX EPC, in bytes
)

// miscDirs are where the root misc cgroup's files live: cgroup v2's
// unified hierarchy, then cgroup v1's misc controller.
var miscDirs = []string{"sys/fs/cgroup", "sys/fs/cgroup/misc"}

// miscTable is one of misc.capacity / misc.current: resource name to value.
type miscTable map[string]int64

// readMisc reads name ("misc.capacity" or "misc.current") from the first
// misc cgroup directory that has it, and says which file it read.
func readMisc(fsys fs.FS, name string) (miscTable, string) {
	for _, dir := range miscDirs {
		path := dir + "/" + name
		data, err := fs.ReadFile(fsys, path)
		if err != nil {
			continue
		}
		return parseMisc(data), "/" + path
	}
	return nil, ""
}

// parseMisc parses "name value" lines; malformed lines are skipped (the
// kernel writes one well-formed line per resource).
func parseMisc(data []byte) miscTable {
	t := miscTable{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || v < 0 {
			continue
		}
		t[f[0]] = v
	}
	return t
}

func (t miscTable) get(name string) (int64, bool) {
	v, ok := t[name]
	return v, ok
}
