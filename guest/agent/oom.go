package agent

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// oomKilled reports whether the kernel's OOM killer has killed a process
// of the cgroup (guest path, e.g. /c8s/<id>): cgroup v2 counts the kills
// in memory.events oom_kill, the subtree's included. On cgroup v1, or when
// the cgroup is gone, it reports false.
func oomKilled(cgroup string) bool {
	if cgroup == "" {
		return false
	}
	data, err := os.ReadFile(filepath.Join(cgroupRoot, filepath.Clean("/"+cgroup), "memory.events"))
	if err != nil {
		return false
	}
	return memoryEvent(data, "oom_kill") > 0
}

// memoryEvent returns the counter key of a memory.events file (0 when
// absent or malformed).
func memoryEvent(data []byte, key string) uint64 {
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0
		}
		return n
	}
	return 0
}
